# SPDX-License-Identifier: Apache-2.0
"""The attention variants of 0.3 on the CPU backend: several query tokens per
sequence, causal or not, sliding windows, logit softcaps, ALiBi and attention
sinks, alone and together, with GQA, ragged lengths, paged caches and every
dtype, against the float64 reference of ``reference.variant_attention``
(written from the header's definition, not from the kernels)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pytest

import flashdecode
from reference import alibi_slopes, as_float64, random_inputs, to_pages, variant_attention

# Inputs are compared as the library reads them: what remains is float32
# arithmetic and the rounding of the output to its storage type.
TOLERANCE = {"float32": 3e-5, "float16": 3e-3, "bfloat16": 2e-2}
LSE_TOLERANCE = 1e-4


def make(
    rng: np.random.Generator,
    batch: int,
    q_len: int,
    heads: int,
    kv_heads: int,
    kv_len: int,
    dim: int,
    dtype: str = "float32",
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    q = random_inputs(rng, (batch, q_len, heads, dim), dtype)
    k = random_inputs(rng, (batch, kv_len, kv_heads, dim), dtype)
    v = random_inputs(rng, (batch, kv_len, kv_heads, dim), dtype)
    return q, k, v


def expect(
    out: np.ndarray,
    lse: Optional[np.ndarray],
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    dtype: str = "float32",
    **options: Any,
) -> Tuple[np.ndarray, np.ndarray]:
    """Compares NHD ``out`` (and ``lse``) with the reference for ``options``; returns the reference."""
    expected, expected_lse = variant_attention(
        as_float64(q, dtype), as_float64(k, dtype), as_float64(v, dtype), **options
    )
    tolerance = TOLERANCE[dtype]
    np.testing.assert_allclose(as_float64(out, dtype), expected, atol=tolerance, rtol=tolerance)
    if lse is not None:
        assert lse.shape == expected_lse.shape and lse.dtype == np.float32
        np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(expected_lse))
        finite = ~np.isneginf(expected_lse)
        np.testing.assert_allclose(lse[finite], expected_lse[finite], atol=LSE_TOLERANCE, rtol=LSE_TOLERANCE)
    return expected, expected_lse


def library_options(options: Dict[str, Any]) -> Dict[str, Any]:
    """The reference's keyword arguments as Handle.decode's (``scale`` is ``softmax_scale`` there)."""
    renamed = dict(options)
    if "scale" in renamed:
        renamed["softmax_scale"] = renamed.pop("scale")
    return renamed


# ---- several query tokens -------------------------------------------------------


@pytest.mark.parametrize("q_len", [1, 2, 4, 16])
@pytest.mark.parametrize("causal", [True, False])
def test_query_tokens(cpu, rng, q_len, causal) -> None:
    """Ragged lengths, among them shorter than q_len (the first tokens then see no key
    under the causal mask) and empty; the same result with several splits."""
    q, k, v = make(rng, 5, q_len, 8, 2, 70, 32)
    lens = np.array([70, 1, 0, 17, max(q_len - 1, 0)], np.int32)
    out, lse = cpu.decode(q, k, v, seq_lens=lens, causal=causal, return_lse=True)
    assert out.shape == q.shape and lse.shape == q.shape[:-1]
    expected, expected_lse = expect(out, lse, q, k, v, seq_lens=lens, causal=causal)
    np.testing.assert_array_equal(out[2], 0.0)  # an empty sequence
    assert np.all(np.isneginf(lse[2]))
    if causal and q_len > 1:
        assert np.all(np.isneginf(expected_lse[1, :-1])), "the test must cover tokens that see no key"
        np.testing.assert_array_equal(out[1, :-1], 0.0)
    split, split_lse = cpu.decode(q, k, v, seq_lens=lens, causal=causal, num_splits=5, return_lse=True)
    expect(split, split_lse, q, k, v, seq_lens=lens, causal=causal)


def test_one_query_token_is_the_same_either_way(cpu, rng) -> None:
    """With q_len 1 both masks are the same (the header says so): bitwise."""
    q, k, v = make(rng, 3, 1, 4, 4, 50, 32)
    lens = np.array([50, 7, 0], np.int32)
    causal, causal_lse = cpu.decode(q, k, v, seq_lens=lens, return_lse=True)
    full, full_lse = cpu.decode(q, k, v, seq_lens=lens, causal=False, return_lse=True)
    np.testing.assert_array_equal(causal, full)
    np.testing.assert_array_equal(causal_lse, full_lse)


def test_the_causal_mask_hides_later_tokens(cpu, rng) -> None:
    """Changing a key that only later query tokens see leaves the earlier ones bitwise alone."""
    q, k, v = make(rng, 1, 4, 4, 4, 30, 16)
    before = cpu.decode(q, k, v)
    k2, v2 = k.copy(), v.copy()
    k2[0, 29], v2[0, 29] = 100.0, -100.0  # position 29: the last query token's own
    after = cpu.decode(q, k2, v2)
    np.testing.assert_array_equal(after[0, :3], before[0, :3])
    assert not np.allclose(after[0, 3], before[0, 3])
    expect(after, None, q, k2, v2)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_query_tokens_in_either_layout(cpu, rng, layout) -> None:
    q, k, v = make(rng, 2, 4, 6, 3, 40, 64)
    lens = np.array([40, 3], np.int32)
    if layout == "HND":
        args = [x.transpose(0, 2, 1, 3) for x in (q, k, v)]  # strided views
    else:
        args = [q, k, v]
    out, lse = cpu.decode(*args, seq_lens=lens, layout=layout, return_lse=True)
    assert out.shape == args[0].shape
    if layout == "HND":
        out, lse = out.transpose(0, 2, 1, 3), lse.transpose(0, 2, 1)
    expect(out, lse, q, k, v, seq_lens=lens)


# ---- sliding windows -----------------------------------------------------------


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window", ["larger", "equal", "smaller", 1])
def test_window(cpu, rng, causal, window) -> None:
    length = 60
    window_left = {"larger": length + 5, "equal": length, "smaller": 7}.get(window, window)
    q, k, v = make(rng, 3, 4, 8, 2, length, 32)
    lens = np.array([length, 5, 0], np.int32)
    out, lse = cpu.decode(q, k, v, seq_lens=lens, causal=causal, window_left=window_left, return_lse=True)
    expect(out, lse, q, k, v, seq_lens=lens, causal=causal, window_left=window_left)
    if window_left >= length:  # a window as long as the cache hides nothing
        whole, whole_lse = cpu.decode(q, k, v, seq_lens=lens, causal=causal, return_lse=True)
        np.testing.assert_allclose(out, whole, atol=1e-6)
        np.testing.assert_allclose(lse, whole_lse, atol=1e-6)


def test_window_of_one_sees_only_its_own_position(cpu, rng) -> None:
    q, k, v = make(rng, 1, 4, 2, 2, 20, 16)
    out, lse = cpu.decode(q, k, v, window_left=1, return_lse=True)
    # One key each (positions 16..19): its value, and its scaled score as LSE.
    np.testing.assert_allclose(out[0], v[0, 16:20], atol=1e-6)
    scores = np.einsum("thd,thd->th", q[0].astype(np.float64), k[0, 16:20].astype(np.float64)) / 4.0
    np.testing.assert_allclose(lse[0], scores, atol=1e-5)


def test_window_reads_only_the_keys_inside_it(cpu, rng) -> None:
    """Keys outside the window are never read: NaN there changes nothing; and the plan cuts
    the window's keys, not the whole cache."""
    q, k, v = make(rng, 2, 2, 4, 2, 400, 32)
    lens = np.array([400, 300], np.int32)
    expected = cpu.decode(q, k, v, seq_lens=lens, window_left=32)
    expect(expected, None, q, k, v, seq_lens=lens, window_left=32)
    # Positions 398 and 399 (of 400) see keys 367 on, 298 and 299 (of 300) keys 267 on.
    k[0, :367], v[0, :367], k[1, :267], v[1, :267] = np.nan, np.nan, np.nan, np.nan
    out = cpu.decode(q, k, v, seq_lens=lens, window_left=32)
    np.testing.assert_array_equal(out, expected)
    windowed = cpu.describe_plan(q, k, v, seq_lens=lens, window_left=32, num_splits=4)
    whole = cpu.describe_plan(q, k, v, seq_lens=lens, num_splits=4)
    assert windowed.num_splits == whole.num_splits == 4
    assert windowed.split_tokens < whole.split_tokens, (windowed, whole)
    assert cpu.workspace_size(q, k, v, seq_lens=lens, window_left=32, num_splits=4) == windowed.workspace_bytes


# ---- softcap, ALiBi, sinks -----------------------------------------------------


def test_logit_softcap(cpu, rng) -> None:
    """Scores of magnitude well above the cap (scale 1, head_dim 64), so that the cap matters."""
    q, k, v = make(rng, 2, 4, 8, 2, 90, 64)
    out, lse = cpu.decode(q, k, v, softmax_scale=1.0, logit_softcap=5.0, return_lse=True)
    expect(out, lse, q, k, v, scale=1.0, logit_softcap=5.0)
    uncapped = cpu.decode(q, k, v, softmax_scale=1.0)
    assert np.abs(out - uncapped).max() > 0.05, "the cap must change the result here"
    assert np.all(lse <= np.log(90) + 5.0 + 1e-4)  # every capped score is below 5


def test_alibi(cpu, rng) -> None:
    q, k, v = make(rng, 3, 4, 8, 4, 120, 32)
    lens = np.array([120, 9, 0], np.int32)
    slopes = alibi_slopes(8)
    out, lse = cpu.decode(q, k, v, seq_lens=lens, alibi_slopes=slopes, return_lse=True)
    expect(out, lse, q, k, v, seq_lens=lens, alibi_slopes=slopes)
    # A list works on the CPU backend; the same bits.
    np.testing.assert_array_equal(cpu.decode(q, k, v, seq_lens=lens, alibi_slopes=slopes.tolist()), out)


def test_sinks(cpu, rng) -> None:
    """exp(sink) joins the denominator: an empty sequence is zeros with LSE = sink, and so are
    the tokens that see no key under the causal mask."""
    q, k, v = make(rng, 3, 4, 4, 2, 50, 32)
    lens = np.array([50, 2, 0], np.int32)
    sinks = np.array([0.5, -1.0, 3.0, 0.0], np.float32)
    out, lse = cpu.decode(q, k, v, seq_lens=lens, sinks=sinks, return_lse=True)
    expect(out, lse, q, k, v, seq_lens=lens, sinks=sinks)
    np.testing.assert_array_equal(out[2], 0.0)
    np.testing.assert_allclose(lse[2], np.broadcast_to(sinks, (4, 4)), atol=1e-6)
    np.testing.assert_array_equal(out[1, :2], 0.0)  # positions -2 and -1: no key
    np.testing.assert_allclose(lse[1, :2], np.broadcast_to(sinks, (2, 4)), atol=1e-6)
    # A sink only adds to the denominator: the output shrinks by sum / (sum + exp(sink)).
    plain, plain_lse = cpu.decode(q, k, v, seq_lens=lens, return_lse=True)
    ratio = np.exp(plain_lse[0] - lse[0])[..., None]
    np.testing.assert_allclose(out[0], plain[0] * ratio, atol=1e-5)


# ---- everything at once ----------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("causal", [True, False])
def test_combined_gqa_paged_ragged(cpu, rng, dtype, causal) -> None:
    """Every variant at once, on a paged cache (NHD pages) with ragged lengths and GQA,
    against the dense reference; automatic, several and fixed-length splits agree."""
    batch, q_len, heads, kv_heads, dim, page_size, max_pages = 4, 4, 8, 2, 64, 16, 6
    capacity = page_size * max_pages
    q, dense_k, dense_v = make(rng, batch, q_len, heads, kv_heads, capacity, dim, dtype)
    lens = np.array([capacity, 1, 0, 50], np.int32)
    pool_k, pool_v, table = to_pages(rng, dense_k, dense_v, page_size, 3)
    options: Dict[str, Any] = dict(
        seq_lens=lens,
        causal=causal,
        window_left=20,
        logit_softcap=8.0,
        alibi_slopes=alibi_slopes(heads),
        sinks=np.linspace(-1.0, 1.0, heads).astype(np.float32),
        scale=0.3,
    )
    explicit = "bfloat16" if dtype == "bfloat16" else None
    for splits in ({}, {"num_splits": 3}, {"split_tokens": 16}):
        out, lse = cpu.decode(
            q, pool_k, pool_v, block_table=table, dtype=explicit, return_lse=True, **library_options(options), **splits
        )
        expect(out, lse, q, dense_k, dense_v, dtype, **options)
    dense = cpu.decode(q, dense_k, dense_v, dtype=explicit, **library_options(options))
    expect(dense, None, q, dense_k, dense_v, dtype, **options)


def test_float32_output_of_half_inputs_with_variants(cpu, rng) -> None:
    q, k, v = make(rng, 2, 4, 4, 2, 40, 32, "float16")
    out = np.empty(q.shape, np.float32)
    options: Dict[str, Any] = dict(
        causal=False, window_left=9, alibi_slopes=alibi_slopes(4), sinks=[0.1, 0.2, 0.3, 0.4]
    )
    assert cpu.decode(q, k, v, out=out, **options) is out
    expected, _ = variant_attention(q, k, v, **options)
    np.testing.assert_allclose(out, expected, atol=2e-5, rtol=2e-5)


def test_batch_invariance_holds_with_variants(rng) -> None:
    """split_tokens with every variant: a sequence alone gives bitwise its result in the batch."""
    q, k, v = make(rng, 4, 4, 8, 2, 200, 32)
    lens = np.array([200, 37, 0, 129], np.int32)
    options: Dict[str, Any] = dict(
        window_left=50, logit_softcap=6.0, alibi_slopes=alibi_slopes(8), sinks=np.full(8, 0.25, np.float32)
    )
    with flashdecode.Handle("cpu", num_threads=2) as batched, flashdecode.Handle("cpu", num_threads=1) as alone:
        out, lse = batched.decode(q, k, v, seq_lens=lens, split_tokens=32, return_lse=True, **options)
        expect(out, lse, q, k, v, seq_lens=lens, **options)
        for b, length in enumerate(lens):
            one, one_lse = alone.decode(
                q[b : b + 1], k[b : b + 1, :length], v[b : b + 1, :length], split_tokens=32, return_lse=True, **options
            )
            np.testing.assert_array_equal(one[0], out[b])
            np.testing.assert_array_equal(one_lse[0], lse[b])


def test_flash_decode_and_three_dimensional_queries(rng) -> None:
    """flash_decode (HND) takes the variants too; a 3-D q is q_len 1."""
    q, k, v = make(rng, 2, 3, 4, 2, 30, 16)
    slopes = alibi_slopes(4)
    hnd = [np.ascontiguousarray(x.transpose(0, 2, 1, 3)) for x in (q, k, v)]
    out = flashdecode.flash_decode(*hnd, causal=False, window_left=12, alibi_slopes=slopes, logit_softcap=3.0)
    expect(
        out.transpose(0, 2, 1, 3), None, q, k, v, causal=False, window_left=12, alibi_slopes=slopes, logit_softcap=3.0
    )
    with flashdecode.Handle("cpu", num_threads=2) as handle:
        out3, lse3 = handle.decode(q[:, 0], k, v, sinks=[1.0, 0.0, -1.0, 2.0], window_left=4, return_lse=True)
    assert out3.shape == (2, 4, 16) and lse3.shape == (2, 4)
    expect(out3[:, None], lse3[:, None], q[:, :1], k, v, sinks=[1.0, 0.0, -1.0, 2.0], window_left=4)


def test_fast_path_keeps_each_option_apart(cpu, rng) -> None:
    """One set of arrays under alternating options: each call takes its own plan (the fast path
    after the first), new slope and sink arrays of one signature are read anew."""
    q, k, v = make(rng, 2, 4, 4, 2, 60, 32)
    slopes_a, slopes_b = alibi_slopes(4), alibi_slopes(4) * 3
    sinks_a, sinks_b = np.zeros(4, np.float32), np.full(4, 2.0, np.float32)
    variants: List[Dict[str, Any]] = [
        {},
        {"causal": False},
        {"window_left": 5},
        {"window_left": 6},
        {"logit_softcap": 2.0},
        {"logit_softcap": 3},
        {"alibi_slopes": slopes_a},
        {"alibi_slopes": slopes_b},
        {"sinks": sinks_a},
        {"sinks": sinks_b},
        {"causal": False, "window_left": 5, "sinks": sinks_b, "alibi_slopes": slopes_a},
    ]
    for _ in range(3):
        for options in variants:
            out, lse = cpu.decode(q, k, v, return_lse=True, **options)
            expect(out, lse, q, k, v, **options)
    # One plan per signature: other slope and sink arrays of the same shape share it, their pointers refreshed.
    assert len(cpu._plans) == len(variants) - 2
    slopes_a[:] = slopes_b  # the same array, new contents: read on every call
    out = cpu.decode(q, k, v, alibi_slopes=slopes_a)
    expect(out, None, q, k, v, alibi_slopes=slopes_b)


def test_workspace_and_plan_take_the_variants(cpu, rng) -> None:
    q, k, v = make(rng, 2, 16, 8, 2, 300, 64)
    options: Dict[str, Any] = dict(
        causal=False, window_left=40, logit_softcap=4.0, alibi_slopes=alibi_slopes(8), sinks=np.zeros(8, np.float32)
    )
    info = cpu.describe_plan(q, k, v, num_splits=2, **options)
    assert info.num_splits == 2 and info.workspace_bytes == cpu.workspace_size(q, k, v, num_splits=2, **options)
    cpu.reserve_workspace(info.workspace_bytes)
    out, lse = cpu.decode(q, k, v, num_splits=2, return_lse=True, **options)
    expect(out, lse, q, k, v, **options)


def test_largest_query_length(cpu, rng) -> None:
    q, k, v = make(rng, 1, 64, 2, 1, 100, 16)
    out, lse = cpu.decode(q, k, v, return_lse=True, window_left=10)
    expect(out, lse, q, k, v, window_left=10)


# ---- ragged query lengths (q_lens) ------------------------------------------------


def padded(q: np.ndarray, q_lens: np.ndarray) -> np.ndarray:
    """``q`` with every padding row (token t >= q_lens[b]) NaN (bfloat16 bits too): the library must
    never read them."""
    q = q.copy()
    nan = np.uint16(0x7FC0) if q.dtype == np.uint16 else np.nan
    for b, count in enumerate(q_lens):
        q[b, int(count) :] = nan
    return q


def expect_padding(out: np.ndarray, lse: np.ndarray, q_lens: np.ndarray, sinks: Optional[np.ndarray] = None) -> None:
    """Padding rows (NHD) are zeros with LSE -inf, or LSE sink[h] with sinks."""
    for b, count in enumerate(q_lens):
        np.testing.assert_array_equal(out[b, int(count) :], 0.0)
        if sinks is None:
            assert np.all(np.isneginf(lse[b, int(count) :]))
        else:
            np.testing.assert_allclose(
                lse[b, int(count) :], np.broadcast_to(sinks, lse[b, int(count) :].shape), atol=1e-6
            )


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("causal", [True, False])
def test_ragged_query_lengths(cpu, rng, causal, layout) -> None:
    """q_lens of 0, full and partial counts, one longer than its sequence (its first token sees no
    key under the causal mask), with ragged seq_lens; padding rows of q hold NaN and are never
    read; automatic, several and fixed-length splits agree with the reference."""
    q, k, v = make(rng, 6, 6, 8, 2, 70, 32)
    lens = np.array([70, 40, 3, 0, 70, 25], np.int32)
    q_lens = np.array([6, 0, 4, 2, 1, 3], np.int32)
    q = padded(q, q_lens)
    args = [x.transpose(0, 2, 1, 3) for x in (q, k, v)] if layout == "HND" else [q, k, v]
    for splits in ({}, {"num_splits": 5}, {"split_tokens": 16}):
        out, lse = cpu.decode(
            *args, seq_lens=lens, q_lens=q_lens, causal=causal, layout=layout, return_lse=True, **splits
        )
        assert out.shape == args[0].shape
        if layout == "HND":
            out, lse = out.transpose(0, 2, 1, 3), lse.transpose(0, 2, 1)
        assert np.all(np.isfinite(out))
        _, expected_lse = expect(out, lse, q, k, v, seq_lens=lens, q_lens=q_lens, causal=causal)
        expect_padding(out, lse, q_lens)
        if causal:  # sequence 2 (length 3, 4 tokens): token 0 at position -1 sees no key
            assert np.isneginf(expected_lse[2, 0]).all() and np.isfinite(expected_lse[2, 1:4]).all()


def test_ragged_query_lengths_are_each_sequence_alone(cpu, rng) -> None:
    """Sequence b's tokens are what decoding q[b, :q_lens[b]] alone gives: at positions
    L - q_lens[b] + i, not L - q_len + i."""
    q, k, v = make(rng, 4, 8, 4, 4, 50, 16)
    lens = np.array([50, 31, 8, 50], np.int32)
    q_lens = np.array([8, 5, 1, 3], np.int32)
    out, lse = cpu.decode(padded(q, q_lens), k, v, seq_lens=lens, q_lens=q_lens, return_lse=True)
    for b, (length, count) in enumerate(zip(lens, q_lens)):
        one, one_lse = cpu.decode(q[b : b + 1, :count], k[b : b + 1, :length], v[b : b + 1, :length], return_lse=True)
        np.testing.assert_allclose(out[b, :count], one[0], atol=1e-6, rtol=1e-6)
        np.testing.assert_allclose(lse[b, :count], one_lse[0], atol=1e-6, rtol=1e-6)
    # Without q_lens every sequence has all 8 tokens: another answer for the shorter ones.
    whole = cpu.decode(q, k, v, seq_lens=lens)
    assert not np.allclose(whole[1, :5], out[1, :5])


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_ragged_query_lengths_paged_with_every_variant(cpu, rng, dtype) -> None:
    """q_lens on a paged cache with ragged lengths, GQA, and every variant: padding rows get
    zeros and LSE sink[h]."""
    batch, q_len, heads, kv_heads, dim, page_size, max_pages = 4, 5, 8, 2, 64, 16, 4
    capacity = page_size * max_pages
    q, dense_k, dense_v = make(rng, batch, q_len, heads, kv_heads, capacity, dim, dtype)
    lens = np.array([capacity, 2, 0, 37], np.int32)
    q_lens = np.array([2, 5, 3, 0], np.int32)
    q = padded(q, q_lens)  # NaN bits in every storage type
    pool_k, pool_v, table = to_pages(rng, dense_k, dense_v, page_size, 2)
    sinks = np.linspace(-1.0, 1.0, heads).astype(np.float32)
    options: Dict[str, Any] = dict(
        seq_lens=lens, q_lens=q_lens, window_left=20, logit_softcap=8.0, alibi_slopes=alibi_slopes(heads), sinks=sinks
    )
    explicit = "bfloat16" if dtype == "bfloat16" else None
    for splits in ({}, {"num_splits": 3}):
        out, lse = cpu.decode(
            q, pool_k, pool_v, block_table=table, dtype=explicit, return_lse=True, **options, **splits
        )
        expect(out, lse, q, dense_k, dense_v, dtype, **options)
        expect_padding(as_float64(out, dtype), lse, q_lens, sinks)


def test_q_lens_as_a_list_plan_and_workspace(cpu, rng) -> None:
    """A list is accepted on the CPU backend (the same bits); the plan and the workspace follow
    q_len, the largest count, not q_lens' contents."""
    q, k, v = make(rng, 3, 4, 4, 2, 60, 32)
    q_lens = np.array([4, 1, 0], np.int32)
    out = cpu.decode(q, k, v, q_lens=q_lens)
    np.testing.assert_array_equal(cpu.decode(q, k, v, q_lens=q_lens.tolist()), out)
    expect(out, None, q, k, v, q_lens=q_lens)
    info = cpu.describe_plan(q, k, v, q_lens=q_lens, num_splits=3)
    assert info == cpu.describe_plan(q, k, v, num_splits=3)
    assert cpu.workspace_size(q, k, v, q_lens=[0, 0, 0], num_splits=3) == info.workspace_bytes


def test_flash_decode_takes_q_lens(rng) -> None:
    q, k, v = make(rng, 2, 4, 4, 2, 30, 16)
    q_lens = np.array([2, 4], np.int32)
    q = padded(q, q_lens)
    hnd = [np.ascontiguousarray(x.transpose(0, 2, 1, 3)) for x in (q, k, v)]
    out = flashdecode.flash_decode(*hnd, q_lens=q_lens, window_left=9)
    expect(out.transpose(0, 2, 1, 3), None, q, k, v, q_lens=q_lens, window_left=9)
