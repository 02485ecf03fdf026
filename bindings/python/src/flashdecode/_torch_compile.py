# SPDX-License-Identifier: Apache-2.0
"""PyTorch: a decode inside ``torch.compile`` becomes ``torch.ops.flashdecode.decode``.

The op is registered by :mod:`flashdecode._torch`; it runs
:func:`flashdecode._functions.op_decode`.
"""

from __future__ import annotations

from typing import Any

from . import _torch
from ._errors import InvalidArgumentError, refuse


def _compiled_decode(
    torch: Any,
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    lse: Any,
    return_lse: Any,
    seq_lens: Any,
    block_table: Any,
    softmax_scale: Any,
    num_splits: Any,
    split_tokens: Any,
    layout: Any,
    dtype: Any,
    stream: Any,
    causal: Any = True,
    window_left: Any = None,
    logit_softcap: Any = None,
    alibi_slopes: Any = None,
    sinks: Any = None,
    k_scale: Any = None,
    v_scale: Any = None,
    q_lens: Any = None,
) -> Any:
    """A decode inside ``torch.compile``: ``torch.ops.flashdecode.decode``, which the compiler sees
    (shapes from its fake implementation) and does not trace into; given outputs are filled by a copy."""
    if not _torch.op_available():  # registers it, at trace time, if this is the first look at PyTorch
        raise NotImplementedError("flashdecode: decoding inside torch.compile needs PyTorch 2.4 or later")
    if dtype is not None or stream is not None:
        raise refuse(
            InvalidArgumentError,
            "dtype= and stream= are not supported inside torch.compile: tensors carry their dtype, "
            "and the op runs on PyTorch's current stream",
        )
    # The op takes tensors: a list of slopes or sinks (host memory, as outside torch.compile) becomes one.
    if isinstance(alibi_slopes, (list, tuple)):
        alibi_slopes = _compiled_vector(torch, q, alibi_slopes, "alibi_slopes")
    if isinstance(sinks, (list, tuple)):
        sinks = _compiled_vector(torch, q, sinks, "sinks")
    # Scales given as Python numbers or lists (host memory) become float32 CPU tensors too.
    if k_scale is not None and not isinstance(k_scale, torch.Tensor):
        k_scale = _compiled_vector(torch, q, k_scale, "k_scale")
    if v_scale is not None and not isinstance(v_scale, torch.Tensor):
        v_scale = _compiled_vector(torch, q, v_scale, "v_scale")
    result, result_lse = torch.ops.flashdecode.decode(
        q, k, v, seq_lens, block_table, softmax_scale, num_splits, layout, split_tokens, causal, window_left,
        logit_softcap, alibi_slopes, sinks, k_scale, v_scale, q_lens,
    )  # fmt: skip
    if out is not None:
        out.copy_(result)
        result = out
    if lse is not None:
        lse.copy_(result_lse)
        result_lse = lse
    return (result, result_lse) if return_lse else result


def _compiled_vector(torch: Any, q: Any, values: Any, name: str) -> Any:
    """A list of per-head values as a float32 CPU tensor for the op; refused for CUDA tensors, as
    :meth:`Handle.decode` refuses a list on the CUDA backend."""
    if q.is_cuda:
        raise refuse(InvalidArgumentError, f"{name}: a list is host memory; pass a float32 GPU array")
    return torch.tensor(values, dtype=torch.float32)
