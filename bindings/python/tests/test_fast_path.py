# SPDX-License-Identifier: Apache-2.0
"""The fast path: a handle reuses the C arguments of a call signature and
writes only the data pointers. It must never reuse a stale pointer, shape or
check: every result here is compared with the float64 reference, for NumPy
arrays and (where PyTorch is installed) PyTorch CPU tensors."""

from __future__ import annotations

import gc
import threading
from typing import Any, Callable, Dict, Tuple

import numpy as np
import pytest

import flashdecode
from flashdecode._signature import _MAX_PLANS, _numpy_pointer, _signature
from reference import attention, from_bf16_bits, random_inputs, variant_attention


def numpy_kind(x: np.ndarray) -> np.ndarray:
    return x


def torch_kind(x: np.ndarray) -> Any:
    torch = pytest.importorskip("torch")
    return torch.from_numpy(np.ascontiguousarray(x))


KINDS: Dict[str, Callable[[np.ndarray], Any]] = {"numpy": numpy_kind, "torch": torch_kind}


def to_numpy(x: Any) -> np.ndarray:
    return x if isinstance(x, np.ndarray) else x.numpy()


def make(
    rng: np.random.Generator, batch: int, heads: int, kv_heads: int, kv_len: int, dim: int
) -> Tuple[np.ndarray, ...]:
    q = rng.standard_normal((batch, 1, heads, dim)).astype(np.float32)
    k = rng.standard_normal((batch, kv_len, kv_heads, dim)).astype(np.float32)
    v = rng.standard_normal((batch, kv_len, kv_heads, dim)).astype(np.float32)
    return q, k, v


def check(out: Any, q: np.ndarray, k: np.ndarray, v: np.ndarray, **reference: Any) -> None:
    expected, _ = attention(q[:, 0], k, v, **reference)
    np.testing.assert_allclose(to_numpy(out)[:, 0], expected, atol=2e-5, rtol=2e-5)


def plans(handle: flashdecode.Handle) -> int:
    return len(handle._plans)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_same_shape_different_arrays(cpu, rng, kind) -> None:
    """Alternating arrays of one signature: each call reads its own memory."""
    convert = KINDS[kind]
    problems = [make(rng, 2, 8, 2, 40, 64) for _ in range(3)]
    arrays = [tuple(convert(x) for x in problem) for problem in problems]
    outs = [convert(np.zeros_like(problem[0])) for problem in problems]
    for _ in range(3):
        for problem, (q, k, v), out in zip(problems, arrays, outs):
            check(cpu.decode(q, k, v), *problem)
            assert cpu.decode(q, k, v, out=out) is out
            check(out, *problem)
    assert plans(cpu) == 2  # allocated out, given out: one signature each, however many arrays


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_shapes_layouts_and_options_alternate(cpu, rng, kind) -> None:
    convert = KINDS[kind]
    small, large = make(rng, 2, 8, 2, 40, 64), make(rng, 3, 4, 4, 77, 32)
    for _ in range(3):
        for problem in (small, large):
            q, k, v = (convert(x) for x in problem)
            check(cpu.decode(q, k, v), *problem)
            check(cpu.decode(q, k, v, softmax_scale=0.5), *problem, scale=0.5)
            check(cpu.decode(q, k, v, num_splits=3), *problem)
            hnd = [convert(np.ascontiguousarray(x.transpose(0, 2, 1, 3))) for x in problem]
            out = cpu.decode(*hnd, layout="HND")
            check(to_numpy(out).transpose(0, 2, 1, 3), *problem)
            out, lse = cpu.decode(q, k, v, return_lse=True)
            check(out, *problem)
            np.testing.assert_allclose(to_numpy(lse)[:, 0], attention(problem[0][:, 0], *problem[1:])[1], rtol=1e-5)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_strides_differ_with_the_same_shape(cpu, rng, kind) -> None:
    """A contiguous cache and a strided view of the same shape are two signatures."""
    convert = KINDS[kind]
    q, k, v = make(rng, 2, 8, 2, 40, 64)
    wide = rng.standard_normal((2, 40, 2, 3, 64)).astype(np.float32)  # k/v interleaved with other data
    if kind == "numpy":
        strided_k, strided_v = wide[:, :, :, 0], wide[:, :, :, 2]
    else:
        torch_wide = convert(wide)
        strided_k, strided_v = torch_wide[:, :, :, 0], torch_wide[:, :, :, 2]
    for _ in range(2):
        check(cpu.decode(convert(q), convert(k), convert(v)), q, k, v)
        check(cpu.decode(convert(q), strided_k, strided_v), q, wide[:, :, :, 0], wide[:, :, :, 2])


def test_freed_and_reallocated(cpu, rng) -> None:
    """Arrays freed between calls: the allocator may hand the same addresses back with other contents."""
    for _ in range(20):
        q, k, v = make(rng, 2, 8, 2, 40, 64)
        check(cpu.decode(q, k, v), q, k, v)
        del q, k, v
        gc.collect()
    # A view at an offset into one buffer, then another: same signature, other pointers.
    pool = rng.standard_normal((4, 40, 2, 64)).astype(np.float32)
    q = rng.standard_normal((2, 1, 8, 64)).astype(np.float32)
    for start in (0, 2, 1, 0, 2):
        k, v = pool[start : start + 2], pool[(start + 1) % 3 : (start + 1) % 3 + 2]
        check(cpu.decode(q, k, v), q, k, v)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_allocated_outputs_are_new_each_call(cpu, rng, kind) -> None:
    convert = KINDS[kind]
    first, second = make(rng, 2, 8, 2, 40, 64), make(rng, 2, 8, 2, 40, 64)
    out1, lse1 = cpu.decode(*(convert(x) for x in first), return_lse=True)
    out2, lse2 = cpu.decode(*(convert(x) for x in second), return_lse=True)
    assert out1 is not out2 and lse1 is not lse2
    check(out1, *first)
    check(out2, *second)
    assert not np.shares_memory(to_numpy(out1), to_numpy(out2))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_lengths_and_tables_are_read_each_call(checked, rng, kind) -> None:
    """Contents are never part of the signature: new lengths and page tables take effect, and
    invalid ones are still refused by a checking handle, naming the argument, on the fast path."""
    cpu, convert = checked, KINDS[kind]
    q, k, v = make(rng, 3, 4, 2, 48, 32)
    for lens in ([48, 0, 17], [1, 48, 30], [5, 5, 5]):
        lens_array = np.array(lens, np.int32)
        check(cpu.decode(convert(q), convert(k), convert(v), seq_lens=convert(lens_array)), q, k, v, seq_lens=lens)
    out = convert(np.full_like(q, 7.0))
    with pytest.raises(flashdecode.InvalidLengthError, match=r"seq_lens\[2\] must be in \[0, 48\]"):
        cpu.decode(convert(q), convert(k), convert(v), out=out, seq_lens=convert(np.array([1, 2, 49], np.int32)))
    np.testing.assert_array_equal(to_numpy(out), 7.0)

    page = 16
    pool_k = k.reshape(3 * 48 // page, page, 2, 32)
    pool_v = v.reshape(3 * 48 // page, page, 2, 32)
    lens = np.array([48, 20, 33], np.int32)
    for permutation in (rng.permutation(9), rng.permutation(9), np.arange(9)):
        table = permutation.reshape(3, 3).astype(np.int32)
        dense_k = pool_k[table].reshape(3, 48, 2, 32)
        dense_v = pool_v[table].reshape(3, 48, 2, 32)
        result = cpu.decode(
            convert(q), convert(pool_k), convert(pool_v), block_table=convert(table), seq_lens=convert(lens)
        )
        check(result, q, dense_k, dense_v, seq_lens=lens)
    with pytest.raises(flashdecode.InvalidBlockTableError, match=r"block_table\[0\]\[0\] must be in \[0, 9\)"):
        bad = np.full((3, 3), 9, np.int32)
        cpu.decode(convert(q), convert(pool_k), convert(pool_v), block_table=convert(bad), seq_lens=convert(lens))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_query_counts_are_read_each_call(checked, rng, kind) -> None:
    """q_lens (since 0.3) is an input like seq_lens: new arrays of one signature, and new contents
    of the same array, take effect on the fast path; a bad count is still refused by a checking
    handle, naming it; the pointer is patched, not the plan rebuilt."""
    cpu, convert = checked, KINDS[kind]
    q = rng.standard_normal((3, 4, 4, 32)).astype(np.float32)
    k = rng.standard_normal((3, 40, 2, 32)).astype(np.float32)
    v = rng.standard_normal((3, 40, 2, 32)).astype(np.float32)
    lens = np.array([40, 9, 25], np.int32)
    arrays = [convert(x) for x in (q, k, v)]
    for _ in range(2):
        for counts in ([4, 0, 2], [1, 4, 3], [0, 0, 0], [4, 4, 4]):
            out, lse = cpu.decode(
                *arrays, seq_lens=convert(lens), q_lens=convert(np.array(counts, np.int32)), return_lse=True
            )
            expected, expected_lse = variant_attention(q, k, v, seq_lens=lens, q_lens=counts)
            np.testing.assert_allclose(to_numpy(out), expected, atol=2e-5, rtol=2e-5)
            np.testing.assert_array_equal(np.isneginf(to_numpy(lse)), np.isneginf(expected_lse))
    assert plans(cpu) == 1
    counts_array = np.array([2, 2, 2], np.int32)
    counts = convert(counts_array)  # shares counts_array's memory
    first = to_numpy(cpu.decode(*arrays, seq_lens=convert(lens), q_lens=counts)).copy()
    counts_array[:] = [3, 1, 4]  # the same array, new contents: read on every call
    again = to_numpy(cpu.decode(*arrays, seq_lens=convert(lens), q_lens=counts))
    np.testing.assert_allclose(again, variant_attention(q, k, v, seq_lens=lens, q_lens=[3, 1, 4])[0], atol=2e-5)
    assert not np.allclose(first, again)
    assert plans(cpu) == 2  # return_lse=False: another signature
    cpu.decode(*arrays, out=convert(np.zeros_like(q)), seq_lens=convert(lens), q_lens=counts)
    out = convert(np.full_like(q, 7.0))  # the signature just remembered: the fast path refuses
    needle = r"q_lens\[1\] must be in \[0, 4\] \(q's q_len\), got 5"
    with pytest.raises(flashdecode.InvalidLengthError, match=needle):
        cpu.decode(*arrays, out=out, seq_lens=convert(lens), q_lens=convert(np.array([4, 5, 0], np.int32)))
    np.testing.assert_array_equal(to_numpy(out), 7.0)
    assert plans(cpu) == 3


def test_per_call_checks_are_not_skipped(cpu, rng) -> None:
    """What the library cannot see stays checked: a read-only output after a writable one."""
    q, k, v = make(rng, 2, 8, 2, 40, 64)
    out = np.zeros_like(q)
    cpu.decode(q, k, v, out=out)
    frozen = np.zeros_like(q)
    frozen.setflags(write=False)
    with pytest.raises(flashdecode.InvalidArgumentError, match="out: the array is read-only"):
        cpu.decode(q, k, v, out=frozen)
    np.testing.assert_array_equal(frozen, 0)
    out.setflags(write=False)  # the very array that was fast a moment ago
    with pytest.raises(flashdecode.InvalidArgumentError, match="out: the array is read-only"):
        cpu.decode(q, k, v, out=out)
    with pytest.raises(flashdecode.InvalidArgumentError, match="softmax_scale: expected a float"):
        cpu.decode(q, k, v, softmax_scale=True)  # equal to 1 as a key, refused as an argument
    with pytest.raises(flashdecode.InvalidArgumentError, match="None selects 1/sqrt"):
        cpu.decode(q, k, v, softmax_scale=0)
    cpu.close()
    with pytest.raises(flashdecode.InvalidHandleError, match="this Handle was closed"):
        cpu.decode(q, k, v)


def test_bf16_storage_alternates(cpu, rng) -> None:
    """uint16 bits named by dtype=: the key holds dtype=, and different contents give different results."""
    for _ in range(2):
        for seed in (1, 2):
            local = np.random.default_rng(seed)
            q, k, v = (
                random_inputs(local, shape, "bfloat16") for shape in ((2, 1, 4, 64), (2, 30, 2, 64), (2, 30, 2, 64))
            )
            out = cpu.decode(q, k, v, dtype="bfloat16")
            assert out.dtype == np.uint16
            expected, _ = attention(
                *(from_bf16_bits(x).astype(np.float64)[:, 0] if x is q else from_bf16_bits(x) for x in (q, k, v))
            )
            np.testing.assert_allclose(from_bf16_bits(out)[:, 0], expected, atol=2e-2, rtol=2e-2)
    with pytest.raises(flashdecode.InvalidDTypeError, match="16-bit integer storage needs dtype="):
        cpu.decode(q, k, v)


def test_many_signatures_evict_the_oldest(cpu, rng) -> None:
    problems = [make(rng, 1, 2, 1, length, 16) for length in range(1, _MAX_PLANS + 6)]
    for _ in range(2):
        for problem in problems:
            check(cpu.decode(*problem), *problem)
    assert plans(cpu) == _MAX_PLANS


def test_threads_share_a_handle(rng) -> None:
    problems = [make(np.random.default_rng(seed), 2, 8, 2, 40 + seed, 64) for seed in range(4)]
    failures = []

    def work(problem: Tuple[np.ndarray, ...]) -> None:
        try:
            for _ in range(50):
                check(handle.decode(*problem), *problem)
        except Exception as error:  # reported below
            failures.append(error)

    with flashdecode.Handle("cpu", num_threads=2) as handle:
        threads = [threading.Thread(target=work, args=(problem,)) for problem in problems]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert not failures, failures


def test_numpy_pointer_reader_agrees_with_the_interface(rng) -> None:
    base = rng.standard_normal((6, 5, 4)).astype(np.float16)
    views = [base, base[2:], base[:, ::-1], base[..., 1:3], base.T, np.asfortranarray(base), base[3, 2, 1:2], base[:0]]
    for view in views:
        assert _numpy_pointer(view) == view.__array_interface__["data"][0]


def test_only_plain_arrays_take_the_fast_path(cpu, rng) -> None:
    """Subclasses, lists and mixed kinds go the full way (and still work)."""
    q, k, v = make(rng, 2, 8, 2, 40, 64)
    assert _signature(q, k, v, None, None, False, None, None, None, None, None, "NHD", None) is not None
    for args in ((q.view(np.matrix) if q.ndim == 2 else np.ma.masked_array(q), k, v), (q, k, v.tolist())):
        assert _signature(*args, None, None, False, None, None, None, None, None, "NHD", None) is None
    assert _signature(q, k, v, None, None, False, [40, 40], None, None, None, None, "NHD", None) is None
    assert _signature(q, k, v, None, None, False, None, None, np.float32(0.5), None, None, "NHD", None) is None
    assert _signature(q, k, v, None, None, False, None, None, None, None, np.int64(64), "NHD", None) is None
    check(cpu.decode(q, k, v, seq_lens=[40, 12]), q, k, v, seq_lens=[40, 12])
    check(cpu.decode(q, k, v, softmax_scale=np.float32(0.5)), q, k, v, scale=float(np.float32(0.5)))
    check(cpu.decode(q, k, v, split_tokens=np.int64(16)), q, k, v)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_split_tokens_is_part_of_the_signature(cpu, rng, kind) -> None:
    """split_tokens changes the plan (and so the last bits): calls alternating it each get their own,
    bitwise the same as the first call of each, and describe_plan agrees with what ran."""
    convert = KINDS[kind]
    q, k, v = (convert(x) for x in make(rng, 2, 8, 2, 200, 64))
    runs: Dict[Any, Any] = {}
    for _ in range(3):
        for split_tokens in (None, 32, 64, 0):
            out = to_numpy(cpu.decode(q, k, v, split_tokens=split_tokens)).copy()
            if split_tokens in runs:
                np.testing.assert_array_equal(out, runs[split_tokens])
            runs[split_tokens] = out
    assert plans(cpu) == 4  # None and 0 mean the same to the library, but the key holds the argument as given
    for split_tokens in (32, 64):
        info = cpu.describe_plan(q, k, v, split_tokens=split_tokens)
        assert info.split_tokens >= split_tokens and info.num_splits == -(-200 // info.split_tokens)
    check(runs[32], *(to_numpy(x) for x in (q, k, v)))
