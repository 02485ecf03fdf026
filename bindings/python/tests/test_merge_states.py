# SPDX-License-Identifier: Apache-2.0
"""merge_states (since 0.3) on the CPU backend: a cache decoded in parts, each
with its LSE, merges into the decode of the whole cache; empty parts, NaN,
in-place merges, the module-level function, PyTorch CPU tensors, and every
bad argument."""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
import pytest

import flashdecode
from reference import as_float64, attention, random_inputs

# Parts merged against the decode of the whole: both round to the output's
# storage once, from float32 sums in another order.
TOLERANCE = {"float32": 2e-5, "float16": 2e-3, "bfloat16": 1.6e-2}
LENGTHS = (300, 0, 1, 100, 101, 257)  # ragged: parts past a sequence's length are empty for it


def cuts(kv_len: int, parts: int) -> List[Tuple[int, int]]:
    """``parts`` consecutive [start, stop) ranges covering [0, kv_len)."""
    edges = np.linspace(0, kv_len, parts + 1).astype(int)
    return list(zip(edges[:-1], edges[1:]))


def part_lengths(lengths: Sequence[int], start: int, stop: int) -> np.ndarray:
    """Each sequence's tokens inside [start, stop)."""
    return np.clip(np.asarray(lengths) - start, 0, stop - start).astype(np.int32)


def decode_in_parts(
    handle: flashdecode.Handle,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    parts: int,
    layout: str = "NHD",
    dtype: Optional[str] = None,
    lengths: Sequence[int] = LENGTHS,
    out_dtype: Any = None,
) -> Tuple[List[Any], List[Any]]:
    """The states of a cache cut along kv_len (an NHD or HND cache)."""
    axis = 1 if layout == "NHD" else 2
    outs, lses = [], []
    for start, stop in cuts(k.shape[axis], parts):
        index = (slice(None), slice(start, stop)) if axis == 1 else (slice(None), slice(None), slice(start, stop))
        out = None if out_dtype is None else np.empty(q.shape, out_dtype)
        state, state_lse = handle.decode(
            q, k[index], v[index], out=out, seq_lens=part_lengths(lengths, start, stop), layout=layout,
            dtype=dtype, return_lse=True,
        )  # fmt: skip
        outs.append(state)
        lses.append(state_lse)
    return outs, lses


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("parts", [2, 3])
def test_parts_merge_into_the_whole(cpu, rng, dtype, layout, parts) -> None:
    batch, heads, kv_heads, kv_len, dim = len(LENGTHS), 8, 2, 300, 64
    q = random_inputs(rng, (batch, 1, heads, dim), dtype)
    k = random_inputs(rng, (batch, kv_len, kv_heads, dim), dtype)
    v = random_inputs(rng, (batch, kv_len, kv_heads, dim), dtype)
    expected, expected_lse = attention(
        as_float64(q, dtype)[:, 0], as_float64(k, dtype), as_float64(v, dtype), seq_lens=LENGTHS
    )
    if layout == "HND":
        q, k, v = (x.transpose(0, 2, 1, 3) for x in (q, k, v))
    explicit = "bfloat16" if dtype == "bfloat16" else None  # uint16 storage says nothing of its type
    lens = np.array(LENGTHS, np.int32)
    whole, whole_lse = cpu.decode(q, k, v, seq_lens=lens, layout=layout, dtype=explicit, return_lse=True)
    outs, lses = decode_in_parts(cpu, q, k, v, parts, layout, explicit)

    out, lse = cpu.merge_states(outs, lses, layout=layout, dtype=explicit, return_lse=True)

    assert type(out) is np.ndarray and out.shape == q.shape and out.dtype == outs[0].dtype
    assert lse.shape == whole_lse.shape and lse.dtype == np.float32
    tolerance = TOLERANCE[dtype]
    np.testing.assert_allclose(as_float64(out, dtype), as_float64(whole, dtype), atol=tolerance, rtol=tolerance)
    np.testing.assert_allclose(lse, whole_lse, atol=1e-5, rtol=1e-5)
    got = as_float64(out, dtype)
    got = got[:, :, 0] if layout == "HND" else got[:, 0]
    np.testing.assert_allclose(got, expected, atol=tolerance, rtol=tolerance)
    got_lse = lse[:, :, 0] if layout == "HND" else lse[:, 0]
    assert np.all(np.isneginf(got_lse[1])) and np.all(got[1] == 0)  # a sequence of no tokens
    np.testing.assert_allclose(got_lse[np.array(LENGTHS) > 0], expected_lse[np.array(LENGTHS) > 0], rtol=1e-4)
    # Bitwise the same for the same inputs, and the module-level function is the same merge.
    np.testing.assert_array_equal(cpu.merge_states(outs, lses, layout=layout, dtype=explicit), out)
    np.testing.assert_array_equal(flashdecode.merge_states(outs, lses, layout=layout, dtype=explicit), out)


def test_float32_states_into_half_outputs_and_3d_arrays(cpu, rng) -> None:
    """States may differ in dtype from out and from each other; [batch, heads, head_dim]
    states with [batch, heads] LSEs work as with decode."""
    q = random_inputs(rng, (4, 8, 64), "float16")
    k = random_inputs(rng, (4, 200, 2, 64), "float16")
    v = random_inputs(rng, (4, 200, 2, 64), "float16")
    lengths = (200, 50, 199, 0)
    outs, lses = decode_in_parts(cpu, q, k, v, 2, lengths=lengths, out_dtype=np.float32)
    outs[1] = outs[1].astype(np.float16)  # a state of another dtype
    assert outs[0].shape == (4, 8, 64) and lses[0].shape == (4, 8)
    merged = np.empty((4, 8, 64), np.float16)
    result = cpu.merge_states(outs, lses, out=merged)
    assert result is merged
    whole = cpu.decode(q, k, v, seq_lens=np.array(lengths, np.int32))
    np.testing.assert_allclose(merged.astype(np.float64), whole.astype(np.float64), atol=2e-3, rtol=2e-3)
    # 4-D and 3-D arrays of the same rows mix: each is read by its own rank.
    four = cpu.merge_states([outs[0][:, None], outs[1]], [lses[0][:, None], lses[1]])
    np.testing.assert_array_equal(four[:, 0], cpu.merge_states(outs, lses))


def test_empty_states_nan_and_all_empty_rows(cpu) -> None:
    """An LSE of -inf is an empty state, not read (NaN included); all empty is zeros
    with LSE -inf; a NaN LSE makes its row NaN (fd_merge_args)."""
    rows, dim = 3, 4
    out0 = np.arange(1, rows * dim + 1, dtype=np.float32).reshape(1, 1, rows, dim)
    out1 = np.full_like(out0, np.nan)
    lse0 = np.array([0.5, -np.inf, np.nan], np.float32).reshape(1, 1, rows)
    lse1 = np.array([-np.inf, -np.inf, 1.0], np.float32).reshape(1, 1, rows)
    out, lse = cpu.merge_states([out0, out1], [lse0, lse1], return_lse=True)
    np.testing.assert_array_equal(out[0, 0, 0], out0[0, 0, 0])  # the only non-empty state: itself
    assert lse[0, 0, 0] == np.float32(0.5)
    assert np.all(out[0, 0, 1] == 0) and not np.any(np.signbit(out[0, 0, 1])) and np.isneginf(lse[0, 0, 1])
    assert np.all(np.isnan(out[0, 0, 2])) and np.isnan(lse[0, 0, 2])


def test_an_empty_part_changes_nothing(cpu, rng) -> None:
    """A part of no tokens (every length 0) decodes to LSE -inf and merges as nothing."""
    q = random_inputs(rng, (2, 1, 4, 32), "float32")
    k = random_inputs(rng, (2, 64, 4, 32), "float32")
    full, full_lse = cpu.decode(q, k, k, return_lse=True)
    empty, empty_lse = cpu.decode(q, k, k, seq_lens=np.zeros(2, np.int32), return_lse=True)
    assert np.all(np.isneginf(empty_lse)) and np.all(empty == 0)
    empty[...] = np.nan  # not read
    for order in ((full, empty), (empty, full)):
        lses = (full_lse, empty_lse) if order[0] is full else (empty_lse, full_lse)
        out, lse = cpu.merge_states(list(order), list(lses), return_lse=True)
        np.testing.assert_array_equal(out, full)
        np.testing.assert_array_equal(lse, full_lse)


def test_in_place(cpu, rng) -> None:
    """out (and lse) may be one of the states: the merge then overwrites it, with the same
    bits as a merge into fresh arrays."""
    q = random_inputs(rng, (3, 1, 8, 64), "float16")
    k = random_inputs(rng, (3, 300, 2, 64), "float16")
    v = random_inputs(rng, (3, 300, 2, 64), "float16")
    outs, lses = decode_in_parts(cpu, q, k, v, 3, lengths=(300, 150, 10))
    expected, expected_lse = cpu.merge_states(outs, lses, return_lse=True)
    for index in range(3):
        states = [x.copy() for x in outs]
        state_lses = [x.copy() for x in lses]
        out, lse = cpu.merge_states(states, state_lses, out=states[index], lse=state_lses[index], return_lse=True)
        assert out is states[index] and lse is state_lses[index]
        np.testing.assert_array_equal(out, expected)
        np.testing.assert_array_equal(lse, expected_lse)
    # Only the LSE in place, into a strided HND view of one.
    state_lses = [x.copy() for x in lses]
    out = cpu.merge_states(outs, state_lses, lse=state_lses[1])
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(state_lses[1], expected_lse)
    hnd = [x.transpose(0, 2, 1, 3) for x in outs]
    hnd_lses = [x.transpose(0, 2, 1) for x in lses]
    in_place = cpu.merge_states(hnd, hnd_lses, out=hnd[0], layout="HND")
    assert in_place is hnd[0]
    np.testing.assert_array_equal(outs[0], expected)  # hnd[0] is a view of outs[0]


def test_torch_cpu_tensors(cpu, rng) -> None:
    torch = pytest.importorskip("torch")
    q = random_inputs(rng, (2, 1, 8, 64), "float32")
    k = random_inputs(rng, (2, 128, 2, 64), "float32")
    outs, lses = decode_in_parts(cpu, q, k, k, 2, lengths=(128, 77))
    expected, expected_lse = cpu.merge_states(outs, lses, return_lse=True)
    tensors = [torch.from_numpy(x) for x in outs]
    tensor_lses = [torch.from_numpy(x) for x in lses]
    for merged, merged_lse in (
        cpu.merge_states(tensors, tensor_lses, return_lse=True),
        flashdecode.merge_states(tuple(tensors), tuple(tensor_lses), return_lse=True),
    ):
        assert isinstance(merged, torch.Tensor) and merged.dtype == torch.float32 and merged.shape == (2, 1, 8, 64)
        assert isinstance(merged_lse, torch.Tensor) and merged_lse.shape == (2, 1, 8)
        np.testing.assert_array_equal(merged.numpy(), expected)
        np.testing.assert_array_equal(merged_lse.numpy(), expected_lse)
    halves = [x.to(torch.bfloat16) for x in tensors]  # bfloat16 tensors say their type
    merged = flashdecode.merge_states(halves, tensor_lses)
    assert merged.dtype == torch.bfloat16
    np.testing.assert_allclose(merged.float().numpy(), expected, atol=1.6e-2, rtol=1.6e-2)
    grad = tensors[0].clone().requires_grad_()
    np.testing.assert_array_equal(cpu.merge_states([grad, tensors[1]], tensor_lses).numpy(), expected)
    with pytest.raises(flashdecode.InvalidArgumentError, match="out: requires grad"):
        cpu.merge_states(tensors, tensor_lses, out=grad)


def test_dlpack_states_and_cuda_memory_on_a_cpu_handle(cpu) -> None:
    """Any array type decode reads: host DLPack producers are merged; device memory is
    refused by a CPU handle, naming the state."""
    from test_array_protocols import CudaArrayInterface, DLPackOnly

    outs, lses = small_states(3)
    expected = cpu.merge_states(outs, lses)
    out = np.empty_like(expected)
    assert flashdecode.merge_states([DLPackOnly(x) for x in outs], [DLPackOnly(x) for x in lses], out=out) is out
    np.testing.assert_array_equal(out, expected)
    with pytest.raises(TypeError, match="out: cannot allocate it like a DLPackOnly; pass out= explicitly"):
        cpu.merge_states([DLPackOnly(x) for x in outs], lses)
    device = CudaArrayInterface((2, 1, 8, 16), "<f4")
    with pytest.raises(flashdecode.InvalidArgumentError, match=r"states_out\[1\]: is in CUDA memory, but this handle"):
        cpu.merge_states([outs[0], device], lses[:2])


@pytest.mark.filterwarnings("ignore:Dynamo does not know how to trace")
def test_torch_compile_runs_it_outside_the_graph() -> None:
    """Not a custom op: torch.compile breaks the graph around the merge, which runs eagerly."""
    torch = pytest.importorskip("torch")
    outs = [torch.randn(2, 1, 4, 16) for _ in range(3)]
    lses = [torch.randn(2, 1, 4) for _ in range(3)]

    def step(outs: List[Any], lses: List[Any]) -> Any:
        return flashdecode.merge_states([x * 1.0 for x in outs], lses) + 0.0

    torch._dynamo.reset()
    compiled = torch.compile(step, backend="eager")
    assert torch.equal(compiled(outs, lses), step(outs, lses))


def small_states(count: int = 2) -> Tuple[List[np.ndarray], List[np.ndarray]]:
    """``count`` states [batch 2, q_len 1, heads 8, head_dim 16] with LSEs."""
    rng = np.random.default_rng(9)
    outs = [rng.standard_normal((2, 1, 8, 16)).astype(np.float32) for _ in range(count)]
    lses = [rng.standard_normal((2, 1, 8)).astype(np.float32) for _ in range(count)]
    return outs, lses


@pytest.mark.parametrize(
    "case,error,message",
    [
        ("heads", flashdecode.InvalidShapeError, r"states_out\[1\]: heads must be 8 \(from out\), got 4"),
        ("lse shape", flashdecode.InvalidShapeError, r"states_lse\[0\]: batch must be 2 \(from out\), got 1"),
        ("lse float16", flashdecode.InvalidDTypeError, r"states_lse\[0\]: dtype must be f32"),
        ("lse bits", flashdecode.InvalidDTypeError, r"states_lse\[1\]: dtype uint16 is not supported; it must be float32"),
        ("lse float64", flashdecode.InvalidDTypeError, r"states_lse\[1\]: dtype float64 is not supported"),
        ("state int32", flashdecode.InvalidDTypeError, r"states_out\[0\]: dtype must be f32, f16 or bf16"),
        ("bits without dtype", flashdecode.InvalidDTypeError, r"states_out\[0\]: 16-bit integer storage needs"),
        ("merged lse float16", flashdecode.InvalidDTypeError, r"lse: dtype must be f32"),
        ("rank", flashdecode.InvalidShapeError, r"states_out\[1\]: expected \[batch, q_len, heads, head_dim\]"),
        ("lse rank", flashdecode.InvalidShapeError, r"states_lse\[0\]: expected \[batch, q_len, heads\]"),
        ("counts differ", flashdecode.InvalidArgumentError, "outs and lses: 2 outputs but 1 LSEs"),
        ("no states", flashdecode.InvalidArgumentError, r"num_states must be in \[1, 64\], got 0"),
        ("too many states", flashdecode.InvalidArgumentError, r"num_states must be in \[1, 64\], got 65"),
        ("overlap", flashdecode.InvalidArgumentError, r"overlap those of input states_out\[1\]"),
        ("read-only", flashdecode.InvalidArgumentError, "out: the array is read-only"),
        ("layout", flashdecode.InvalidArgumentError, "layout: expected 'NHD' or 'HND'"),
        ("dtype int32", flashdecode.InvalidDTypeError, "dtype: states and out hold float32, float16 or bfloat16"),
    ],
)
def test_bad_arguments_write_nothing(cpu, case, error, message) -> None:
    outs, lses = small_states()
    out = np.full((2, 1, 8, 16), 7.0, np.float32)
    lse = None
    options: dict = {}
    if case == "heads":
        outs[1] = outs[1][:, :, :4]
    elif case == "lse shape":
        lses[0] = lses[0][:1]
    elif case == "lse float16":
        lses[0] = lses[0].astype(np.float16)
    elif case == "lse bits":
        lses[1] = lses[1].view(np.uint16)[..., ::2].copy()
    elif case == "lse float64":
        lses[1] = lses[1].astype(np.float64)
    elif case == "state int32":
        outs[0] = outs[0].astype(np.int32)
    elif case == "bits without dtype":
        outs[0] = outs[0].astype(np.float16).view(np.uint16)
    elif case == "merged lse float16":
        lse = np.zeros((2, 1, 8), np.float16)
    elif case == "rank":
        outs[1] = outs[1][None]
    elif case == "lse rank":
        lses[0] = lses[0][..., None]
    elif case == "counts differ":
        lses = lses[:1]
    elif case == "no states":
        outs, lses = [], []
    elif case == "too many states":
        outs, lses = small_states(65)
    elif case == "overlap":
        memory = np.full(2 * 8 * 16 + 1, 7.0, np.float32)
        outs[1], out = memory[:-1].reshape(2, 1, 8, 16), memory[1:].reshape(2, 1, 8, 16)  # out shifted by one
    elif case == "read-only":
        out.flags.writeable = False
    elif case == "layout":
        options["layout"] = "BHND"
    elif case == "dtype int32":
        options["dtype"] = "int32"
    before = out.copy()
    with pytest.raises(error, match=message):
        cpu.merge_states(outs, lses, out=out, lse=lse, **options)
    np.testing.assert_array_equal(out, before)


def test_bad_sequences_and_a_closed_handle(cpu) -> None:
    outs, lses = small_states()
    stacked = np.stack(outs)
    with pytest.raises(TypeError, match=r"outs: expected a sequence .* got ndarray; .* pass list\(array\)"):
        cpu.merge_states(stacked, lses)
    with pytest.raises(TypeError, match="lses: expected a sequence"):
        flashdecode.merge_states(outs, 3.0)
    with pytest.raises(TypeError, match=r"states_out\[0\]: expected an array"):
        cpu.merge_states([object(), outs[1]], lses)
    np.testing.assert_array_equal(cpu.merge_states(list(stacked), lses), cpu.merge_states(outs, lses))
    cpu.close()
    with pytest.raises(flashdecode.InvalidHandleError, match="closed"):
        cpu.merge_states(outs, lses)


def test_cascade_recipe(cpu, rng) -> None:
    """Cascade attention: a prefix shared by the batch, stored once (stride 0 over the
    batch) and decoded once per step, merged with each sequence's own suffix."""
    batch, heads, kv_heads, dim, prefix_len, suffix_len = 4, 8, 2, 64, 200, 50
    q = random_inputs(rng, (batch, 1, heads, dim), "float32")
    shared_k = random_inputs(rng, (1, prefix_len, kv_heads, dim), "float32")
    shared_v = random_inputs(rng, (1, prefix_len, kv_heads, dim), "float32")
    own_k = random_inputs(rng, (batch, suffix_len, kv_heads, dim), "float32")
    own_v = random_inputs(rng, (batch, suffix_len, kv_heads, dim), "float32")
    lens = np.array([50, 0, 13, 49], np.int32)
    prefix_k, prefix_v = (np.broadcast_to(x, (batch,) + x.shape[1:]) for x in (shared_k, shared_v))
    prefix, prefix_lse = cpu.decode(q, prefix_k, prefix_v, return_lse=True)
    suffix, suffix_lse = cpu.decode(q, own_k, own_v, seq_lens=lens, return_lse=True)
    out = flashdecode.merge_states([prefix, suffix], [prefix_lse, suffix_lse])
    full_k = np.concatenate([prefix_k, own_k], axis=1)
    full_v = np.concatenate([prefix_v, own_v], axis=1)
    expected, _ = attention(q[:, 0], full_k, full_v, seq_lens=prefix_len + lens)
    np.testing.assert_allclose(out[:, 0], expected, atol=2e-5, rtol=2e-5)
