# SPDX-License-Identifier: Apache-2.0
"""8-bit K/V caches (since 0.3): fp8 E4M3 and E5M2 and int8 caches with their
scales, decoded against a float64 reference over the dequantized values
(stored value * scale), and Handle.append_kv's rounding against the header's
rules (x = new / scale in float32; fp8 to nearest even, saturating, NaN stays
NaN; int8 to nearest even, clamped to [-127, 127], NaN to 0).

How the arrays reach the library is checked by the library's own validation
(which every build has); the numerics need the CPU backend's 8-bit decode and
fd_append_kv: while a library's CPU backend still says it lacks them (the
exact refusals it gives then), those tests are skipped with that reason."""

from __future__ import annotations

from typing import Any, Tuple

import numpy as np
import pytest

import flashdecode
from reference import FP8_VALUES, attention, dequantize, from_bf16_bits, quantize, to_bf16_bits

CACHE_DTYPES = ("float8_e4m3fn", "float8_e5m2", "int8")
Q_DTYPES = ("float32", "float16", "bfloat16")
SCALE_MODES = ("none", "tensor", "head", "token")
TOLERANCE = {"float32": 2e-5, "float16": 2e-3, "bfloat16": 1.6e-2}
BATCH, KV_LEN, KV_HEADS, HEADS, HEAD_DIM = 3, 70, 2, 8, 64


# ---- inputs ----------------------------------------------------------------------------


def scales_for(rng: np.random.Generator, mode: str, shape: Tuple[int, int, int]) -> Tuple[Any, np.ndarray]:
    """(the argument, the scale of every [batch, kv_len, kv_heads] position) for a scale mode."""
    if mode == "none":
        return None, np.ones(shape)
    if mode == "tensor":
        value = np.array(0.03, np.float32)
        return value, np.broadcast_to(value.astype(np.float64), shape)
    if mode == "head":
        per_head = rng.uniform(0.01, 0.05, shape[2]).astype(np.float32)
        return per_head, np.broadcast_to(per_head.astype(np.float64), shape)
    full = rng.uniform(0.01, 0.05, shape).astype(np.float32)
    return full, full.astype(np.float64)


def stored_cache(rng: np.random.Generator, dtype: str, shape: Tuple[int, ...], scale: np.ndarray) -> np.ndarray:
    """An 8-bit cache whose dequantized values are about standard normal: uint8 bits for fp8, int8 for int8."""
    values = rng.standard_normal(shape).astype(np.float32)
    if scale is not None:
        values = (values / scale[..., None]).astype(np.float32)
    elif dtype == "int8":
        values *= 10  # unscaled int8: small integers
    return quantize(values, dtype)


def as_form(stored: np.ndarray, dtype: str, form: str) -> Any:
    """The cache as a test passes it: ``"bits"`` (uint8 storage, dtype= names it) or ``"typed"``
    (int8, or ml_dtypes' float8 types)."""
    if form == "bits":
        return stored.view(np.uint8)
    if dtype == "int8":
        return stored.view(np.int8)
    ml_dtypes = pytest.importorskip("ml_dtypes")
    return stored.view(np.uint8).view(getattr(ml_dtypes, dtype))


def query(rng: np.random.Generator, dtype: str, form: str, shape: Tuple[int, ...]) -> np.ndarray:
    values = rng.standard_normal(shape).astype(np.float32)
    if dtype == "bfloat16":
        bits = to_bf16_bits(values)
        if form == "typed":
            ml_dtypes = pytest.importorskip("ml_dtypes")
            return bits.view(ml_dtypes.bfloat16)
        return bits
    return values.astype(dtype)


def dtype_argument(q_dtype: str, cache_dtype: str, form: str) -> Any:
    """What names raw storage: the 8-bit type of uint8 bits, and bfloat16 for uint16 bits."""
    if form == "typed":
        return None
    return ("bfloat16", cache_dtype) if q_dtype == "bfloat16" else cache_dtype


def query_float64(q: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return from_bf16_bits(q.view(np.uint16)).astype(np.float64)
    return q.astype(np.float64)


# ---- decode ----------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["bits", "typed"])
@pytest.mark.parametrize("scale_mode", SCALE_MODES)
@pytest.mark.parametrize("q_dtype", Q_DTYPES)
@pytest.mark.parametrize("cache_dtype", CACHE_DTYPES)
def test_decode_matches_dequantized_reference(cpu, rng, cache_dtype, q_dtype, scale_mode, form) -> None:
    shape = (BATCH, KV_LEN, KV_HEADS)
    k_scale, k_scales = scales_for(rng, scale_mode, shape)
    v_scale, v_scales = scales_for(rng, scale_mode, shape)
    k_stored = stored_cache(rng, cache_dtype, shape + (HEAD_DIM,), None if k_scale is None else k_scales)
    v_stored = stored_cache(rng, cache_dtype, shape + (HEAD_DIM,), None if v_scale is None else v_scales)
    q = query(rng, q_dtype, form, (BATCH, 1, HEADS, HEAD_DIM))
    lens = np.array([KV_LEN, 33, 1], np.int32)

    out, lse = cpu.decode(
        q,
        as_form(k_stored, cache_dtype, form),
        as_form(v_stored, cache_dtype, form),
        seq_lens=lens,
        k_scale=k_scale,
        v_scale=v_scale,
        dtype=dtype_argument(q_dtype, cache_dtype, form),
        return_lse=True,
    )

    k64 = dequantize(k_stored, cache_dtype) * k_scales[..., None]
    v64 = dequantize(v_stored, cache_dtype) * v_scales[..., None]
    expected, expected_lse = attention(query_float64(q, q_dtype)[:, 0], k64, v64, seq_lens=lens)
    assert out.shape == q.shape and out.dtype == q.dtype
    got = query_float64(out, q_dtype)[:, 0]
    np.testing.assert_allclose(got, expected, atol=TOLERANCE[q_dtype], rtol=TOLERANCE[q_dtype])
    np.testing.assert_allclose(lse[:, 0], expected_lse, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cache_dtype", CACHE_DTYPES)
def test_hnd_paged_cache_with_per_token_scales(cpu, rng, cache_dtype) -> None:
    """A page pool in HND order ([pages, kv_heads, page_size, head_dim]) whose per-token scales are
    [pages, kv_heads, page_size]: the binding orders both as the layout says."""
    pages, page_size = 7, 16
    nhd_scales = rng.uniform(0.01, 0.05, (pages, page_size, KV_HEADS)).astype(np.float32)
    k_stored = stored_cache(rng, cache_dtype, (pages, page_size, KV_HEADS, HEAD_DIM), nhd_scales.astype(np.float64))
    v_stored = stored_cache(rng, cache_dtype, (pages, page_size, KV_HEADS, HEAD_DIM), nhd_scales.astype(np.float64))
    table = np.array([[3, 0, 5], [6, 1, 2]], np.int32)
    lens = np.array([40, 21], np.int32)
    q = rng.standard_normal((2, HEADS, 1, HEAD_DIM)).astype(np.float32)

    hnd = lambda array: np.ascontiguousarray(array.swapaxes(1, 2))  # noqa: E731
    out = cpu.decode(
        q,
        as_form(hnd(k_stored), cache_dtype, "bits"),
        as_form(hnd(v_stored), cache_dtype, "bits"),
        seq_lens=lens,
        block_table=table,
        k_scale=np.ascontiguousarray(nhd_scales.swapaxes(1, 2)),
        v_scale=np.ascontiguousarray(nhd_scales.swapaxes(1, 2)),
        layout="HND",
        dtype=cache_dtype,
    )

    k64 = dequantize(k_stored, cache_dtype) * nhd_scales[..., None]
    v64 = dequantize(v_stored, cache_dtype) * nhd_scales[..., None]
    dense_k = k64[table].reshape(2, -1, KV_HEADS, HEAD_DIM)
    dense_v = v64[table].reshape(2, -1, KV_HEADS, HEAD_DIM)
    expected, _ = attention(q[:, :, 0], dense_k, dense_v, seq_lens=lens)
    np.testing.assert_allclose(out[:, :, 0], expected, atol=2e-5, rtol=2e-5)


def test_scales_are_read_per_call_on_the_fast_path(cpu, rng) -> None:
    """The same signature with other scale arrays (and values changed in place) gives their results."""
    stored = stored_cache(rng, "int8", (1, 20, 1, 32), np.full((1, 20, 1), 0.02))
    q = rng.standard_normal((1, 1, 2, 32)).astype(np.float32)
    scale_a, scale_b = np.array([0.02], np.float32), np.array([0.04], np.float32)
    first = cpu.decode(q, stored, stored, k_scale=scale_a, v_scale=scale_a)
    second = cpu.decode(q, stored, stored, k_scale=scale_b, v_scale=scale_b)
    base = dequantize(stored, "int8")
    for out, factor in ((first, 0.02), (second, 0.04)):
        expected, _ = attention(q[:, 0], base * factor, base * factor)
        np.testing.assert_allclose(out[:, 0], expected, atol=2e-5, rtol=2e-5)
    scale_a[0] = 0.04
    again = cpu.decode(q, stored, stored, k_scale=scale_a, v_scale=scale_a)
    np.testing.assert_array_equal(again, second)


def test_flash_decode_takes_scales(rng) -> None:
    stored = stored_cache(rng, "float8_e4m3fn", (2, 30, 2, 64), None)
    q = rng.standard_normal((2, 4, 1, 64)).astype(np.float32)
    hnd = np.ascontiguousarray(stored.swapaxes(1, 2))
    out = flashdecode.flash_decode(q, hnd, hnd, k_scale=0.5, v_scale=[0.25, 2.0], dtype="float8_e4m3fn")
    base = dequantize(stored, "float8_e4m3fn")
    expected, _ = attention(q[:, :, 0], base * 0.5, base * np.array([0.25, 2.0])[:, None])
    np.testing.assert_allclose(out[:, :, 0], expected, atol=2e-5, rtol=2e-5)


# ---- append_kv ---------------------------------------------------------------------------


def expected_append(cache: np.ndarray, new: np.ndarray, lens: np.ndarray, scales: np.ndarray, dtype: str) -> np.ndarray:
    """The cache after fd_append_kv's rules (dense cache), for an 8-bit dtype."""
    result = cache.copy()
    new_len = new.shape[1]
    for b in range(new.shape[0]):
        for i in range(new_len):
            position = int(lens[b]) - new_len + i
            if position < 0:
                continue
            x = (new[b, i].astype(np.float32) / scales[b, position][:, None].astype(np.float32)).astype(np.float32)
            result[b, position] = quantize(x, dtype).view(result.dtype)
    return result


def same_values(got: np.ndarray, expected: np.ndarray, dtype: str) -> None:
    """Equal dequantized values: every code but the two zeros and the NaNs is its own value."""
    np.testing.assert_array_equal(dequantize(got, dtype), dequantize(expected, dtype))


@pytest.mark.parametrize("scale_mode", SCALE_MODES)
@pytest.mark.parametrize("cache_dtype", CACHE_DTYPES)
def test_append_rounds_as_the_header_says(cpu, rng, cache_dtype, scale_mode) -> None:
    shape = (BATCH, 12, KV_HEADS)
    k_scale, k_scales = scales_for(rng, scale_mode, shape)
    v_scale, v_scales = scales_for(rng, scale_mode, shape)
    storage = np.int8 if cache_dtype == "int8" else np.uint8
    sentinel = 0x11
    k = np.full(shape + (HEAD_DIM,), sentinel, storage)
    v = np.full(shape + (HEAD_DIM,), sentinel, storage)
    new_len = 3
    # Values over the whole range, halfway points, beyond the largest finite value, and NaN.
    k_new = (rng.standard_normal((BATCH, new_len, KV_HEADS, HEAD_DIM)) * 3).astype(np.float32)
    v_new = (rng.standard_normal((BATCH, new_len, KV_HEADS, HEAD_DIM)) * 300).astype(np.float32)
    k_new[0, 0, 0, :4] = [np.nan, 1e30, -1e30, 0.0]
    if cache_dtype != "int8":
        top = FP8_VALUES[cache_dtype][0x7E if cache_dtype == "float8_e4m3fn" else 0x7B]
        v_new[1, 1, 1, :3] = [top * 1.01, -top * 3, np.inf]
    lens = np.array([12, 5, 2], np.int32)  # the last sequence: one new token falls before position 0

    cpu.append_kv(k_new, v_new, k, v, seq_lens=lens, k_scale=k_scale, v_scale=v_scale, dtype=cache_dtype)

    same_values(k, expected_append(np.full_like(k, sentinel), k_new, lens, k_scales, cache_dtype), cache_dtype)
    same_values(v, expected_append(np.full_like(v, sentinel), v_new, lens, v_scales, cache_dtype), cache_dtype)
    assert np.isnan(dequantize(k, cache_dtype)[0, 9, 0, 0]) or cache_dtype == "int8"


@pytest.mark.parametrize("cache_dtype", ["float32", "float16", "bfloat16"])
def test_append_to_a_wide_cache_rounds_to_nearest_even(cpu, rng, cache_dtype) -> None:
    k_new = rng.standard_normal((2, 2, 2, 32)).astype(np.float32)
    lens = np.array([4, 2], np.int32)
    if cache_dtype == "bfloat16":
        k = np.zeros((2, 4, 2, 32), np.uint16)
        expected_new = to_bf16_bits(k_new)
    else:
        k = np.zeros((2, 4, 2, 32), cache_dtype)
        expected_new = k_new.astype(cache_dtype)
    v = k.copy()
    cpu.append_kv(k_new, k_new, k, v, seq_lens=lens, dtype="bfloat16" if cache_dtype == "bfloat16" else None)
    np.testing.assert_array_equal(k[0, 2:], expected_new[0])
    np.testing.assert_array_equal(k[1, :2], expected_new[1])
    np.testing.assert_array_equal(k[0, :2], 0)
    np.testing.assert_array_equal(k[1, 2:], 0)
    np.testing.assert_array_equal(v, k)


def test_append_then_decode_on_a_paged_cache(cpu, rng) -> None:
    """An engine's step: append this step's token (its position's per-token scale written first),
    then decode with the same lengths; the pool's other pages are untouched."""
    pages, page_size = 6, 8
    k = np.zeros((pages, page_size, KV_HEADS, HEAD_DIM), np.uint8)
    v = np.zeros_like(k)
    scales = np.ones((pages, page_size, KV_HEADS), np.float32)
    table = np.array([[4, 1], [0, 5]], np.int32)
    lens = np.array([11, 3], np.int32)
    for step in range(3):
        new_k = rng.standard_normal((2, 1, KV_HEADS, HEAD_DIM)).astype(np.float16)
        new_v = rng.standard_normal((2, 1, KV_HEADS, HEAD_DIM)).astype(np.float16)
        for b in range(2):
            position = lens[b] - 1
            page, slot = table[b, position // page_size], position % page_size
            scales[page, slot] = np.abs(new_k[b, 0]).astype(np.float32).max(axis=-1) / 448
        cpu.append_kv(new_k, new_v, k, v, seq_lens=lens, block_table=table, k_scale=scales, v_scale=0.01, dtype="e4m3")
        lens = lens + 1
    q = rng.standard_normal((2, 1, HEADS, HEAD_DIM)).astype(np.float16)
    lens = lens - 1
    out = cpu.decode(q, k, v, seq_lens=lens, block_table=table, k_scale=scales, v_scale=0.01, dtype="e4m3")
    k64 = dequantize(k, "float8_e4m3fn") * scales[..., None]
    v64 = dequantize(v, "float8_e4m3fn") * 0.01
    expected, _ = attention(
        q.astype(np.float64)[:, 0],
        k64[table].reshape(2, -1, KV_HEADS, HEAD_DIM),
        v64[table].reshape(2, -1, KV_HEADS, HEAD_DIM),
        seq_lens=lens,
    )
    np.testing.assert_allclose(out.astype(np.float64)[:, 0], expected, atol=2e-3, rtol=2e-3)
    for page in (2, 3):
        assert not k[page].any() and not v[page].any()


def test_module_append_kv_uses_the_thread_handle(rng) -> None:
    k = np.zeros((1, 2, 1, 16), np.int8)
    v = k.copy()
    new = np.full((1, 1, 1, 16), 2.6, np.float32)
    flashdecode.append_kv(new, new, k, v, seq_lens=np.array([2], np.int32), k_scale=0.5, v_scale=2.0)
    assert (k[0, 1] == 5).all() and (v[0, 1] == 1).all() and not k[0, 0].any()


# ---- what the binding and the library refuse -----------------------------------------------


def small(rng: np.random.Generator, cache: str = "int8") -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    q = rng.standard_normal((2, 1, 4, 32)).astype(np.float32)
    k = np.zeros((2, 10, 2, 32), np.int8 if cache == "int8" else np.float16)
    return q, k, k.copy()


def test_scales_on_a_wide_cache_are_refused_by_name(cpu, rng) -> None:
    q, k, v = small(rng, "float16")
    q = q.astype(np.float16)
    out = np.full(q.shape, 7, np.float16)
    with pytest.raises(flashdecode.InvalidDTypeError, match="k_scale"):
        cpu.decode(q, k, v, out=out, k_scale=0.5)
    with pytest.raises(flashdecode.InvalidDTypeError, match="v_scale"):
        cpu.decode(q, k, v, out=out, v_scale=np.ones(2, np.float32))
    np.testing.assert_array_equal(out, 7)


@pytest.mark.parametrize(
    "scale, needle",
    [
        (np.ones(3, np.float32), "k_scale: kv_heads must be 2"),  # per head, wrong count
        (np.ones((2, 9, 2), np.float32), "k_scale"),  # per token, wrong kv_len
        (np.ones((2, 10, 3), np.float32), "k_scale"),
    ],
)
def test_scale_shapes_the_library_refuses(cpu, rng, scale, needle) -> None:
    q, k, v = small(rng)
    with pytest.raises(flashdecode.InvalidShapeError, match=needle):
        cpu.decode(q, k, v, k_scale=scale)


def test_scale_forms_the_binding_refuses(cpu, rng) -> None:
    q, k, v = small(rng)
    with pytest.raises(flashdecode.InvalidShapeError, match=r"k_scale: expected one scale \(size 1\), \[kv_heads\]"):
        cpu.decode(q, k, v, k_scale=np.ones((2, 10), np.float32))
    with pytest.raises(flashdecode.InvalidDTypeError, match="v_scale: dtype float64 is not supported"):
        cpu.decode(q, k, v, v_scale=np.ones(2))
    with pytest.raises(flashdecode.InvalidShapeError, match="k_scale"):
        cpu.append_kv(q[:, :, :2], q[:, :, :2], k, v, k_scale=np.ones(5, np.float32))


def test_scales_of_every_mode_pass_validation(cpu, rng) -> None:
    """The strides the binding builds for each form are the header's (the size query validates
    them as decode does, without the backend)."""
    q, k, v = small(rng)
    plain = cpu.workspace_size(q, k, v)
    for scale in (0.5, np.float32(2), np.array(0.5, np.float32), np.ones((1, 1, 1), np.float32), [1.0, 2.0],
                  np.ones(2, np.float32), np.ones((2, 10, 2), np.float32)[:, :, ::1],
                  np.ones((2, 10, 4), np.float32)[:, :, ::2]):  # fmt: skip
        assert cpu.workspace_size(q, k, v, k_scale=scale, v_scale=scale) == plain
    hnd = np.ascontiguousarray(k.swapaxes(1, 2))
    assert cpu.workspace_size(
        q.swapaxes(1, 2), hnd, hnd, layout="HND", k_scale=np.ones((2, 2, 10), np.float32)
    ) == cpu.workspace_size(q.swapaxes(1, 2), hnd, hnd, layout="HND")


def test_raw_storage_needs_its_type_named(cpu, rng) -> None:
    q, k, _ = small(rng)
    bits = k.view(np.uint8)
    with pytest.raises(flashdecode.InvalidDTypeError, match=r"k: 8-bit integer storage \(uint8\) needs dtype="):
        cpu.workspace_size(q, bits, bits)
    assert cpu.workspace_size(q, bits, bits, dtype="float8_e5m2") == cpu.workspace_size(q, k, k)
    with pytest.raises(flashdecode.InvalidDTypeError, match="k: holds i8, but dtype=e4m3 was given"):
        cpu.workspace_size(q, k, k, dtype="float8_e4m3fn")
    with pytest.raises(flashdecode.InvalidDTypeError, match="dtype: names two 8-bit types"):
        cpu.workspace_size(q, bits, bits, dtype=("e4m3", "e5m2"))
    with pytest.raises(flashdecode.InvalidDTypeError, match="q: dtype int8 is not supported|q: dtype must be"):
        cpu.workspace_size(k[:, :1], k, k)
    with pytest.raises(flashdecode.InvalidDTypeError, match="q: dtype uint8 is not supported"):
        cpu.workspace_size(bits[:, :1, :, :], bits, bits, dtype="e4m3")
    # An 8-bit name over a typed 16- or 32-bit cache is a contradiction, not ignored.
    for wide in (k.astype(np.float32), k.astype(np.float16)):
        names = ("float8_e4m3fn", "float8_e5m2", "int8") + ((("float16", "e4m3"),) if wide.dtype == np.float16 else ())
        for name in names:
            with pytest.raises(flashdecode.InvalidDTypeError, match="k: holds f(32|16), but dtype=.* names an 8-bit"):
                cpu.workspace_size(wide[:, :1], wide, wide, dtype=name)
    new, cache = q[:, :, :2].astype(np.float32), np.full((2, 10, 2, 32), 9.0, np.float32)
    with pytest.raises(flashdecode.InvalidDTypeError, match="k: holds f32, but dtype=e4m3 names an 8-bit cache"):
        cpu.append_kv(new, new, cache, cache.copy(), seq_lens=np.array([3, 4], np.int32), dtype="float8_e4m3fn")
    assert (cache == 9).all()


def test_other_fp8_formats_are_refused(cpu, rng) -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    q, k, _ = small(rng)
    for other in ("float8_e4m3", "float8_e4m3fnuz", "float8_e5m2fnuz"):
        if hasattr(ml_dtypes, other):
            cache = k.view(getattr(ml_dtypes, other))
            with pytest.raises(flashdecode.InvalidDTypeError, match=f"k: dtype {other} is not supported"):
                cpu.workspace_size(q, cache, cache)


def test_append_errors_name_the_argument_and_write_nothing(cpu, rng) -> None:
    q, k, v = small(rng)
    k[:] = 9
    new = q[:, :, :2]
    with pytest.raises(flashdecode.InvalidShapeError, match="v_new"):
        cpu.append_kv(new, new[:, :, :1], k, v)
    with pytest.raises(flashdecode.InvalidArgumentError, match="k: the array is read-only"):
        frozen = k.copy()
        frozen.flags.writeable = False
        cpu.append_kv(new, new, frozen, v)
    with pytest.raises(flashdecode.InvalidDTypeError, match="k_scale"):
        wide = np.zeros((2, 10, 2, 32), np.float16)
        cpu.append_kv(new, new, wide, wide.copy(), k_scale=0.5)
    assert (k == 9).all()


# ---- PyTorch tensors ---------------------------------------------------------------------


@pytest.mark.parametrize("cache_dtype", CACHE_DTYPES)
def test_torch_tensors_of_every_cache_dtype(cpu, rng, cache_dtype) -> None:
    torch = pytest.importorskip("torch")
    q, k, _ = small(rng)
    typed = {"int8": torch.int8, "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}
    cache = torch.from_numpy(k.view(np.uint8))
    plain = cpu.workspace_size(q, k, k)
    # Typed tensors say their type; uint8 storage takes it from dtype=; 0-d and [kv_heads] scales.
    assert cpu.workspace_size(torch.from_numpy(q), cache.view(typed[cache_dtype]), cache.view(typed[cache_dtype]),
                              k_scale=torch.tensor(0.5), v_scale=torch.ones(2)) == plain  # fmt: skip
    assert cpu.workspace_size(torch.from_numpy(q), cache, cache, dtype=cache_dtype) == plain
    with pytest.raises(flashdecode.InvalidDTypeError, match=r"k: 8-bit integer storage \(uint8\)"):
        cpu.workspace_size(torch.from_numpy(q), cache, cache)
    with pytest.raises(flashdecode.InvalidDTypeError, match="k_scale: dtype torch.float64 is not supported"):
        cpu.workspace_size(
            torch.from_numpy(q), cache, cache, dtype=cache_dtype, k_scale=torch.ones(2, dtype=torch.float64)
        )


def test_torch_decode_append_and_the_op(cpu, rng) -> None:
    torch = pytest.importorskip("torch")
    stored = stored_cache(rng, "float8_e5m2", (2, 24, 2, 32), None)
    k = torch.from_numpy(stored.view(np.uint8)).view(torch.float8_e5m2)
    q = torch.from_numpy(rng.standard_normal((2, 1, 4, 32)).astype(np.float32)).to(torch.bfloat16)
    scale = torch.tensor([0.5, 2.0])
    out = cpu.decode(q, k, k, k_scale=scale, v_scale=scale)
    op_out, op_lse = flashdecode.torch_op()(q, k, k, k_scale=scale, v_scale=scale)
    base = dequantize(stored, "float8_e5m2") * np.array([0.5, 2.0])[:, None]
    expected, expected_lse = attention(q.float().numpy().astype(np.float64)[:, 0], base, base)
    np.testing.assert_allclose(out.float().numpy()[:, 0], expected, atol=1.6e-2, rtol=1.6e-2)
    torch.testing.assert_close(op_out, out)
    np.testing.assert_allclose(op_lse.numpy()[:, 0], expected_lse, rtol=1e-4, atol=1e-4)


def test_torch_compile_passes_scales_to_the_op(rng) -> None:
    torch = pytest.importorskip("torch")
    stored = stored_cache(rng, "int8", (1, 16, 1, 32), np.full((1, 16, 1), 0.05))
    k = torch.from_numpy(stored)
    q = torch.from_numpy(rng.standard_normal((1, 1, 2, 32)).astype(np.float32))

    @torch.compile(backend="eager", fullgraph=True)
    def step(q: Any, k: Any, scale: Any) -> Any:
        return flashdecode.flash_decode(q, k, k, layout="NHD", k_scale=scale, v_scale=scale)

    out = step(q, k, torch.tensor(0.05))
    base = dequantize(stored, "int8") * 0.05
    expected, _ = attention(q.numpy()[:, 0], base, base)
    np.testing.assert_allclose(out.numpy()[:, 0], expected, atol=2e-5, rtol=2e-5)


def test_torch_append(rng) -> None:
    torch = pytest.importorskip("torch")
    k = torch.zeros((1, 3, 2, 16), dtype=torch.float8_e4m3fn)
    v = torch.zeros((1, 3, 2, 16), dtype=torch.int8)
    new = torch.full((1, 1, 2, 16), 1000.0)
    flashdecode.append_kv(new, new, k, k.clone(), seq_lens=torch.tensor([2], dtype=torch.int32))
    assert (k[0, 1].float() == 448).all() and (k[0, 0].float() == 0).all()
    flashdecode.append_kv(new, new, v.clone(), v, v_scale=torch.tensor([4.0, 10.0]))
    assert (v[0, 2, 0] == 127).all() and (v[0, 2, 1] == 100).all()
