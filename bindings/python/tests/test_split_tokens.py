# SPDX-License-Identifier: Apache-2.0
"""split_tokens (since 0.3): a fixed split length makes a sequence's result
bitwise the same whether it runs alone or in any batch, on the CPU backend
whatever the batch, its capacity, seq_lens or the thread count."""

from __future__ import annotations

from typing import Any, Tuple

import numpy as np
import pytest

import flashdecode
from reference import attention

LENGTHS = (300, 1, 0, 129, 64, 257)


def batch_problem(rng: np.random.Generator, dtype: Any, capacity: int) -> Tuple[np.ndarray, ...]:
    """q ``[batch, 1, 8, 64]`` and a dense NHD cache of ``capacity`` tokens over 2 KV heads."""
    batch = len(LENGTHS)
    q = rng.standard_normal((batch, 1, 8, 64)).astype(dtype)
    k = rng.standard_normal((batch, capacity, 2, 64)).astype(dtype)
    v = rng.standard_normal((batch, capacity, 2, 64)).astype(dtype)
    return q, k, v


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("split_tokens", [16, 100])
def test_a_sequence_alone_matches_the_batch(rng, dtype, split_tokens) -> None:
    q, k, v = batch_problem(rng, dtype, 300)
    lens = np.array(LENGTHS, np.int32)
    with flashdecode.Handle("cpu", num_threads=2) as two, flashdecode.Handle("cpu", num_threads=1) as one:
        out, lse = two.decode(q, k, v, seq_lens=lens, split_tokens=split_tokens, return_lse=True)
        expected, expected_lse = attention(q[:, 0], k, v, seq_lens=LENGTHS)
        tolerance = 2e-5 if dtype == np.float32 else 2e-3
        np.testing.assert_allclose(out[:, 0].astype(np.float64), expected, atol=tolerance, rtol=tolerance)
        np.testing.assert_allclose(lse[:, 0], expected_lse, atol=1e-4, rtol=1e-4)
        for b, length in enumerate(LENGTHS):
            # Alone: a batch of one, its cache cut to its own length, no seq_lens, another thread count.
            alone, alone_lse = one.decode(
                q[b : b + 1], k[b : b + 1, :length], v[b : b + 1, :length], split_tokens=split_tokens, return_lse=True
            )
            np.testing.assert_array_equal(alone[0], out[b], err_msg=f"sequence {b} alone")
            np.testing.assert_array_equal(alone_lse[0], lse[b], err_msg=f"lse of sequence {b} alone")
        # In another batch: reversed, with a larger capacity and other neighbours.
        bigger = [np.concatenate([x[::-1], np.zeros_like(x[:, :100])], axis=1) for x in (k, v)]
        others = np.concatenate([q[::-1], np.ones_like(q[:2])])
        k2, v2 = (np.concatenate([x, np.ones_like(x[:2])]) for x in bigger)
        lens2 = np.concatenate([lens[::-1], np.array([400, 7], np.int32)])
        out2, lse2 = two.decode(others, k2, v2, seq_lens=lens2, split_tokens=split_tokens, return_lse=True)
        np.testing.assert_array_equal(out2[: len(LENGTHS)][::-1], out)
        np.testing.assert_array_equal(lse2[: len(LENGTHS)][::-1], lse)


def test_paged_cache_alone_matches_the_batch(rng) -> None:
    page = 16
    q, k, v = batch_problem(rng, np.float32, 320)
    pages_per_sequence = 320 // page
    pool_k = k.reshape(-1, page, 2, 64)
    pool_v = v.reshape(-1, page, 2, 64)
    table = rng.permutation(len(pool_k)).astype(np.int32)
    pool_k, pool_v = pool_k[np.argsort(table)], pool_v[np.argsort(table)]
    table = table.reshape(len(LENGTHS), pages_per_sequence)
    lens = np.array(LENGTHS, np.int32)
    with flashdecode.Handle("cpu", num_threads=2) as handle:
        out = handle.decode(q, pool_k, pool_v, block_table=table, seq_lens=lens, split_tokens=48)
        expected, _ = attention(q[:, 0], k, v, seq_lens=LENGTHS)
        np.testing.assert_allclose(out[:, 0], expected, atol=2e-5, rtol=2e-5)
        for b, length in enumerate(LENGTHS):
            used = -(-length // page)
            alone = handle.decode(
                q[b : b + 1],
                pool_k,
                pool_v,
                block_table=table[b : b + 1, : max(used, 1)],
                seq_lens=np.array([length], np.int32),
                split_tokens=48,
            )
            np.testing.assert_array_equal(alone[0], out[b], err_msg=f"sequence {b} alone")


def test_flash_decode_and_the_plan(rng) -> None:
    q, k, v = (x.transpose(0, 2, 1, 3) for x in batch_problem(rng, np.float32, 300))  # HND
    out = flashdecode.flash_decode(q, k, v, split_tokens=64)
    alone = flashdecode.flash_decode(q[:1], k[:1, :, :200], v[:1, :, :200], split_tokens=64)
    expected, _ = attention(q[:1, :, 0], k[:1, :, :200].transpose(0, 2, 1, 3), v[:1, :, :200].transpose(0, 2, 1, 3))
    np.testing.assert_allclose(alone[:, :, 0], expected, atol=2e-5, rtol=2e-5)
    assert out.shape == q.shape
    with flashdecode.Handle("cpu", num_threads=2) as handle:
        info = handle.describe_plan(q, k, v, layout="HND", split_tokens=64)
        assert info.split_tokens >= 64 and info.num_splits == -(-300 // info.split_tokens)
        assert handle.workspace_size(q, k, v, layout="HND", split_tokens=64) == info.workspace_bytes
        with pytest.raises(flashdecode.InvalidSplitsError, match="are both set"):
            handle.describe_plan(q, k, v, layout="HND", split_tokens=64, num_splits=3)
