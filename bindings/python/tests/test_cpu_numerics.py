# SPDX-License-Identifier: Apache-2.0
"""CPU backend numerics through the binding, against the float64 reference."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest

import flashdecode
from reference import as_float64, attention, from_bf16_bits, random_inputs, to_bf16_bits, to_pages

# Inputs are compared as the library reads them, so what remains is float32
# accumulation plus the rounding of the output to its storage type.
TOLERANCE = {"float32": 2e-5, "float16": 2e-3, "bfloat16": 1.6e-2}


def decoded_as_float64(out: np.ndarray, dtype: str) -> np.ndarray:
    return as_float64(out, dtype)


def test_seed_self_check() -> None:
    """The Triton split-K reference kernel's own check: batch 2, heads 4, head_dim 64,
    kv_len 256, 4 splits, fp16, 2e-2."""
    rng = np.random.default_rng(0)
    batch, heads, dim, kv_len = 2, 4, 64, 256
    q = rng.standard_normal((batch, heads, 1, dim)).astype(np.float16)
    k = rng.standard_normal((batch, heads, kv_len, dim)).astype(np.float16)
    v = rng.standard_normal((batch, heads, kv_len, dim)).astype(np.float16)
    sm_scale = 1.0 / math.sqrt(dim)

    out = flashdecode.flash_decode(q, k, v, sm_scale=sm_scale, num_splits=4)

    assert isinstance(out, np.ndarray) and out.shape == q.shape and out.dtype == q.dtype
    expected, _ = attention(q[:, :, 0], k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), sm_scale)
    np.testing.assert_allclose(out[:, :, 0].astype(np.float32), expected, atol=2e-2, rtol=2e-2)
    np.testing.assert_allclose(out[:, :, 0].astype(np.float64), expected, atol=TOLERANCE["float16"])


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (8, 2), (6, 1)])
def test_decode_matches_reference(cpu, rng, dtype, layout, heads, kv_heads) -> None:
    batch, kv_len, dim = 3, 200, 64
    q = random_inputs(rng, (batch, 1, heads, dim), dtype)
    k = random_inputs(rng, (batch, kv_len, kv_heads, dim), dtype)
    v = random_inputs(rng, (batch, kv_len, kv_heads, dim), dtype)
    expected, expected_lse = attention(as_float64(q, dtype)[:, 0], as_float64(k, dtype), as_float64(v, dtype))
    if layout == "HND":
        q, k, v = (x.transpose(0, 2, 1, 3) for x in (q, k, v))  # strided views, no copies
    explicit = "bfloat16" if dtype == "bfloat16" else None

    out, lse = cpu.decode(q, k, v, layout=layout, dtype=explicit, return_lse=True)

    assert out.shape == q.shape and out.dtype == q.dtype
    got = as_float64(out, dtype)
    got = got[:, :, 0] if layout == "HND" else got[:, 0]
    np.testing.assert_allclose(got, expected, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])
    np.testing.assert_allclose(lse.reshape(batch, heads), expected_lse, rtol=1e-5)


def test_bfloat16_numpy_dtype_from_ml_dtypes(cpu, rng) -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    q, k, v = (
        rng.standard_normal(shape).astype(ml_dtypes.bfloat16)
        for shape in ((2, 1, 4, 32), (2, 50, 2, 32), (2, 50, 2, 32))
    )
    out = cpu.decode(q, k, v)
    assert out.dtype == q.dtype
    expected, _ = attention(q.astype(np.float64)[:, 0], k.astype(np.float64), v.astype(np.float64))
    np.testing.assert_allclose(out.astype(np.float64)[:, 0], expected, atol=TOLERANCE["bfloat16"])


def test_three_dimensional_query(cpu, rng) -> None:
    q = rng.standard_normal((2, 8, 32)).astype(np.float32)
    k = rng.standard_normal((2, 40, 2, 32)).astype(np.float32)
    v = rng.standard_normal((2, 40, 2, 32)).astype(np.float32)
    out, lse = cpu.decode(q, k, v, return_lse=True)
    assert out.shape == (2, 8, 32) and lse.shape == (2, 8)
    expected, expected_lse = attention(q, k, v)
    np.testing.assert_allclose(out, expected, atol=TOLERANCE["float32"])
    np.testing.assert_allclose(lse, expected_lse, rtol=1e-5)


def test_empty_batch_is_a_no_op(cpu) -> None:
    # NumPy 2 gives arrays without elements strides of 0; the library would refuse those.
    q = np.zeros((0, 1, 8, 64), np.float32)
    k = np.zeros((0, 100, 2, 64), np.float32)
    out, lse = cpu.decode(q, k, k, return_lse=True, seq_lens=np.zeros(0, np.int32))
    assert out.shape == (0, 1, 8, 64) and lse.shape == (0, 1, 8)
    k_bhnd = k.transpose(0, 2, 1, 3)
    assert flashdecode.flash_decode(q.transpose(0, 2, 1, 3), k_bhnd, k_bhnd).shape == (0, 8, 1, 64)


def test_strided_views_of_larger_buffers(cpu, rng) -> None:
    """A slice of a bigger cache (capacity and heads) and a non-contiguous q are used in place."""
    cache_k = rng.standard_normal((2, 300, 6, 64)).astype(np.float32)
    cache_v = rng.standard_normal((2, 300, 6, 64)).astype(np.float32)
    k, v = cache_k[:, :120, 2:4], cache_v[:, :120, 2:4]
    q = rng.standard_normal((2, 1, 16, 96)).astype(np.float32)[:, :, ::2, 16:80]
    assert not q.flags.c_contiguous and not k.flags.c_contiguous
    out = cpu.decode(q, k, v)
    expected, _ = attention(q[:, 0], k, v)
    np.testing.assert_allclose(out[:, 0], expected, atol=TOLERANCE["float32"])


def test_ragged_lengths_and_lse(cpu, rng) -> None:
    k = rng.standard_normal((4, 64, 2, 16)).astype(np.float32)
    v = rng.standard_normal((4, 64, 2, 16)).astype(np.float32)
    lens = np.array([64, 1, 0, 33], dtype=np.int32)
    for b, length in enumerate(lens):  # padding is never read, whatever it holds
        k[b, length:] = np.nan
        v[b, length:] = np.nan
    q = rng.standard_normal((4, 1, 4, 16)).astype(np.float32)
    lse = np.full((4, 1, 4), 123.0, dtype=np.float32)

    out = cpu.decode(q, k, v, seq_lens=lens, lse=lse)

    expected, expected_lse = attention(q[:, 0], k, v, seq_lens=lens)
    np.testing.assert_allclose(out[:, 0], expected, atol=TOLERANCE["float32"])
    np.testing.assert_array_equal(out[2], 0.0)
    assert np.all(np.isneginf(lse[2]))
    np.testing.assert_allclose(lse[:, 0], expected_lse, rtol=1e-5)
    # A list works too on the CPU backend.
    np.testing.assert_array_equal(cpu.decode(q, k, v, seq_lens=lens.tolist()), out)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_paged_cache(cpu, rng, layout) -> None:
    batch, kv_heads, heads, dim, page_size, max_pages = 3, 2, 4, 32, 16, 5
    dense_k = rng.standard_normal((batch, max_pages * page_size, kv_heads, dim)).astype(np.float32)
    dense_v = rng.standard_normal((batch, max_pages * page_size, kv_heads, dim)).astype(np.float32)
    lens = np.array([80, 17, 40], dtype=np.int32)
    pool_k, pool_v, pages = to_pages(rng, dense_k, dense_v, page_size, 3)
    q = rng.standard_normal((batch, 1, heads, dim)).astype(np.float32)
    if layout == "HND":  # [num_pages, kv_heads, page_size, head_dim] pages, q [batch, heads, 1, head_dim]
        pool_k, pool_v = (np.ascontiguousarray(x.transpose(0, 2, 1, 3)) for x in (pool_k, pool_v))
        q = np.ascontiguousarray(q.transpose(0, 2, 1, 3))

    out = cpu.decode(q, pool_k, pool_v, block_table=pages, seq_lens=lens, layout=layout)

    expected, _ = attention(dense_q(q, layout), dense_k, dense_v, seq_lens=lens)
    np.testing.assert_allclose(dense_q(out, layout), expected, atol=TOLERANCE["float32"])


def dense_q(q: np.ndarray, layout: str) -> np.ndarray:
    return q[:, :, 0] if layout == "HND" else q[:, 0]


def test_scale_splits_and_determinism(cpu, rng) -> None:
    q = rng.standard_normal((2, 1, 4, 64)).astype(np.float32)
    k = rng.standard_normal((2, 500, 4, 64)).astype(np.float32)
    v = rng.standard_normal((2, 500, 4, 64)).astype(np.float32)
    expected, _ = attention(q[:, 0], k, v, scale=0.3)
    results = {}
    for splits in (None, 1, 3, 17, 500):
        results[splits] = cpu.decode(q, k, v, softmax_scale=0.3, num_splits=splits)
        np.testing.assert_allclose(results[splits][:, 0], expected, atol=TOLERANCE["float32"])
        # The same inputs and plan give bitwise-identical results.
        np.testing.assert_array_equal(cpu.decode(q, k, v, softmax_scale=0.3, num_splits=splits), results[splits])


def test_float32_output_from_half_inputs(cpu, rng) -> None:
    q, k, v = (random_inputs(rng, shape, "float16") for shape in ((2, 1, 4, 64), (2, 90, 4, 64), (2, 90, 4, 64)))
    out = np.empty(q.shape, np.float32)
    returned = cpu.decode(q, k, v, out=out)
    assert returned is out
    expected, _ = attention(q[:, 0], k, v)
    np.testing.assert_allclose(out[:, 0], expected, atol=TOLERANCE["float32"] * 10)


def test_bfloat16_bits_output(cpu, rng) -> None:
    q, k, v = (random_inputs(rng, shape, "bfloat16") for shape in ((1, 1, 2, 16), (1, 30, 1, 16), (1, 30, 1, 16)))
    out = np.zeros(q.shape, np.uint16)
    cpu.decode(q, k, v, out=out, dtype=flashdecode.DType.BF16)
    expected, _ = attention(from_bf16_bits(q)[:, 0], from_bf16_bits(k), from_bf16_bits(v))
    np.testing.assert_allclose(from_bf16_bits(out)[:, 0], expected, atol=TOLERANCE["bfloat16"])
    assert to_bf16_bits(from_bf16_bits(out)).tobytes() == out.tobytes()


def test_workspace_size_reserve_and_own_buffer(cpu, rng) -> None:
    q = rng.standard_normal((2, 1, 8, 64)).astype(np.float32)
    k = rng.standard_normal((2, 256, 2, 64)).astype(np.float32)
    v = rng.standard_normal((2, 256, 2, 64)).astype(np.float32)
    nbytes = cpu.workspace_size(q, k, v, num_splits=4)
    assert nbytes >= 2 * 8 * 4 * 64 * 4  # rows x splits x head_dim floats, at least
    assert cpu.workspace_size(q, k, v, num_splits=8) > nbytes
    cpu.reserve_workspace(nbytes)
    expected = cpu.decode(q, k, v, num_splits=4)

    buffer = flashdecode.host_workspace(nbytes)
    assert buffer.__array_interface__["data"][0] % 256 == 0 and buffer.nbytes == nbytes
    cpu.set_workspace(buffer)
    np.testing.assert_array_equal(cpu.decode(q, k, v, num_splits=4), expected)
    with pytest.raises(flashdecode.WorkspaceTooSmallError, match="workspace"):
        cpu.decode(q, k, v, num_splits=8)
    cpu.set_workspace(None)  # library-owned again: grows on demand
    cpu.decode(q, k, v, num_splits=8)


def test_size_queries_take_a_broadcast_query(cpu, rng) -> None:
    # One query row for every sequence (stride 0): decode allocates a
    # contiguous out, and the size and plan queries describe that out, not q.
    row = rng.standard_normal((1, 1, 8, 64)).astype(np.float32)
    q = np.broadcast_to(row, (3, 1, 8, 64))
    k = rng.standard_normal((3, 200, 2, 64)).astype(np.float32)
    assert cpu.workspace_size(q, k, k, num_splits=2) == cpu.workspace_size(np.ascontiguousarray(q), k, k, num_splits=2)
    assert cpu.describe_plan(q, k, k, num_splits=2).num_splits == 2
    out = cpu.decode(q, k, k, num_splits=2)
    np.testing.assert_allclose(out, cpu.decode(np.ascontiguousarray(q), k, k, num_splits=2))


def test_lse_must_be_float32(cpu, rng) -> None:
    q = rng.standard_normal((1, 1, 4, 32)).astype(np.float32)
    k = rng.standard_normal((1, 40, 4, 32)).astype(np.float32)
    with pytest.raises(flashdecode.InvalidDTypeError, match="lse: dtype uint16 is not supported; it must be float32"):
        cpu.decode(q, k, k, lse=np.zeros((1, 1, 4), dtype=np.uint16))


def test_describe_plan(cpu, rng) -> None:
    q = rng.standard_normal((2, 1, 8, 64)).astype(np.float32)
    k = rng.standard_normal((2, 300, 2, 64)).astype(np.float32)
    info = cpu.describe_plan(q, k, k, num_splits=4)
    assert info == flashdecode.PlanInfo(
        backend=flashdecode.Backend.CPU,
        num_splits=4,
        split_tokens=75,
        workspace_bytes=cpu.workspace_size(q, k, k, num_splits=4),
        kernel="cpu",
        merge=flashdecode.Merge.SEPARATE,
        launches=0,
        blocks=2 * 2 * 4,
        schedule=flashdecode.Schedule.FIXED,
    )
    assert flashdecode.Schedule.BALANCED == 3 and flashdecode.Schedule.LONGEST_FIRST == 1
    automatic = cpu.describe_plan(q, k, k, layout="NHD")
    assert automatic.num_splits >= 1 and automatic.split_tokens * automatic.num_splits >= 300
    with pytest.raises(flashdecode.InvalidSplitsError, match="num_splits"):
        cpu.describe_plan(q, k, k, num_splits=-2)


def test_handle_lifecycle() -> None:
    with flashdecode.Handle("cpu") as handle:
        assert handle.backend is flashdecode.Backend.CPU and not handle.closed
        assert "backend=cpu" in repr(handle)
    assert handle.closed and "closed" in repr(handle)
    handle.close()  # idempotent
    with flashdecode.Handle() as automatic:
        assert automatic.backend in (flashdecode.Backend.CPU, flashdecode.Backend.CUDA)


def test_flash_decode_from_several_threads(rng) -> None:
    q = rng.standard_normal((2, 4, 1, 32)).astype(np.float32)
    k = rng.standard_normal((2, 4, 300, 32)).astype(np.float32)
    v = rng.standard_normal((2, 4, 300, 32)).astype(np.float32)
    expected = flashdecode.flash_decode(q, k, v, num_splits=3)
    results = []

    def worker() -> None:
        for _ in range(5):
            results.append(flashdecode.flash_decode(q, k, v, num_splits=3))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 20
    for result in results:
        np.testing.assert_array_equal(result, expected)


def test_pytorch_cpu_tensors(cpu) -> None:
    """Host memory through DLPack: PyTorch CPU tensors, bfloat16 included, and a PyTorch output."""
    torch = pytest.importorskip("torch")
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 1, 32, generator=generator, dtype=torch.bfloat16)
    k = torch.randn(2, 2, 64, 32, generator=generator, dtype=torch.bfloat16)
    v = torch.randn(2, 2, 64, 32, generator=generator, dtype=torch.bfloat16)
    out = flashdecode.flash_decode(q, k, v)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16 and out.shape == q.shape
    expected, _ = attention(*(x.double().numpy() for x in (q[:, :, 0], k.transpose(1, 2), v.transpose(1, 2))))
    np.testing.assert_allclose(out[:, :, 0].double().numpy(), expected, atol=TOLERANCE["bfloat16"])
