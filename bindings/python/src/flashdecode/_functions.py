# SPDX-License-Identifier: Apache-2.0
"""The module-level entry points, each on this thread's handle for its arrays' device and stream:
:func:`flash_decode`, a drop-in for the Triton split-K reference kernel, :func:`merge_states`,
:func:`append_kv`, and :func:`op_decode`, the implementation of ``torch.ops.flashdecode.decode``."""

from __future__ import annotations

import collections.abc
import threading
from typing import Any, Dict, List, Literal, Optional, Sequence, Tuple, overload

from . import _torch
from ._arrays import CUDA, default_stream, locate, stream_pointer
from ._describe import Layout, _as_layout
from ._errors import InvalidArgumentError, WorkspaceTooSmallError, refuse
from ._handle import ArrayT, Backend, Handle
from ._signature import _modules, _ndarray
from ._torch_compile import _compiled_decode

# ---- the Triton split-K reference kernel's entry point ---------------------------

_per_thread = threading.local()
_retired: List[Handle] = []
"""Handles whose workspace a captured CUDA graph may use: kept, never destroyed (see :func:`op_decode`)."""


def _thread_handle(backend: Backend, device: int, stream: int, capturing: bool = False) -> Handle:
    """This thread's handle for a device and stream: reused, so its workspace and plans are too.

    One per stream, because calls on different streams may overlap on the GPU
    and must not share a workspace. A handle that served a CUDA graph capture
    is not used again outside one: a later decode could grow its workspace,
    freeing the memory the graph replays into; it is retired, and a new one
    takes its place.
    """
    handles: Optional[Dict[Tuple[Backend, int, int], Handle]] = getattr(_per_thread, "handles", None)
    if handles is None:
        handles = _per_thread.handles = {}
    key = (backend, device, stream)
    handle = handles.get(key)
    if handle is not None and handle._captured and not capturing:
        _retired.append(handle)
        handle = None
    if handle is None:
        handle = handles[key] = Handle(backend, device=device)
    return handle


def flash_decode(
    q: ArrayT,
    k: ArrayT,
    v: ArrayT,
    softmax_scale: Optional[float] = None,
    num_splits: Optional[int] = None,
    block_n: Optional[int] = None,
    *,
    sm_scale: Optional[float] = None,
    out: Optional[ArrayT] = None,
    layout: Layout = "HND",
    stream: Any = None,
    split_tokens: Optional[int] = None,
    causal: bool = True,
    window_left: Optional[int] = None,
    logit_softcap: Optional[float] = None,
    alibi_slopes: Any = None,
    sinks: Any = None,
    k_scale: Any = None,
    v_scale: Any = None,
    dtype: Any = None,
    q_lens: Any = None,
) -> ArrayT:
    """Decode attention: a drop-in for the Triton split-K reference kernel's ``flash_decode_splitk``.

    Args:
        q: ``[batch, heads, q_len, head_dim]`` (``[batch, q_len, heads,
            head_dim]`` with ``layout="NHD"``); q_len is 1 for the
            reference kernel, up to 64 since 0.3 (the newest tokens of each
            sequence, see :meth:`Handle.decode`).
        k, v: ``[batch, kv_heads, kv_len, head_dim]`` (``[batch, kv_len,
            kv_heads, head_dim]`` with ``layout="NHD"``); kv_heads may divide
            heads (grouped-query attention).
        softmax_scale: multiplies q.k; None means 1/sqrt(head_dim). The
            fourth positional argument, as the reference kernel's ``sm_scale``.
        num_splits: KV splits; None lets the library choose.
        block_n: the reference kernel's key-tile size, its sixth argument:
            accepted (a positive int, or None) and not used, since the
            library picks its own tiles.
        sm_scale: the reference kernel's name for ``softmax_scale``; pass one of the two.
        out: optional output, shaped like q.
        layout: ``"HND"`` (the default here, the reference kernel's order)
            or ``"NHD"`` (:meth:`Handle.decode`'s default); it orders q and
            out as well as k and v, see :data:`LAYOUTS`.
        stream: CUDA stream (see :meth:`Handle.decode`).
        split_tokens: a fixed split length for batch-invariant results
            (since 0.3; see :meth:`Handle.decode`); not with ``num_splits``.
        causal, window_left, logit_softcap, alibi_slopes, sinks: the
            attention variants (since 0.3), as in :meth:`Handle.decode`.
        k_scale, v_scale, dtype: an 8-bit cache's scales and raw storage
            type (since 0.3), as in :meth:`Handle.decode`.
        q_lens: int32 ``[batch]``, each sequence's query tokens (since 0.3),
            as in :meth:`Handle.decode`.

    Returns:
        q's shape in q's dtype, of q's kind: a NumPy array (computed on the
        CPU backend) for NumPy input, a tensor on the same device for
        PyTorch (CPU or CUDA) or CuPy input.

    Each thread keeps one handle per device and stream, so the workspace is
    reused across calls. For more (paged caches, ragged lengths, LSE,
    workspace control) use :class:`Handle`.
    """
    if sm_scale is not None:
        if softmax_scale is not None:
            raise refuse(InvalidArgumentError, "sm_scale: is softmax_scale's other name; pass only one of them")
        softmax_scale = sm_scale
    if block_n is not None and (type(block_n) is not int or block_n < 1):
        raise refuse(InvalidArgumentError, f"block_n: must be a positive int (it is not used), got {block_n!r}")
    variants = (causal, window_left, logit_softcap, alibi_slopes, sinks, k_scale, v_scale, q_lens)
    if type(q) is _ndarray:
        return _thread_handle(Backend.CPU, 0, 0)._decode(  # type: ignore[no-any-return]
            q, k, v, out, None, False, None, None, softmax_scale, num_splits, split_tokens, layout, dtype, None,
            *variants,
        )  # fmt: skip
    torch = _modules.get("torch")
    if torch is not None and _torch.compiling(torch):
        return _compiled_decode(  # type: ignore[no-any-return]
            torch, q, k, v, out, None, False, None, None, softmax_scale, num_splits, split_tokens, layout, dtype,
            stream, *variants,
        )  # fmt: skip
    torch_state = _torch.get()
    if torch_state is not None and isinstance(q, torch_state.Tensor):
        if q.is_cuda:
            device = q.get_device()
            stream_value = torch_state.current_stream(device) if stream is None else stream_pointer(stream)
            return _thread_handle(Backend.CUDA, device, stream_value)._decode(  # type: ignore[no-any-return]
                q, k, v, out, None, False, None, None, softmax_scale, num_splits, split_tokens, layout, dtype,
                stream_value, *variants,
            )  # fmt: skip
        return _thread_handle(Backend.CPU, 0, 0)._decode(  # type: ignore[no-any-return]
            q, k, v, out, None, False, None, None, softmax_scale, num_splits, split_tokens, layout, dtype, None,
            *variants,
        )  # fmt: skip
    location, device_index = locate(q)
    if location == CUDA:
        stream_value = stream_pointer(stream) if stream is not None else default_stream(q)
        return _thread_handle(Backend.CUDA, device_index or 0, stream_value)._decode(  # type: ignore[no-any-return]
            q, k, v, out, None, False, None, None, softmax_scale, num_splits, split_tokens, layout, dtype,
            stream_value, *variants,
        )  # fmt: skip
    return _thread_handle(Backend.CPU, 0, 0)._decode(  # type: ignore[no-any-return]
        q, k, v, out, None, False, None, None, softmax_scale, num_splits, split_tokens, layout, dtype, None, *variants
    )


def flash_decode_splitk(
    q: ArrayT,
    k: ArrayT,
    v: ArrayT,
    sm_scale: Optional[float] = None,
    num_splits: Optional[int] = None,
    block_n: int = 64,
) -> ArrayT:
    """The Triton split-K reference kernel's entry point, by its name and signature.

    ``q`` ``[batch, heads, 1, head_dim]``, ``k`` and ``v`` ``[batch,
    kv_heads, kv_len, head_dim]``, of any layout: like the reference kernel,
    which calls ``.contiguous()`` on them, it copies an input whose elements
    are not row-major (:func:`flash_decode` takes them as they are, or
    refuses a head_dim that is not contiguous). ``block_n`` is accepted and
    not used. Everything else is :func:`flash_decode`'s, with ``layout="HND"``.
    """
    return flash_decode(_row_major(q), _row_major(k), _row_major(v), sm_scale, num_splits, block_n)


def _row_major(array: Any) -> Any:
    """The array itself when it is row-major, else a row-major copy (PyTorch, NumPy, CuPy)."""
    contiguous = getattr(array, "contiguous", None)
    if callable(contiguous):  # PyTorch: returns the tensor itself when it already is
        return contiguous()
    if type(array) is _ndarray:
        return array if array.flags.c_contiguous else array.copy(order="C")
    flags = getattr(array, "flags", None)
    if flags is not None and not getattr(flags, "c_contiguous", True) and callable(getattr(array, "copy", None)):
        return array.copy(order="C")  # CuPy and other NumPy-like arrays
    return array


@overload
def merge_states(
    outs: Sequence[ArrayT],
    lses: Sequence[ArrayT],
    *,
    out: Optional[ArrayT] = None,
    lse: Optional[ArrayT] = None,
    return_lse: Literal[False] = False,
    layout: Layout = "NHD",
    dtype: Any = None,
    stream: Any = None,
) -> ArrayT: ...


@overload
def merge_states(
    outs: Sequence[ArrayT],
    lses: Sequence[ArrayT],
    *,
    out: Optional[ArrayT] = None,
    lse: Optional[ArrayT] = None,
    return_lse: Literal[True],
    layout: Layout = "NHD",
    dtype: Any = None,
    stream: Any = None,
) -> Tuple[ArrayT, ArrayT]: ...


def merge_states(
    outs: Sequence[Any],
    lses: Sequence[Any],
    *,
    out: Any = None,
    lse: Any = None,
    return_lse: bool = False,
    layout: Layout = "NHD",
    dtype: Any = None,
    stream: Any = None,
) -> Any:
    """Merges partial attention results by their log-sum-exps: :meth:`Handle.merge_states`
    on this thread's handle for the states' device (the CPU backend for host arrays).

    Cascade attention, a prefix shared by the batch decoded once::

        prefix, prefix_lse = handle.decode(q, shared_k, shared_v, return_lse=True)   # one cache for all
        suffix, suffix_lse = handle.decode(q, own_k, own_v, seq_lens=lens, return_lse=True)
        out = flashdecode.merge_states([prefix, suffix], [prefix_lse, suffix_lse])

    Context-parallel decode: each GPU decodes its shard of the cache with
    ``return_lse=True``; gather the (out, lse) pairs (e.g.
    ``torch.distributed.all_gather``) and merge them on each GPU.

    The handle is chosen as :func:`flash_decode` chooses it (by ``outs[0]``);
    the arguments are :meth:`Handle.merge_states`'s, ``layout`` included
    (``"NHD"`` by default, as :meth:`Handle.decode` writes them). The
    thread's handle for a device and stream is created on first use: to
    capture a merge in a CUDA graph, run one on that stream before capturing.
    """
    sequence = isinstance(outs, collections.abc.Sequence) and not isinstance(outs, (str, bytes))
    first = outs[0] if sequence and len(outs) else None
    if first is not None and type(first) is not _ndarray:
        torch_state = _torch.get()
        if torch_state is not None and isinstance(first, torch_state.Tensor):
            if first.is_cuda:
                device = first.get_device()
                stream_value = torch_state.current_stream(device) if stream is None else stream_pointer(stream)
                # Merges use no workspace: a handle kept for a captured graph serves them too.
                return _thread_handle(Backend.CUDA, device, stream_value, capturing=True)._merge_states(
                    outs, lses, out, lse, return_lse, layout, dtype, stream_value
                )
        else:
            location, device_index = locate(first)
            if location == CUDA:
                stream_value = stream_pointer(stream) if stream is not None else default_stream(first)
                return _thread_handle(Backend.CUDA, device_index or 0, stream_value, capturing=True)._merge_states(
                    outs, lses, out, lse, return_lse, layout, dtype, stream_value
                )
    return _thread_handle(Backend.CPU, 0, 0)._merge_states(outs, lses, out, lse, return_lse, layout, dtype, stream)


def append_kv(
    k_new: Any,
    v_new: Any,
    k: Any,
    v: Any,
    *,
    seq_lens: Any = None,
    block_table: Any = None,
    k_scale: Any = None,
    v_scale: Any = None,
    layout: Layout = "NHD",
    dtype: Any = None,
    stream: Any = None,
) -> None:
    """Writes new keys and values into a cache, quantizing them to its dtype: :meth:`Handle.append_kv`
    on this thread's handle for the cache's device (the CPU backend for host arrays), since 0.3.

    The handle is chosen by ``k`` as :func:`merge_states` chooses it by its
    first state. An append uses no workspace, so the handle a captured CUDA
    graph keeps serves it too. Not a PyTorch custom op: inside
    ``torch.compile`` it is a graph break.
    """
    arguments = (seq_lens, block_table, k_scale, v_scale, layout, dtype)
    torch_state = _torch.get() if type(k) is not _ndarray else None
    if torch_state is not None and isinstance(k, torch_state.Tensor):
        if k.is_cuda:
            device = k.get_device()
            stream_value = torch_state.current_stream(device) if stream is None else stream_pointer(stream)
            handle = _thread_handle(Backend.CUDA, device, stream_value, capturing=True)
            return handle.append_kv(k_new, v_new, k, v, **_append_keywords(arguments), stream=stream_value)
    elif type(k) is not _ndarray:
        location, device_index = locate(k)
        if location == CUDA:
            stream_value = stream_pointer(stream) if stream is not None else default_stream(k)
            handle = _thread_handle(Backend.CUDA, device_index or 0, stream_value, capturing=True)
            return handle.append_kv(k_new, v_new, k, v, **_append_keywords(arguments), stream=stream_value)
    return _thread_handle(Backend.CPU, 0, 0).append_kv(k_new, v_new, k, v, **_append_keywords(arguments))


def _append_keywords(arguments: Tuple[Any, ...]) -> Dict[str, Any]:
    names = ("seq_lens", "block_table", "k_scale", "v_scale", "layout", "dtype")
    return dict(zip(names, arguments))


# ---- PyTorch: the custom op's implementation -----------------------------------


def op_decode(
    q: Any,
    k: Any,
    v: Any,
    seq_lens: Any,
    block_table: Any,
    softmax_scale: Optional[float],
    num_splits: Optional[int],
    layout: str,
    split_tokens: Optional[int] = None,
    causal: bool = True,
    window_left: Optional[int] = None,
    logit_softcap: Optional[float] = None,
    alibi_slopes: Any = None,
    sinks: Any = None,
    k_scale: Any = None,
    v_scale: Any = None,
    q_lens: Any = None,
) -> Tuple[Any, Any]:
    """``torch.ops.flashdecode.decode``'s implementation: (out, lse), on this thread's
    handle for q's device and PyTorch's current stream (the CPU backend for CPU tensors).

    Under CUDA graph capture the library cannot allocate: the handle of the
    capturing stream must have run the decode before (a warm-up on that
    stream, which torch.compile's CUDA graphs do). That handle is then kept
    for the graph and never grown again (:func:`_thread_handle`).
    """
    torch_state = _torch.get()
    assert torch_state is not None
    capturing = False
    if q.is_cuda:
        device = q.get_device()
        stream: Optional[int] = torch_state.current_stream(device)
        capturing = bool(torch_state.torch.cuda.is_current_stream_capturing())
        handle = _thread_handle(Backend.CUDA, device, stream, capturing)  # type: ignore[arg-type]
    else:
        stream, handle = None, _thread_handle(Backend.CPU, 0, 0)
    try:
        result = handle.decode(
            q,
            k,
            v,
            seq_lens=seq_lens,
            block_table=block_table,
            softmax_scale=softmax_scale,
            num_splits=num_splits,
            split_tokens=split_tokens,
            causal=causal,
            window_left=window_left,
            logit_softcap=logit_softcap,
            alibi_slopes=alibi_slopes,
            sinks=sinks,
            k_scale=k_scale,
            v_scale=v_scale,
            q_lens=q_lens,
            layout=_as_layout(layout),
            return_lse=True,
            stream=stream,
        )
    except WorkspaceTooSmallError as error:
        if not capturing:
            raise
        raise WorkspaceTooSmallError(
            f"{error.message}; torch.ops.flashdecode.decode keeps a handle per thread, device and stream: run "
            "the same decode once on the capturing stream before capture (a warm-up, as torch.compile's "
            "mode='reduce-overhead' does) so that the handle's workspace is reserved"
        ) from None
    if capturing:
        handle._captured = True  # the graph holds its workspace: see _thread_handle
    return result
