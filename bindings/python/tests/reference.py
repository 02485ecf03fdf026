# SPDX-License-Identifier: Apache-2.0
"""The float64 reference and bfloat16 helpers the tests compare against."""

from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple, Union

import numpy as np


def attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    scale: Optional[float] = None,
    seq_lens: Union[Sequence[int], np.ndarray, None] = None,
) -> Tuple[np.ndarray, np.ndarray]:
    """Decode attention in float64.

    q: ``[batch, heads, head_dim]``; k, v: ``[batch, kv_len, kv_heads, head_dim]``.
    Returns ``out [batch, heads, head_dim]`` and the natural-log
    ``lse [batch, heads]`` (-inf for an empty sequence).
    """
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    batch, heads, head_dim = q.shape
    group = heads // k.shape[2]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    out = np.zeros((batch, heads, head_dim))
    lse = np.full((batch, heads), -np.inf)
    for b in range(batch):
        length = k.shape[1] if seq_lens is None else int(seq_lens[b])
        if length == 0:
            continue
        keys = np.repeat(k[b, :length], group, axis=1)  # [length, heads, head_dim]
        values = np.repeat(v[b, :length], group, axis=1)
        scores = scale * np.einsum("hd,nhd->hn", q[b], keys)
        peak = scores.max(axis=1, keepdims=True)
        weights = np.exp(scores - peak)
        total = weights.sum(axis=1, keepdims=True)
        out[b] = np.einsum("hn,nhd->hd", weights / total, values)
        lse[b] = (peak + np.log(total))[:, 0]
    return out, lse


def variant_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    scale: Optional[float] = None,
    seq_lens: Union[Sequence[int], np.ndarray, None] = None,
    *,
    causal: bool = True,
    window_left: Optional[int] = None,
    logit_softcap: Optional[float] = None,
    alibi_slopes: Union[Sequence[float], np.ndarray, None] = None,
    sinks: Union[Sequence[float], np.ndarray, None] = None,
    q_lens: Union[Sequence[int], np.ndarray, None] = None,
) -> Tuple[np.ndarray, np.ndarray]:
    """Attention of several query tokens with the 0.3 variants, in float64, as
    ``flashdecode.h`` ("Attention variants") defines it, written from the
    definition rather than from the kernels.

    q: ``[batch, q_len, heads, head_dim]``; k, v: ``[batch, kv_len, kv_heads,
    head_dim]`` (NHD). Query token t of a sequence of length L sits at
    ``pos_q = L - q_len + t``; key j is seen if ``j < L`` and, when causal,
    ``j <= pos_q`` and, with a window W, ``pos_q - j < W``. A score is
    ``scale * q.k``, capped to ``c * tanh(s / c)``, plus ``slope[h] * (j -
    pos_q)``; ``exp(sink[h])`` joins the denominator. With ``q_lens``
    ("Ragged query lengths"), sequence b has ``n = q_lens[b]`` tokens: token
    t < n at ``pos_q = L - n + t``; tokens t >= n are padding, never read
    (they may hold NaN), and see no key. Returns ``out [batch, q_len, heads,
    head_dim]`` and the natural-log ``lse [batch, q_len, heads]``: zeros and
    -inf (or ``sink[h]``) for a token that sees no key.
    """
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    batch, q_len, heads, head_dim = q.shape
    group = heads // k.shape[2]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    slopes = None if alibi_slopes is None else np.asarray(alibi_slopes, dtype=np.float64)
    sink = None if sinks is None else np.asarray(sinks, dtype=np.float64)
    out = np.zeros((batch, q_len, heads, head_dim))
    lse = np.full((batch, q_len, heads), -np.inf)
    for b in range(batch):
        length = k.shape[1] if seq_lens is None else int(seq_lens[b])
        tokens = q_len if q_lens is None else int(q_lens[b])
        pos_q = length - tokens + np.arange(q_len)  # [q_len]; padding (t >= tokens) past the end
        pos_k = np.arange(length)  # [length]
        seen = np.ones((q_len, length), dtype=bool)
        seen &= (np.arange(q_len) < tokens)[:, None]  # padding sees no key
        if causal:
            seen &= pos_k[None, :] <= pos_q[:, None]
        if window_left is not None:
            seen &= pos_q[:, None] - pos_k[None, :] < window_left
        keys = np.repeat(k[b, :length], group, axis=1)  # [length, heads, head_dim]
        values = np.repeat(v[b, :length], group, axis=1)
        rows = np.where((np.arange(q_len) < tokens)[:, None, None], q[b], 0.0)  # padding is never read
        scores = scale * np.einsum("thd,nhd->thn", rows, keys)  # [q_len, heads, length]
        if logit_softcap is not None:
            scores = logit_softcap * np.tanh(scores / logit_softcap)
        if slopes is not None:
            scores = scores + slopes[None, :, None] * (pos_k[None, None, :] - pos_q[:, None, None])
        scores = np.where(seen[:, None, :], scores, -np.inf)
        peak = scores.max(axis=2) if length else np.full((q_len, heads), -np.inf)  # [q_len, heads]
        if sink is not None:
            peak = np.maximum(peak, sink[None, :])
        empty = np.isneginf(peak)  # no key seen, no sink
        peak = np.where(empty, 0.0, peak)
        weights = np.exp(scores - peak[:, :, None])  # exp(-inf) = 0 for unseen keys
        total = weights.sum(axis=2)
        if sink is not None:
            total = total + np.exp(sink[None, :] - peak)
        with np.errstate(divide="ignore", invalid="ignore"):
            out[b] = np.where(empty[:, :, None], 0.0, np.einsum("thn,nhd->thd", weights, values) / total[:, :, None])
            lse[b] = np.where(empty, -np.inf, peak + np.log(total))
    return out, lse


def alibi_slopes(heads: int) -> np.ndarray:
    """The ALiBi paper's slopes for ``heads`` heads (geometric, from 2^(-8/heads)), float32."""
    return (2.0 ** (-8.0 * (np.arange(heads) + 1) / heads)).astype(np.float32)


def to_pages(
    rng: np.random.Generator, dense_k: np.ndarray, dense_v: np.ndarray, page_size: int, spare_pages: int
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A dense cache ``[batch, max_pages * page_size, kv_heads, dim]`` scattered into a page pool of
    ``batch * max_pages + spare_pages`` pages (the spare ones zero) through a shuffled block table:
    ``(pool_k, pool_v, table)``."""
    batch, capacity = dense_k.shape[:2]
    max_pages = capacity // page_size
    num_pages = batch * max_pages + spare_pages
    table = rng.permutation(num_pages)[: batch * max_pages].reshape(batch, max_pages).astype(np.int32)
    pool_k = np.zeros((num_pages, page_size) + dense_k.shape[2:], dense_k.dtype)
    pool_v = np.zeros_like(pool_k)
    for b in range(batch):
        for j in range(max_pages):
            pool_k[table[b, j]] = dense_k[b, j * page_size : (j + 1) * page_size]
            pool_v[table[b, j]] = dense_v[b, j * page_size : (j + 1) * page_size]
    return pool_k, pool_v, table


def to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits (uint16), rounding to nearest even."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def from_bf16_bits(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bits (uint16) -> float32."""
    return (np.asarray(bits, dtype=np.uint32) << 16).view(np.float32)


def as_float64(values: np.ndarray, dtype: str) -> np.ndarray:
    """What the library reads from an input array, in float64."""
    if dtype == "bfloat16":
        return from_bf16_bits(values).astype(np.float64)
    return np.asarray(values, dtype=np.float64)


def random_inputs(rng: np.random.Generator, shape: Tuple[int, ...], dtype: str) -> np.ndarray:
    """Standard-normal values stored as ``dtype`` (bfloat16 as uint16 bits)."""
    values = rng.standard_normal(shape).astype(np.float32)
    if dtype == "bfloat16":
        return to_bf16_bits(values)
    return values.astype(dtype)


# ---- 8-bit caches (since 0.3) -------------------------------------------------------


def _fp8_table(exponent_bits: int, mantissa_bits: int, ieee_specials: bool) -> np.ndarray:
    """The float64 value of every byte of an OCP fp8 format (NaN for its NaNs, +-inf for E5M2's infinities)."""
    bias = (1 << (exponent_bits - 1)) - 1
    table = np.empty(256, np.float64)
    for byte in range(256):
        sign = -1.0 if byte & 0x80 else 1.0
        exponent = (byte >> mantissa_bits) & ((1 << exponent_bits) - 1)
        mantissa = byte & ((1 << mantissa_bits) - 1)
        top = (1 << exponent_bits) - 1
        if ieee_specials and exponent == top:
            value = math.inf if mantissa == 0 else math.nan
        elif not ieee_specials and exponent == top and mantissa == (1 << mantissa_bits) - 1:
            value = math.nan  # E4M3: S.1111.111 only; no infinities
        elif exponent == 0:
            value = mantissa / (1 << mantissa_bits) * 2.0 ** (1 - bias)
        else:
            value = (1 + mantissa / (1 << mantissa_bits)) * 2.0 ** (exponent - bias)
        table[byte] = sign * value
    return table


FP8_VALUES = {"float8_e4m3fn": _fp8_table(4, 3, False), "float8_e5m2": _fp8_table(5, 2, True)}
"""float64 value of each byte: E4M3 (OCP, ``float8_e4m3fn``) and E5M2."""
FP8_MAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}


def dequantize(stored: np.ndarray, dtype: str) -> np.ndarray:
    """What the library reads from an 8-bit cache (uint8 bits for fp8, int8 for int8), in float64."""
    if dtype == "int8":
        return np.asarray(stored, dtype=np.int8).astype(np.float64)
    return FP8_VALUES[dtype][np.asarray(stored).view(np.uint8)]


def quantize(x: np.ndarray, dtype: str) -> np.ndarray:
    """The append rounding, for float32 ``x`` (= new / scale in float32): fp8 to nearest even,
    saturating to the largest finite value, NaN stays NaN (returned as uint8 bits); int8 to nearest
    even, clamped to [-127, 127], NaN to 0 (returned as int8)."""
    x = np.asarray(x, dtype=np.float32).astype(np.float64)
    if dtype == "int8":
        with np.errstate(invalid="ignore"):
            rounded = np.clip(np.rint(np.nan_to_num(x, nan=0.0, posinf=127.0, neginf=-127.0)), -127, 127)
        return rounded.astype(np.int8)
    table = FP8_VALUES[dtype]
    codes = np.arange(128)  # non-negative codes, ascending in value up to the largest finite one
    finite = codes[np.isfinite(table[:128])]
    values = table[finite]
    magnitude = np.minimum(np.abs(np.nan_to_num(x, nan=0.0)), FP8_MAX[dtype])
    upper = np.clip(np.searchsorted(values, magnitude), 0, len(values) - 1)
    lower = np.clip(upper - 1, 0, len(values) - 1)
    below, above = magnitude - values[lower], values[upper] - magnitude
    pick_upper = (above < below) | ((above == below) & (finite[upper] % 2 == 0))
    pick_upper |= values[lower] > magnitude
    code = np.where(pick_upper, finite[upper], finite[lower]).astype(np.uint8)
    code |= np.where(np.signbit(x), 0x80, 0).astype(np.uint8)
    return np.where(np.isnan(x), np.uint8(0x7F), code).astype(np.uint8)
