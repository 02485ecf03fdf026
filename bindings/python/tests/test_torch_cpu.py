# SPDX-License-Identifier: Apache-2.0
"""PyTorch CPU tensors: read directly (no DLPack), errors in torch's words,
requires_grad, and torch.ops.flashdecode.decode under torch.compile and fake
tensors. Skipped without PyTorch; test_gpu.py has the CUDA side."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any, Tuple

import numpy as np
import pytest

import flashdecode
from reference import alibi_slopes, attention, variant_attention

torch = pytest.importorskip("torch")

TOLERANCE = {"float32": 2e-5, "float16": 4e-3, "bfloat16": 3e-2}


def problem(seed: int = 0, dtype: Any = None, layout: str = "HND") -> Tuple[Any, ...]:
    """q, k, v as CPU tensors (8 query heads over 2 KV heads) and the float64 reference out and lse in NHD."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((2, 1, 8, 64)).astype(np.float32)
    k = rng.standard_normal((2, 50, 2, 64)).astype(np.float32)
    v = rng.standard_normal((2, 50, 2, 64)).astype(np.float32)
    dtype = dtype or torch.float32
    tensors = [torch.from_numpy(x).to(dtype) for x in (q, k, v)]
    reference = [t.double().numpy() for t in tensors]
    expected, expected_lse = attention(reference[0][:, 0], reference[1], reference[2])
    if layout == "HND":
        tensors = [t.transpose(1, 2).contiguous() for t in tensors]
    return (*tensors, expected, expected_lse)


def nhd(x: Any, layout: str) -> np.ndarray:
    array = x.detach().double().numpy()
    return array.transpose(0, 2, 1, *range(3, array.ndim)) if layout == "HND" else array


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_tensors_decode(cpu, dtype, layout) -> None:
    q, k, v, expected, expected_lse = problem(1, getattr(torch, dtype), layout)
    for _ in range(2):  # the full path, then the fast one
        out, lse = cpu.decode(q, k, v, layout=layout, return_lse=True)
        assert isinstance(out, torch.Tensor) and out.dtype == q.dtype and out.shape == q.shape
        assert lse.dtype == torch.float32 and lse.shape == q.shape[:-1]
        tolerance = TOLERANCE[dtype]
        np.testing.assert_allclose(nhd(out, layout)[:, 0], expected, atol=tolerance, rtol=tolerance)
        np.testing.assert_allclose(nhd(lse, layout)[:, 0], expected_lse, atol=1e-4, rtol=1e-4)
    out = flashdecode.flash_decode(*problem(1, getattr(torch, dtype))[:3])
    np.testing.assert_allclose(nhd(out, "HND")[:, 0], expected, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


VARIANTS = {"causal": False, "window_left": 20, "logit_softcap": 4.0}


def variant_problem(dtype: Any, q_len: int = 4) -> Tuple[Any, ...]:
    """q [2, q_len, 8, 64], k and v [2, 50, 2, 64] (NHD) as CPU tensors, slopes and sinks [8] as
    float32 tensors, and the float64 reference of VARIANTS with them (seq_lens [50, 3])."""
    rng = np.random.default_rng(9)
    q, k, v = (
        torch.from_numpy(rng.standard_normal(shape).astype(np.float32)).to(dtype)
        for shape in ((2, q_len, 8, 64), (2, 50, 2, 64), (2, 50, 2, 64))
    )
    slopes = torch.from_numpy(alibi_slopes(8))
    sinks = torch.linspace(-1.0, 1.0, 8)
    lens = torch.tensor([50, 3], dtype=torch.int32)
    expected = variant_attention(
        *(x.double().numpy() for x in (q, k, v)),
        seq_lens=[50, 3],
        alibi_slopes=slopes.numpy(),
        sinks=sinks.numpy(),
        **VARIANTS,
    )
    return q, k, v, slopes, sinks, lens, expected


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_tensors_with_attention_variants(cpu, dtype) -> None:
    """Several query tokens and every variant, slopes and sinks as tensors, through Handle.decode
    (the full path, then the fast one), flash_decode (HND) and the custom op."""
    q, k, v, slopes, sinks, lens, (expected, expected_lse) = variant_problem(getattr(torch, dtype))
    tolerance = TOLERANCE[dtype]
    for _ in range(2):
        out, lse = cpu.decode(
            q, k, v, seq_lens=lens, alibi_slopes=slopes, sinks=sinks, return_lse=True, **VARIANTS
        )  # fmt: skip
        assert out.dtype == q.dtype and out.shape == q.shape and lse.shape == q.shape[:-1]
        np.testing.assert_allclose(out.double().numpy(), expected, atol=tolerance, rtol=tolerance)
        np.testing.assert_allclose(lse.numpy(), expected_lse, atol=1e-4, rtol=1e-4)
    assert len(cpu._plans) == 1
    hnd = [x.transpose(1, 2) for x in (q, k, v)]
    out = flashdecode.flash_decode(*hnd, alibi_slopes=slopes, sinks=sinks, **VARIANTS)
    full, _ = variant_attention(
        *(x.double().numpy() for x in (q, k, v)), alibi_slopes=slopes.numpy(), sinks=sinks.numpy(), **VARIANTS
    )
    np.testing.assert_allclose(nhd(out, "HND"), full, atol=tolerance, rtol=tolerance)
    if hasattr(torch.library, "custom_op"):
        op_out, op_lse = flashdecode.torch_op()(
            q, k, v, lens, None, None, None, "NHD", None, False, 20, 4.0, slopes, sinks
        )  # fmt: skip
        np.testing.assert_allclose(op_out.double().numpy(), expected, atol=tolerance, rtol=tolerance)
        np.testing.assert_allclose(op_lse.numpy(), expected_lse, atol=1e-4, rtol=1e-4)
    with pytest.raises(flashdecode.InvalidDTypeError, match=r"sinks: dtype torch\.float64 is not supported"):
        cpu.decode(q, k, v, sinks=sinks.double())


def test_dtype_errors_name_torch_dtypes(cpu) -> None:
    q, k, v, _, _ = problem()
    with pytest.raises(
        flashdecode.InvalidDTypeError, match=r"q: dtype torch\.float64 is not supported; use torch\.float32"
    ):
        cpu.decode(q.double(), k, v, layout="HND")
    with pytest.raises(
        flashdecode.InvalidDTypeError, match=r"seq_lens: dtype torch\.int64 is not supported; it must be torch\.int32"
    ):
        cpu.decode(q, k, v, layout="HND", seq_lens=torch.tensor([1, 2]))
    with pytest.raises(flashdecode.InvalidDTypeError, match="q: 16-bit integer storage needs dtype="):
        cpu.decode(q.half().view(torch.int16), k.half().view(torch.int16), v.half().view(torch.int16), layout="HND")
    bits = [x.to(torch.bfloat16).view(torch.int16) for x in (q, k, v)]
    out = cpu.decode(*bits, layout="HND", dtype="bfloat16")
    assert out.dtype == torch.int16
    np.testing.assert_array_equal(
        out.view(torch.bfloat16).float().numpy(),
        cpu.decode(*(b.view(torch.bfloat16) for b in bits), layout="HND").float().numpy(),
    )


def test_requires_grad(cpu) -> None:
    """Inputs are read as .detach() would read them; an output that requires grad is refused."""
    q, k, v, expected, _ = problem(2)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    for _ in range(2):
        out = cpu.decode(*leaves, layout="HND")
        assert not out.requires_grad
        np.testing.assert_allclose(nhd(out, "HND")[:, 0], expected, atol=2e-5)
        out = flashdecode.flash_decode(*leaves)
        assert not out.requires_grad
    target = torch.zeros_like(q, requires_grad=True)
    with pytest.raises(flashdecode.InvalidArgumentError, match="out: requires grad; decode writes it in place"):
        cpu.decode(q, k, v, out=target, layout="HND")
    plain = torch.zeros_like(q)
    cpu.decode(q, k, v, out=plain, layout="HND")  # now the signature is known without grad...
    with pytest.raises(flashdecode.InvalidArgumentError, match="out: requires grad"):
        cpu.decode(q, k, v, out=target, layout="HND")  # ...and requires_grad is part of it
    assert torch.all(target == 0)


def test_lazy_views_and_other_devices_are_refused(cpu) -> None:
    q, k, v, _, _ = problem()
    negated = torch.complex(k, k).conj().imag  # a real view with the negative bit: -k, lazily
    assert negated.is_neg()
    with pytest.raises(flashdecode.InvalidArgumentError, match="k: is a lazily negated or conjugated"):
        cpu.decode(q, negated, v, layout="HND")
    cpu.decode(q, k, v, layout="HND")  # known signature without the bit: the bit is part of it
    with pytest.raises(flashdecode.InvalidArgumentError, match="k: is a lazily negated or conjugated"):
        cpu.decode(q, negated, v, layout="HND")
    with pytest.raises(flashdecode.InvalidArgumentError, match="q: is a PyTorch tensor on device 'meta'"):
        cpu.decode(q.to("meta"), k, v, layout="HND")


def test_alternating_tensors_of_one_shape(cpu) -> None:
    problems = [problem(seed) for seed in range(3)]
    for _ in range(3):
        for q, k, v, expected, _ in problems:
            np.testing.assert_allclose(nhd(cpu.decode(q, k, v, layout="HND"), "HND")[:, 0], expected, atol=2e-5)
            np.testing.assert_allclose(nhd(flashdecode.flash_decode(q, k, v), "HND")[:, 0], expected, atol=2e-5)


# ---- the custom op --------------------------------------------------------------

needs_custom_op = pytest.mark.skipif(
    not hasattr(torch.library, "custom_op"), reason="torch.library.custom_op needs PyTorch 2.4"
)


@needs_custom_op
def test_op_matches_the_reference() -> None:
    op = flashdecode.torch_op()
    assert op is torch.ops.flashdecode.decode
    q, k, v, expected, expected_lse = problem(3, layout="NHD")
    lens = torch.tensor([50, 17], dtype=torch.int32)
    out, lse = op(q, k, v)
    np.testing.assert_allclose(out.numpy()[:, 0], expected, atol=2e-5)
    np.testing.assert_allclose(lse.numpy()[:, 0], expected_lse, atol=1e-4)
    out, _ = op(q, k, v, lens, None, 0.25, 2, "NHD")
    reference, _ = attention(*(x.double().numpy() for x in (q[:, 0], k, v)), scale=0.25, seq_lens=[50, 17])
    np.testing.assert_allclose(out.numpy()[:, 0], reference, atol=2e-5)


@needs_custom_op
def test_opcheck() -> None:
    """PyTorch's own checks of the schema, the fake implementation and autograd registration."""
    if not hasattr(torch.library, "opcheck"):
        pytest.skip("torch.library.opcheck needs PyTorch 2.4")
    q, k, v, _, _ = problem(4)
    torch.library.opcheck(flashdecode.torch_op(), (q, k, v, None, None, None, None, "HND"))
    lens = torch.tensor([3, 50], dtype=torch.int32)
    torch.library.opcheck(flashdecode.torch_op(), (q, k, v, lens, None, 0.5, 3, "HND"))
    torch.library.opcheck(flashdecode.torch_op(), (q, k, v, lens, None, 0.5, None, "HND", 16))


@needs_custom_op
def test_op_takes_split_tokens() -> None:
    """split_tokens (since 0.3), after layout: a sequence alone gives bitwise its result in the batch."""
    op = flashdecode.torch_op()
    q, k, v, expected, expected_lse = problem(8, layout="NHD")
    lens = torch.tensor([50, 17], dtype=torch.int32)
    out, lse = op(q, k, v, lens, None, None, None, "NHD", 16)
    reference, _ = attention(*(x.double().numpy() for x in (q[:, 0], k, v)), seq_lens=[50, 17])
    np.testing.assert_allclose(out.numpy()[:, 0], reference, atol=2e-5)
    alone, alone_lse = op(q[1:], k[1:, :17], v[1:, :17], split_tokens=16)
    assert torch.equal(alone[0], out[1]) and torch.equal(alone_lse[0], lse[1])
    with pytest.raises(flashdecode.InvalidSplitsError, match="are both set"):
        op(q, k, v, lens, None, None, 2, "NHD", 16)


@needs_custom_op
def test_opcheck_with_attention_variants() -> None:
    if not hasattr(torch.library, "opcheck"):
        pytest.skip("torch.library.opcheck needs PyTorch 2.4")
    q, k, v, slopes, sinks, lens, _ = variant_problem(torch.float32)
    op = flashdecode.torch_op()
    torch.library.opcheck(op, (q, k, v, lens, None, None, None, "NHD", None, False, 20, 4.0, slopes, sinks))
    torch.library.opcheck(op, (q, k, v, None, None, 0.5, 2, "NHD", None, True, None, None, None, sinks))


@needs_custom_op
def test_torch_compile_with_attention_variants() -> None:
    """The variants through torch.compile (fullgraph): the op takes them, slopes and sinks as tensor inputs."""
    torch._dynamo.reset()
    q, k, v, slopes, sinks, lens, (expected, expected_lse) = variant_problem(torch.float32)
    handle = flashdecode.Handle("cpu")

    def step(q: Any, k: Any, v: Any, lens: Any, slopes: Any, sinks: Any) -> Any:
        return handle.decode(
            q * 1.0, k, v, seq_lens=lens, alibi_slopes=slopes, sinks=sinks, return_lse=True, **VARIANTS
        )  # fmt: skip

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    out, lse = compiled(q, k, v, lens, slopes, sinks)
    np.testing.assert_allclose(out.double().numpy(), expected, atol=2e-5, rtol=2e-5)
    np.testing.assert_allclose(lse.numpy(), expected_lse, atol=1e-4, rtol=1e-4)
    out, _ = compiled(q, k, v, lens, slopes * 2, sinks)  # new slopes, the same graph
    doubled, _ = variant_attention(
        *(x.double().numpy() for x in (q, k, v)),
        seq_lens=[50, 3],
        alibi_slopes=(slopes * 2).numpy(),
        sinks=sinks.numpy(),
        **VARIANTS,
    )
    np.testing.assert_allclose(out.double().numpy(), doubled, atol=2e-5, rtol=2e-5)

    # Slopes and sinks as lists (host memory, as outside torch.compile) become tensors for the op.
    slope_list, sink_list = slopes.tolist(), sinks.tolist()
    listed = torch.compile(
        lambda q, k, v: handle.decode(q * 1.0, k, v, alibi_slopes=slope_list, sinks=sink_list),
        backend="aot_eager",
        fullgraph=True,
    )
    expected_listed, _ = variant_attention(
        *(x.double().numpy() for x in (q, k, v)), alibi_slopes=slopes.numpy(), sinks=sinks.numpy()
    )
    np.testing.assert_allclose(listed(q, k, v).double().numpy(), expected_listed, atol=2e-5, rtol=2e-5)
    handle.close()


def ragged_problem() -> Tuple[Any, ...]:
    """q [3, 4, 8, 64] (NHD, padding rows NaN), k and v [3, 50, 2, 64] as CPU tensors, seq_lens
    [50, 20, 7] and q_lens [4, 1, 0] as int32 tensors, and the float64 reference."""
    rng = np.random.default_rng(12)
    q = rng.standard_normal((3, 4, 8, 64)).astype(np.float32)
    k, v = (rng.standard_normal((3, 50, 2, 64)).astype(np.float32) for _ in range(2))
    counts = np.array([4, 1, 0], np.int32)
    for b, count in enumerate(counts):
        q[b, count:] = np.nan  # padding: never read
    expected = variant_attention(q, k, v, seq_lens=[50, 20, 7], q_lens=counts)
    lens = torch.tensor([50, 20, 7], dtype=torch.int32)
    return (*(torch.from_numpy(x) for x in (q, k, v)), lens, torch.from_numpy(counts), expected)


def test_q_lens_tensors(cpu) -> None:
    """q_lens (since 0.3) as an int32 tensor through Handle.decode, the full path then the fast one
    with new counts; an int64 tensor is refused in torch's words."""
    q, k, v, lens, q_lens, (expected, expected_lse) = ragged_problem()
    for _ in range(2):
        out, lse = cpu.decode(q, k, v, seq_lens=lens, q_lens=q_lens, return_lse=True)
        np.testing.assert_allclose(out.numpy(), expected, atol=2e-5, rtol=2e-5)
        np.testing.assert_array_equal(np.isneginf(lse.numpy()), np.isneginf(expected_lse))
    out, _ = cpu.decode(q, k, v, seq_lens=lens, q_lens=torch.tensor([1, 1, 0], dtype=torch.int32), return_lse=True)
    fewer, _ = variant_attention(q.numpy(), k.numpy(), v.numpy(), seq_lens=[50, 20, 7], q_lens=[1, 1, 0])
    np.testing.assert_allclose(out.numpy(), fewer, atol=2e-5, rtol=2e-5)
    assert len(cpu._plans) == 1
    with pytest.raises(
        flashdecode.InvalidDTypeError, match=r"q_lens: dtype torch\.int64 is not supported; it must be torch\.int32"
    ):
        cpu.decode(q, k, v, q_lens=q_lens.long())


@needs_custom_op
def test_op_and_compile_take_q_lens() -> None:
    """q_lens is the op's last argument, an optional tensor: the op, opcheck, and torch.compile
    (fullgraph) with new counts through the same graph."""
    q, k, v, lens, q_lens, (expected, expected_lse) = ragged_problem()
    op = flashdecode.torch_op()
    out, lse = op(q, k, v, lens, None, None, None, "NHD", None, True, None, None, None, None, None, None, q_lens)
    np.testing.assert_allclose(out.numpy(), expected, atol=2e-5, rtol=2e-5)
    np.testing.assert_array_equal(np.isneginf(lse.numpy()), np.isneginf(expected_lse))
    if hasattr(torch.library, "opcheck"):
        finite = torch.nan_to_num(q)  # opcheck compares inputs before and after, and NaN is not NaN
        torch.library.opcheck(op, (finite, k, v, lens), {"q_lens": q_lens})
    torch._dynamo.reset()
    handle = flashdecode.Handle("cpu")

    def step(q: Any, k: Any, v: Any, lens: Any, q_lens: Any) -> Any:
        return handle.decode(q, k, v, seq_lens=lens, q_lens=q_lens, return_lse=True)

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    out, lse = compiled(q, k, v, lens, q_lens)
    np.testing.assert_allclose(out.numpy(), expected, atol=2e-5, rtol=2e-5)
    out, _ = compiled(q, k, v, lens, torch.tensor([2, 0, 0], dtype=torch.int32))  # the same graph
    fewer, _ = variant_attention(q.numpy(), k.numpy(), v.numpy(), seq_lens=[50, 20, 7], q_lens=[2, 0, 0])
    np.testing.assert_allclose(out.numpy(), fewer, atol=2e-5, rtol=2e-5)
    handle.close()


@needs_custom_op
def test_fake_tensor_shapes() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(3, 16, 1, 128, dtype=torch.bfloat16)
        k = torch.empty(3, 4, 4096, 128, dtype=torch.bfloat16)
        out, lse = torch.ops.flashdecode.decode(q, k, k, layout="HND")
        assert out.shape == q.shape and out.dtype == torch.bfloat16
        assert lse.shape == (3, 16, 1) and lse.dtype == torch.float32
        q3 = torch.empty(3, 16, 128, dtype=torch.float16)
        out, lse = torch.ops.flashdecode.decode(q3, k.half(), k.half())
        assert out.shape == (3, 16, 128) and lse.shape == (3, 16)


@needs_custom_op
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_torch_compile(backend) -> None:
    """flash_decode and Handle.decode inside a compiled function (fullgraph: no graph break)."""
    torch._dynamo.reset()
    handle = flashdecode.Handle("cpu")

    def step(q: Any, k: Any, v: Any) -> Any:
        scaled = q * 2
        a = flashdecode.flash_decode(scaled, k, v)
        b, lse = handle.decode(scaled, k, v, layout="HND", return_lse=True, softmax_scale=0.1, split_tokens=32)
        return a + 1, b, lse

    compiled = torch.compile(step, backend=backend, fullgraph=True)
    for seed in (5, 6):  # a second call with other data reuses the compiled graph
        q, k, v, _, _ = problem(seed)
        a, b, lse = compiled(q, k, v)
        expected_a, expected_b, expected_lse = step(q, k, v)
        torch.testing.assert_close(a, expected_a, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(b, expected_b, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lse, expected_lse, atol=1e-5, rtol=1e-5)
        reference, _ = attention(
            *(x.double().numpy() for x in ((q * 2).transpose(1, 2)[:, 0], k.transpose(1, 2), v.transpose(1, 2)))
        )
        np.testing.assert_allclose(nhd(a - 1, "HND")[:, 0], reference, atol=2e-5)
    handle.close()


@needs_custom_op
def test_torch_compile_with_outputs_given() -> None:
    torch._dynamo.reset()
    q, k, v, expected, _ = problem(7)

    def step(q: Any, k: Any, v: Any, out: Any) -> Any:
        return flashdecode.flash_decode(q, k, v, out=out)

    out = torch.zeros_like(q)
    result = torch.compile(step, backend="aot_eager", fullgraph=True)(q, k, v, out)
    np.testing.assert_allclose(nhd(out, "HND")[:, 0], expected, atol=2e-5)
    np.testing.assert_allclose(nhd(result, "HND")[:, 0], expected, atol=2e-5)


def test_importing_flashdecode_does_not_import_torch() -> None:
    code = "import sys, flashdecode; assert 'torch' not in sys.modules, 'torch imported'; print('ok')"
    env = dict(os.environ)
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_op_registered_when_torch_comes_after_flashdecode() -> None:
    code = (
        "import flashdecode, torch\n"
        "q = torch.randn(1, 2, 1, 16); k = torch.randn(1, 1, 9, 16)\n"
        "flashdecode.flash_decode(q, k, k)\n"
        "print(hasattr(torch.ops.flashdecode, 'decode') or not hasattr(torch.library, 'custom_op'))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=dict(os.environ), capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0 and result.stdout.strip() == "True", result.stderr


@needs_custom_op
def test_first_call_compiled_with_torch_imported_after_flashdecode() -> None:
    """isort's order (flashdecode before torch) and a first call inside torch.compile(fullgraph=True):
    the op is registered at trace time rather than traced."""
    code = (
        "import flashdecode, torch\n"
        "step = torch.compile(lambda q, k: flashdecode.flash_decode(q * 1.0, k, k), backend='eager', fullgraph=True)\n"
        "q = torch.randn(1, 4, 1, 32); k = torch.randn(1, 2, 20, 32)\n"
        "torch.testing.assert_close(step(q, k), flashdecode.flash_decode(q, k, k))\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=dict(os.environ), capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]


def test_sparse_tensors_are_refused_by_name(cpu) -> None:
    """A sparse (or other non-strided) tensor has no strides to describe: refused naming the argument."""
    q, k, v, _, _ = problem(3)
    with pytest.raises(flashdecode.InvalidArgumentError, match="k: is a PyTorch tensor of layout torch.sparse_coo"):
        cpu.decode(q, k.to_sparse(), v, layout="HND")
    with pytest.raises(flashdecode.InvalidArgumentError, match="q: is a PyTorch tensor of layout torch.sparse_coo"):
        flashdecode.flash_decode(q.to_sparse(), k, v)


def test_flash_decode_splitk_copies_what_is_not_row_major(cpu) -> None:
    """The reference kernel's entry point takes any layout, as its .contiguous() did."""
    q, k, v, expected, _ = problem(4)
    k_columns = k.transpose(-1, -2).contiguous().transpose(-1, -2)  # head_dim not contiguous
    assert k_columns.stride(-1) != 1
    out = flashdecode.flash_decode_splitk(q, k_columns, v, None, None, 64)
    assert isinstance(out, torch.Tensor) and out.shape == q.shape and out.dtype == q.dtype
    np.testing.assert_allclose(nhd(out, "HND")[:, 0], expected, atol=TOLERANCE["float32"])
