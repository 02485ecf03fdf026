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
