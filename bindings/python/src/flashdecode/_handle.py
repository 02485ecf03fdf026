# SPDX-License-Identifier: Apache-2.0
"""Decode handles, the decode call, and :func:`flash_decode`, a drop-in for the Triton split-K reference kernel."""

from __future__ import annotations

import collections.abc
import ctypes
import enum
import math
import numbers
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Literal, Optional, Sequence, Tuple, TypeVar, Union, cast, overload

import numpy as np

from . import _library, _torch
from ._arrays import (
    CUDA,
    HOST,
    CACHE_DTYPES_8_BIT,
    ArrayView,
    DType,
    allocator_like,
    as_dtype,
    default_stream,
    dtype_name,
    locate,
    stream_pointer,
    view_array,
)
from ._errors import (
    FlashDecodeError,
    InvalidArgumentError,
    InvalidDTypeError,
    InvalidHandleError,
    InvalidHeadCountError,
    InvalidHeadDimError,
    InvalidShapeError,
    NoDeviceError,
    UnsupportedError,
    WorkspaceTooSmallError,
    error_from_status,
    refuse,
)
from ._library import FdDecodeArgs, FdTensor, check, last_error_message, library

Layout = Literal["NHD", "HND"]
"""The ``layout=`` argument: see :data:`LAYOUTS` (lower case is accepted too)."""

ArrayT = TypeVar("ArrayT")
"""An array type: decode returns arrays of q's kind (NumPy in, NumPy out; a torch.Tensor in, a torch.Tensor out)."""


class Backend(enum.IntEnum):
    """``fd_backend``: where a handle runs. Values are pinned."""

    AUTO = 0
    CPU = 1
    CUDA = 2


class Merge(enum.IntEnum):
    """``fd_merge``: how a decode combines its splits' partial results. Values are pinned."""

    NONE = 0
    """One split: the CUDA split kernel writes the output itself."""
    SEPARATE = 1
    """A pass after every split: the CUDA merge kernel (a second launch), or the CPU merge pass."""
    FUSED = 2
    """CUDA: the last thread block of each (sequence, KV head) merges its splits in the split kernel."""
    CLUSTER = 3
    """CUDA sm_90+: each (sequence, KV head)'s splits run as one thread-block cluster."""


def _merge(value: int) -> Union[Merge, int]:
    """``fd_merge`` as a :class:`Merge`, or the plain number for a value a later library added."""
    try:
        return Merge(value)
    except ValueError:
        return int(value)


@dataclass(frozen=True)
class PlanInfo:
    """What :meth:`Handle.decode` would run for a problem (``fd_plan_info``).

    Attributes:
        backend: the handle's backend.
        num_splits: splits of the KV sequence (requested, or the planner's choice); 0 on
            CUDA when the device cuts each sequence from its length (per-sequence
            lengths with automatic splits: the balanced schedule).
        split_tokens: KV tokens of each split; with 0 splits, the tile the device cuts at.
        workspace_bytes: as :meth:`Handle.workspace_size` reports.
        kernel: the split kernel, e.g. ``"tensor-core-wide-128"`` or ``"cpu"``; for logs.
        merge: how the splits are combined (a plain int for a kind a later library added).
        launches: CUDA kernels per decode (1 or 2); 0 on the CPU.
        blocks: CUDA thread blocks of the split kernel; CPU tasks of the split pass.
    """

    backend: "Backend"
    num_splits: int
    split_tokens: int
    workspace_bytes: int
    kernel: str
    merge: Union[Merge, int]
    launches: int
    blocks: int


LAYOUTS: Tuple[Layout, Layout] = ("NHD", "HND")
"""Dimension orders, for q and out as well as for the cache: ``"NHD"`` puts
the sequence before the heads (q ``[batch, q_len, heads, head_dim]``, k/v
``[batch, kv_len, kv_heads, head_dim]``, the C API's order); ``"HND"`` puts
the heads first (q ``[batch, heads, q_len, head_dim]``, k/v ``[batch, kv_heads,
kv_len, head_dim]``: the order of the Triton split-K reference kernel and of
PyTorch SDPA). :meth:`Handle.decode` defaults to ``"NHD"``, :func:`flash_decode`
to ``"HND"``. Any other layout is a strided view of one of these."""

_QUERY_SHAPES = {"NHD": "[batch, q_len, heads, head_dim]", "HND": "[batch, heads, q_len, head_dim]"}
_CACHE_SHAPES = {"NHD": "[batch, kv_len, kv_heads, head_dim]", "HND": "[batch, kv_heads, kv_len, head_dim]"}
_PAGE_POOL_SHAPES = {
    "NHD": "[num_pages, page_size, kv_heads, head_dim]",
    "HND": "[num_pages, kv_heads, page_size, head_dim]",
}
_LSE_SHAPES = {"NHD": "[batch, q_len, heads]", "HND": "[batch, heads, q_len]"}

Dims = Tuple[Tuple[int, ...], Tuple[int, ...]]  # (shape, strides) in the C API's dimension order


def host_workspace(nbytes: int) -> np.ndarray:
    """An uninitialised NumPy ``uint8`` buffer of ``nbytes``, aligned as :meth:`Handle.set_workspace` requires."""
    nbytes = _size(nbytes, "nbytes")
    alignment = _library.WORKSPACE_ALIGNMENT
    raw = np.empty(nbytes + alignment, dtype=np.uint8)
    offset = -raw.__array_interface__["data"][0] % alignment
    # NumPy gives an empty slice its base's address: cut one byte, then trim, to keep the aligned one.
    return raw[offset : offset + max(nbytes, 1)][:nbytes]


@dataclass
class _PreparedCall:
    args: FdDecodeArgs
    stream: int
    views: List[ArrayView] = field(default_factory=list)  # keeps every array (and capsule) alive
    named: Dict[str, ArrayView] = field(default_factory=dict)
    out: Any = None
    lse: Any = None
    out_allocator: Optional[Callable[[], Any]] = None  # set when decode allocated out
    lse_allocator: Optional[Callable[[], Any]] = None


@dataclass
class _PreparedAppend:
    args: "_library.FdAppendArgs"
    stream: int
    views: List[ArrayView] = field(default_factory=list)  # keeps every array (and capsule) alive


@dataclass
class _PreparedMerge:
    args: "_library.FdMergeArgs"
    stream: int
    states_out: Any  # ctypes arrays of FdTensor that args points into
    states_lse: Any
    views: List[ArrayView] = field(default_factory=list)  # keeps every array (and capsule) alive
    out: Any = None
    lse: Any = None


class Handle:
    """A decode handle: a backend, its device, and a workspace reused across calls.

    Create one per thread (or per CUDA stream) and reuse it; it is a context
    manager, and :meth:`close` (or garbage collection) destroys it and frees
    its library-owned workspace. Calls on one handle are serialised by a lock,
    so sharing one between threads is safe but not concurrent.

    A handle remembers, for the last few argument signatures it decoded
    (array types, dtypes, shapes, strides, devices, and the other
    arguments), the C arguments it built; a call with the same signature
    only writes the new data pointers into them. Every pointer is read anew
    on every call.

    Args:
        backend: ``"auto"`` (CUDA when the library can use the device, else
            the CPU), ``"cpu"`` or ``"cuda"``; or a :class:`Backend`.
        device: CUDA device ordinal for the CUDA backend.
        num_threads: worker threads of the CPU backend; 0 uses every core.
        check_contents: check the contents of ``seq_lens``, ``q_lens`` and
            ``block_table`` on every decode (``FD_CHECK_CONTENTS``, since 0.3).
            By default they are not checked: each length is clamped to [0,
            kv_capacity], each query count to [0, q_len] and each used page
            index into the pool, so a bad one gives a meaningless result
            rather than an error. With checks, a bad length or query count
            raises :class:`InvalidLengthError` and a bad page index
            :class:`InvalidBlockTableError`, naming the element: from
            :meth:`decode` itself on the CPU backend; on CUDA, where the
            check runs on the device, from the next :meth:`decode` or from
            :meth:`check_contents`. ``FLASHDECODE_CHECKS=contents`` in the
            environment turns the checks on for every handle.

    Raises:
        NoDeviceError: CUDA was asked for but there is no usable GPU (no
            NVIDIA driver, no device with that ordinal, one the build cannot
            run on) or the library was built without CUDA; the message says which.
        InvalidArgumentError: a bad backend, device or thread count.
        UnsupportedError: ``check_contents`` with a library older than 0.3.
    """

    def __init__(
        self,
        backend: Union[Backend, str] = Backend.AUTO,
        *,
        device: int = 0,
        num_threads: int = 0,
        check_contents: bool = False,
    ) -> None:
        self._pointer: Optional[int] = None  # first, so that __del__ works if creation fails
        self._lock = threading.Lock()
        self._workspace: Optional[ArrayView] = None
        self._captured = False  # served a CUDA graph capture through torch.ops.flashdecode.decode
        self._plans: Dict[Any, _Plan] = {}
        self._last: Tuple[Any, Optional[_Plan]] = ((), None)  # the last plan used, and its key
        lib = library()
        self._decode_raw = _raw_decode(lib)
        options = _library.new_options()
        options.backend = _as_backend(backend)
        options.device = _int32(device, "device")
        options.num_threads = _int32(num_threads, "num_threads")
        if not isinstance(check_contents, (bool, np.bool_)):
            raise refuse(InvalidArgumentError, f"check_contents: expected a bool, got {type(check_contents).__name__}")
        if check_contents:
            _library.require("fd_options.checks", "check_contents=True")
            options.checks = _library.CHECK_CONTENTS
        pointer = ctypes.c_void_p()
        status = lib.fd_create(ctypes.byref(pointer), ctypes.byref(options))
        if status:
            error = error_from_status(status, last_error_message())
            if isinstance(error, NoDeviceError):
                error = NoDeviceError(_no_gpu_message(error.message))
            raise error
        self._pointer = pointer.value
        resolved = _library.c_enum()
        check(lib.fd_get_backend(self._pointer, ctypes.byref(resolved)))
        self._backend = Backend(resolved.value)
        self._device: int = options.device

    @property
    def backend(self) -> Backend:
        """The backend this handle runs on (AUTO resolved to CPU or CUDA)."""
        return self._backend

    @property
    def device(self) -> int:
        """The CUDA device ordinal (meaningful for the CUDA backend)."""
        return self._device

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._pointer is None

    def close(self) -> None:
        """Destroys the handle and frees its library-owned workspace; idempotent.

        For CUDA, work enqueued with this handle must have finished (synchronise
        its stream first): the workspace is freed without waiting.
        """
        with self._lock:
            pointer, self._pointer = self._pointer, None
            self._workspace = None
            self._plans.clear()
            self._last = ((), None)
            if pointer is not None:
                check(library().fd_destroy(pointer))

    def __enter__(self) -> "Handle":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # at interpreter exit the library may be gone already; nothing to report to
            pass

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"backend={self._backend.name.lower()} device={self._device}"
        return f"<flashdecode.Handle {state}>"

    @overload
    def decode(
        self,
        q: ArrayT,
        k: ArrayT,
        v: ArrayT,
        *,
        out: Optional[ArrayT] = None,
        lse: Optional[ArrayT] = None,
        return_lse: Literal[False] = False,
        seq_lens: Any = None,
        block_table: Any = None,
        softmax_scale: Optional[float] = None,
        num_splits: Optional[int] = None,
        split_tokens: Optional[int] = None,
        causal: bool = True,
        window_left: Optional[int] = None,
        logit_softcap: Optional[float] = None,
        alibi_slopes: Any = None,
        sinks: Any = None,
        k_scale: Any = None,
        v_scale: Any = None,
        q_lens: Any = None,
        layout: Layout = "NHD",
        dtype: Any = None,
        stream: Any = None,
    ) -> ArrayT: ...

    @overload
    def decode(
        self,
        q: ArrayT,
        k: ArrayT,
        v: ArrayT,
        *,
        out: Optional[ArrayT] = None,
        lse: Optional[ArrayT] = None,
        return_lse: Literal[True],
        seq_lens: Any = None,
        block_table: Any = None,
        softmax_scale: Optional[float] = None,
        num_splits: Optional[int] = None,
        split_tokens: Optional[int] = None,
        causal: bool = True,
        window_left: Optional[int] = None,
        logit_softcap: Optional[float] = None,
        alibi_slopes: Any = None,
        sinks: Any = None,
        k_scale: Any = None,
        v_scale: Any = None,
        q_lens: Any = None,
        layout: Layout = "NHD",
        dtype: Any = None,
        stream: Any = None,
    ) -> Tuple[ArrayT, ArrayT]: ...

    def decode(
        self,
        q: Any,
        k: Any,
        v: Any,
        *,
        out: Any = None,
        lse: Any = None,
        return_lse: bool = False,
        seq_lens: Any = None,
        block_table: Any = None,
        softmax_scale: Optional[float] = None,
        num_splits: Optional[int] = None,
        split_tokens: Optional[int] = None,
        causal: bool = True,
        window_left: Optional[int] = None,
        logit_softcap: Optional[float] = None,
        alibi_slopes: Any = None,
        sinks: Any = None,
        k_scale: Any = None,
        v_scale: Any = None,
        q_lens: Any = None,
        layout: Layout = "NHD",
        dtype: Any = None,
        stream: Any = None,
    ) -> Any:
        """Decode attention: the newest query tokens of each sequence against its KV cache.

        ``out[b, t, h] = softmax(scale * q[b, t, h] . K[b, :len_b, g]) V[b, :len_b, g]``
        where g is the KV head of query head h's group (GQA; MQA with one KV
        head), over the keys query token t sees (see ``causal``; with one
        query token, all ``len_b`` of them).

        Args:
            q: queries, ``[batch, q_len, heads, head_dim]`` (``layout="NHD"``,
                the default), ``[batch, heads, q_len, head_dim]`` (``"HND"``),
                or ``[batch, heads, head_dim]`` (q_len 1). q_len is 1 for
                plain decode and up to 64 (since 0.3) for speculative or
                multi-token steps: the q_len tokens are the newest of each
                sequence, token t of a sequence of length L at position
                ``L - q_len + t``.
            k, v: a dense cache ``[batch, kv_len, kv_heads, head_dim]``
                (``"NHD"``) / ``[batch, kv_heads, kv_len, head_dim]``
                (``"HND"``); with ``block_table``, a page pool
                ``[num_pages, page_size, kv_heads, head_dim]`` /
                ``[num_pages, kv_heads, page_size, head_dim]``. Any strides
                work as long as head_dim is contiguous.
            out: where to write the result, shaped like q, of q's dtype or
                float32; allocated like q (same library and device) if omitted.
            lse: where to write the natural-log log-sum-exp of the scores,
                float32, q's shape without head_dim; -inf for empty sequences.
            return_lse: also return lse (allocated if not given).
            seq_lens: int32 ``[batch]``, tokens of each sequence (ragged
                batch); absent: every sequence fills its cache. A list is
                accepted on the CPU backend.
            q_lens: int32 ``[batch]``, since 0.3: each sequence's query
                tokens (ragged speculative steps), clamped to [0, q_len];
                sequence b's tokens are ``q[b, :q_lens[b]]`` at positions
                ``L - q_lens[b] + i``; the rest are padding, never read, and
                get zeros and LSE -inf (the sink with sinks). In q's memory
                (a list is accepted on the CPU backend) and read at run time
                (a captured CUDA graph replays with its current values);
                absent: every sequence has q_len.
            block_table: int32 ``[batch, max_pages]`` page indices: k and v
                are then a paged cache.
            softmax_scale: multiplies q.k; None means 1/sqrt(head_dim).
            num_splits: KV splits; None (or 0) lets the library choose.
            split_tokens: a fixed split length in KV tokens (since 0.3), for
                batch-invariant results: a sequence's out and lse are then
                bitwise the same whether it runs alone or in any batch (on
                one backend, device model and library version; see
                ``fd_decode_args.split_tokens`` in the C header). The
                library rounds it up to its KV tile (:meth:`describe_plan`
                reports the length used). None (or 0) leaves the splits to
                ``num_splits`` or the library; not both.
            causal: with q_len > 1, query token t sees keys up to its own
                position ``L - q_len + t`` (the default); False lets every
                query token see all L keys (a verify step that scores drafts
                alike). Since 0.3 (False needs it).
            window_left: a sliding window of W > 0 keys: query token t sees
                key j only if ``pos_t - j < W`` (1: only its own position).
                None (the default) is no window; 0 and negative values are
                refused. Only the keys inside the window are read. Since 0.3.
            logit_softcap: c > 0 caps every score s (after the scale) to
                ``c * tanh(s / c)`` (Gemma 2, Grok). None (the default) caps
                nothing; 0, negative, NaN and infinite values, and ones that
                are 0 in float32, are refused. Since 0.3.
            alibi_slopes: float32 ``[heads]``, one per query head, in q's
                memory (a list of floats is accepted on the CPU backend):
                adds ``slope[h] * (j - pos_t)`` to the score of key j (after
                the softcap). Since 0.3.
            sinks: float32 ``[heads]`` attention-sink logits, in q's memory
                (a list on the CPU backend): ``exp(sink[h])`` joins each
                softmax denominator (not the numerator), and the LSE. Since
                0.3. A query token that sees no key (an empty sequence, or
                q_len > L under the causal mask) gets zeros and LSE -inf,
                or LSE ``sink[h]`` with sinks.
            k_scale, v_scale: float32 dequantization scales of an 8-bit
                cache (since 0.3): each cache element stands for
                ``stored value * scale``. A size-1 array (0-d, ``[1]``, ...)
                is one scale for the whole cache, a 1-d ``[kv_heads]`` array
                one per KV head, and a 3-d array one per token and head,
                shaped like the cache without head_dim (``[batch, kv_len,
                kv_heads]``, or the pool's ``[num_pages, page_size,
                kv_heads]``, in ``layout``'s order). The smaller forms are
                passed as strides of 0: nothing is copied and the scales are
                read where they are, at run time (device memory on CUDA: a
                captured graph replays with their current values). A Python
                float or list is accepted on the CPU backend. Absent: 1.
                Refused (InvalidDTypeError) for a 16- or 32-bit cache.
            layout: ``"NHD"`` or ``"HND"``: the dimension order of q and out
                as well as of k and v (and lse's), see :data:`LAYOUTS`.
                :func:`flash_decode` defaults to ``"HND"``, this method to
                ``"NHD"``; when the shapes only fit the other one, the error says so.
            dtype: the element type of q, k and v when their storage does not
                say it: ``"bfloat16"`` or ``"float16"`` for ``uint16`` arrays
                holding the bits; ``"float8_e4m3fn"``, ``"float8_e5m2"`` (or
                ``"int8"``) for a ``uint8`` k and v holding an 8-bit cache
                (since 0.3). An 8-bit name applies to k and v only; a pair
                ``("bfloat16", "float8_e4m3fn")`` names both kinds of storage.
                Typed arrays (``int8``, ``ml_dtypes.float8_e4m3fn``,
                ``torch.float8_e5m2``, ...) say their own and are checked
                against it.
            stream: CUDA backend: the stream to enqueue on (an int
                ``cudaStream_t`` or a PyTorch/CuPy/Numba stream). Default:
                PyTorch's current stream for PyTorch tensors, else the stream
                q's ``__cuda_array_interface__`` names, else the legacy
                default stream. The call is
                asynchronous on it: the arrays must stay alive until the
                stream has run it. With a stream other than the one your
                array library allocates on, a temporary argument (``k.half()``
                inline) can go back to that library's cache and be reused
                while the kernel still reads it: keep such arrays referenced
                (or ``record_stream`` them, in PyTorch) until the stream is
                done. Ignored by the CPU backend.

        PyTorch tensors are read directly (no DLPack). Inputs that require
        grad are read as ``.detach()`` would read them: decode has no
        backward and its results never require grad; an ``out`` or ``lse``
        that requires grad is refused. Inside ``torch.compile`` the call
        becomes ``torch.ops.flashdecode.decode`` (see :func:`torch_op`), run
        on this thread's handle for the tensors' device and current stream.

        Returns:
            ``out``, or ``(out, lse)`` with ``return_lse=True``: arrays of
            q's kind (NumPy for NumPy input, a tensor of q's library and
            device otherwise) unless given.

        Raises:
            FlashDecodeError: a subclass per status, with the library's
                message naming the argument at fault; nothing is written.
                With ``check_contents=True``, bad lengths and page indices
                raise :class:`InvalidLengthError` and
                :class:`InvalidBlockTableError` (see :class:`Handle`).
            UnsupportedError: ``split_tokens``, ``causal=False``,
                ``window_left``, ``logit_softcap``, ``alibi_slopes``,
                ``sinks``, ``k_scale``, ``v_scale``, ``q_lens`` or an 8-bit
                cache with a library older than 0.3 (which also refuses
                q_len > 1).
            TypeError: an argument is not an array at all.
        """
        if type(q) is not _ndarray:
            torch = _modules.get("torch")
            if torch is not None and _torch.compiling(torch):
                return _compiled_decode(
                    torch, q, k, v, out, lse, return_lse, seq_lens, block_table,
                    softmax_scale, num_splits, split_tokens, layout, dtype, stream,
                    causal, window_left, logit_softcap, alibi_slopes, sinks, k_scale, v_scale, q_lens,
                )  # fmt: skip
        return self._decode(
            q, k, v, out, lse, return_lse, seq_lens, block_table, softmax_scale, num_splits, split_tokens, layout,
            dtype, stream, causal, window_left, logit_softcap, alibi_slopes, sinks, k_scale, v_scale, q_lens,
        )  # fmt: skip

    def _decode(
        self,
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
        """:meth:`decode` outside torch.compile, with positional arguments (:func:`flash_decode` calls it directly)."""
        signature = _signature(
            q, k, v, out, lse, return_lse, seq_lens, block_table, softmax_scale, num_splits, split_tokens, layout, dtype,
            causal, window_left, logit_softcap, alibi_slopes, sinks, k_scale, v_scale, q_lens,
        )  # fmt: skip
        with self._lock:
            pointer = self._pointer
            if pointer is None:
                raise refuse(InvalidHandleError, "this Handle was closed")
            plan = None
            if signature is not None:
                last = self._last
                if last[0] == signature[0]:  # cheaper than hashing the key
                    plan = last[1]
                else:
                    plan = self._plans.get(signature[0])
                    if plan is not None:
                        self._last = (signature[0], plan)
            stream_value = 0
            if plan is not None and plan.cuda:
                # Only PyTorch's current stream is fast: another one must first
                # wait for PyTorch's queued work, which the full path arranges.
                current = plan.current_stream(self._device)
                stream_value = current if stream is None else stream_pointer(stream)
                if stream_value != current:
                    plan = None
            if plan is not None:
                # The fast path: the signature matched, so every check the
                # binding makes has passed for these types, dtypes, shapes,
                # strides and devices; only the data pointers are new.
                pointers = signature[1]  # type: ignore[index]
                plan.q.value, plan.k.value, plan.v.value = pointers[0], pointers[1], pointers[2]
                if out is None:
                    out = plan.new_out()
                    plan.out.value = plan.pointer_of(out) or _EMPTY_ADDRESS
                else:
                    plan.out.value = pointers[3]
                if plan.lse is not None:
                    if lse is None:
                        lse = plan.new_lse()
                        plan.lse.value = plan.pointer_of(lse) or _EMPTY_ADDRESS
                    else:
                        plan.lse.value = pointers[4]
                if plan.seq_lens is not None:
                    plan.seq_lens.value = pointers[5]
                if plan.block_table is not None:
                    plan.block_table.value = pointers[6]
                if plan.alibi_slopes is not None:
                    plan.alibi_slopes.value = pointers[7]
                if plan.sinks is not None:
                    plan.sinks.value = pointers[8]
                if plan.k_scale is not None:
                    plan.k_scale.value = pointers[9]
                if plan.v_scale is not None:
                    plan.v_scale.value = pointers[10]
                if plan.q_lens is not None:
                    plan.q_lens.value = pointers[11]
                status = self._decode_raw(pointer, plan.address, stream_value or None)
                if not status:
                    return (out, lse) if return_lse else out
                error: Optional[FlashDecodeError] = error_from_status(status, last_error_message())
            else:
                error = None
                try:
                    call = self._prepare(
                        q,
                        k,
                        v,
                        out=out,
                        lse=lse,
                        return_lse=return_lse,
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
                        layout=layout,
                        dtype=dtype,
                        stream=stream,
                    )
                except (InvalidShapeError, InvalidHeadCountError, InvalidHeadDimError, UnsupportedError) as refused:
                    error = refused
                else:
                    status = library().fd_decode(pointer, ctypes.byref(call.args), call.stream or None)
                    if not status:
                        if signature is not None:
                            self._remember(signature, call)
                        return (call.out, call.lse) if return_lse else call.out
                    error = error_from_status(status, last_error_message())
        assert error is not None
        raise self._with_layout_hint(
            error, q, k, v, out, lse, seq_lens, block_table, layout, dtype, alibi_slopes, sinks, k_scale, v_scale,
            q_lens,
        )  # fmt: skip

    def workspace_size(
        self,
        q: Any,
        k: Any,
        v: Any,
        *,
        out: Any = None,
        lse: Any = None,
        seq_lens: Any = None,
        block_table: Any = None,
        softmax_scale: Optional[float] = None,
        num_splits: Optional[int] = None,
        split_tokens: Optional[int] = None,
        causal: bool = True,
        window_left: Optional[int] = None,
        logit_softcap: Optional[float] = None,
        alibi_slopes: Any = None,
        sinks: Any = None,
        k_scale: Any = None,
        v_scale: Any = None,
        q_lens: Any = None,
        layout: Layout = "NHD",
        dtype: Any = None,
    ) -> int:
        """Bytes of workspace :meth:`decode` needs for these arguments on this handle.

        Depends only on shapes, ``num_splits`` (or ``split_tokens``) and ``window_left`` (not on the
        contents of ``seq_lens`` or ``q_lens``); validates like :meth:`decode`.
        ``out`` may be omitted (nothing is allocated or written).
        """
        nbytes = ctypes.c_size_t()
        self._shape_query(
            library().fd_workspace_size,
            nbytes,
            q,
            k,
            v,
            out=out,
            lse=lse,
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
            layout=layout,
            dtype=dtype,
        )
        return nbytes.value

    def describe_plan(
        self,
        q: Any,
        k: Any,
        v: Any,
        *,
        out: Any = None,
        lse: Any = None,
        seq_lens: Any = None,
        block_table: Any = None,
        softmax_scale: Optional[float] = None,
        num_splits: Optional[int] = None,
        split_tokens: Optional[int] = None,
        causal: bool = True,
        window_left: Optional[int] = None,
        logit_softcap: Optional[float] = None,
        alibi_slopes: Any = None,
        sinks: Any = None,
        k_scale: Any = None,
        v_scale: Any = None,
        q_lens: Any = None,
        layout: Layout = "NHD",
        dtype: Any = None,
    ) -> PlanInfo:
        """What :meth:`decode` would run for these arguments on this handle, without running it.

        Validates like :meth:`decode`; ``out`` may be omitted. The plan holds
        for decodes with the same shapes, split count (or ``split_tokens``)
        and pointer alignment.
        """
        info = _library.FdPlanInfo(struct_size=ctypes.sizeof(_library.FdPlanInfo))
        self._shape_query(
            library().fd_describe_plan,
            info,
            q,
            k,
            v,
            out=out,
            lse=lse,
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
            layout=layout,
            dtype=dtype,
        )
        return PlanInfo(
            backend=Backend(info.backend),
            num_splits=info.num_splits,
            split_tokens=info.split_tokens,
            workspace_bytes=info.workspace_bytes,
            kernel=(info.kernel or b"").decode(),
            merge=_merge(info.merge),
            launches=info.launches,
            blocks=info.blocks,
        )

    def _shape_query(self, function: Any, output: Any, q: Any, k: Any, v: Any, **options: Any) -> None:
        """Calls ``function(handle, args, &output)``, a C query that reads only
        the shapes of the arguments (fd_workspace_size, fd_describe_plan)."""
        with self._lock:
            pointer = self._live_pointer()
            call = self._prepare(q, k, v, return_lse=False, stream=None, size_query=True, **options)
            check(function(pointer, ctypes.byref(call.args), ctypes.byref(output)))

    def reserve_workspace(self, nbytes: int) -> None:
        """Makes the library-owned workspace at least ``nbytes`` (e.g. from :meth:`workspace_size`).

        After this, :meth:`decode` of problems that fit does not allocate, so
        it can be captured in a CUDA graph.
        """
        nbytes = _size(nbytes, "nbytes")
        with self._lock:
            check(library().fd_reserve_workspace(self._live_pointer(), nbytes))

    def set_workspace(self, buffer: Any = None) -> None:
        """Hands the handle a workspace of your own, or (``None``) goes back to library-owned memory.

        ``buffer`` is a contiguous array (any dtype) in the handle's memory
        (NumPy for the CPU backend, a GPU array for CUDA), aligned to 256
        bytes (see :func:`host_workspace`). The handle keeps a reference to
        it until it is replaced.
        """
        with self._lock:
            pointer = self._live_pointer()
            if buffer is None:
                check(library().fd_set_workspace(pointer, None, 0))
                self._workspace = None
                return
            self._check_location("workspace", buffer, *locate(buffer))
            view = view_array(buffer, "workspace", kind="bytes", writable=True)
            if not view.is_contiguous():
                raise refuse(InvalidArgumentError, "workspace: the buffer must be contiguous")
            nbytes = int(np.prod(view.shape, dtype=np.int64)) * view.itemsize
            check(library().fd_set_workspace(pointer, view.pointer or None, nbytes))
            self._workspace = view

    def check_contents(self, stream: Any = None) -> None:
        """Reports a bad ``seq_lens``, ``q_lens`` or ``block_table`` entry that a checked decode found
        (``fd_check_contents``, since 0.3), after waiting for ``stream``.

        For handles created with ``check_contents=True``. On CUDA the checks
        run on the device, asynchronously: this synchronises ``stream`` (the
        one the decodes ran on) and raises what the first bad decode since
        the last report found, then clears the report. On the CPU backend
        :meth:`decode` raises at once, so there is never anything left to
        report here.

        Args:
            stream: CUDA backend: the stream to wait for (an int
                ``cudaStream_t`` or a PyTorch/CuPy/Numba stream). Default:
                PyTorch's current stream on the handle's device when PyTorch
                is imported (the stream :meth:`decode` uses for tensors),
                else the legacy default stream. Ignored by the CPU backend.

        Raises:
            InvalidLengthError: a length outside [0, kv_capacity], or a
                query count outside [0, q_len].
            InvalidBlockTableError: a used page index outside the pool.
            InvalidArgumentError: the handle was created without checks, or
                ``stream`` is being captured into a CUDA graph.
            UnsupportedError: the library is older than 0.3.
        """
        _library.require("fd_check_contents", "Handle.check_contents()")
        stream_value = 0
        if self._backend is Backend.CUDA:
            if stream is not None:
                stream_value = stream_pointer(stream)
            else:
                torch_state = _torch.get()
                if torch_state is not None:
                    stream_value = torch_state.current_stream(self._device)
        with self._lock:
            check(library().fd_check_contents(self._live_pointer(), stream_value or None))

    @overload
    def merge_states(
        self,
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
        self,
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
        self,
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
        """Merges partial attention results by their log-sum-exps (``fd_merge_states``, since 0.3).

        State s is ``outs[s]`` with its natural-log ``lses[s]``: attention
        of the same queries over one part of the keys, as :meth:`decode`
        writes ``out`` and ``lse`` for that part. For every row, with
        ``m = max_s lse_s`` and ``w_s = exp(lse_s - m)``:
        ``out = sum_s w_s out_s / sum_s w_s`` and ``lse = m + log(sum_s w_s)``:
        the attention over all the parts' keys. A state whose LSE is -inf is
        empty (a part with no keys) and is not read, NaN included; a row
        whose states are all empty is zeros with LSE -inf; a NaN (or +inf)
        LSE makes its row NaN. Sums run in state order: the same inputs give
        bitwise the same result.

        The recipes: cascade attention (a prefix shared by many sequences
        decoded once, each sequence's own suffix decoded apart, both with
        ``return_lse=True``, then merged) and context-parallel decode (each
        GPU decodes its shard of the cache with its LSE; the (out, lse)
        pairs are gathered, an all-gather say, and merged).

        Args:
            outs: the states' outputs, a sequence (list or tuple) of 1 to 64
                arrays shaped as :meth:`decode`'s q and out: ``[batch, q_len,
                heads, head_dim]`` (``layout="NHD"``, the default), ``[batch,
                heads, q_len, head_dim]`` (``"HND"``) or ``[batch, heads,
                head_dim]``; float32, float16 or bfloat16, each of its own.
            lses: their LSEs, float32, shaped as :meth:`decode`'s lse: the
                state's shape without head_dim. Errors name the states
                ``states_out[s]`` and ``states_lse[s]``, as the C API does.
            out: where to write the merged output, shaped like the states,
                float32, float16 or bfloat16; allocated like ``outs[0]``
                (same library, device, dtype and shape) if omitted. It may
                be one of ``outs`` itself (the same array): the merge then
                runs in place. Otherwise it must not overlap any input.
            lse: where to write the merged LSE, float32; it may be one of
                ``lses`` itself.
            return_lse: also return lse (allocated like ``outs[0]``, without
                head_dim, in float32, if not given).
            layout: ``"NHD"`` or ``"HND"``: the dimension order of 4-D
                states, out and 3-D LSEs, as in :meth:`decode` (the merge is
                the same row by row either way; the layout names the
                dimensions in errors and limits).
            dtype: what 16-bit integer storage (``uint16`` arrays of bits)
                among the states and out holds: ``"bfloat16"`` or
                ``"float16"``; typed arrays say their own. An ``out``
                allocated like such a state holds what it holds.
            stream: CUDA backend: the stream to enqueue on, as for
                :meth:`decode` (default: PyTorch's current stream for
                PyTorch tensors, else the stream ``outs[0]``'s
                ``__cuda_array_interface__`` names, else the legacy default
                stream). One kernel, no allocation, no synchronisation: it
                may be captured in a CUDA graph. Ignored by the CPU backend.

        Returns:
            ``out``, or ``(out, lse)`` with ``return_lse=True``: arrays of
            ``outs[0]``'s kind unless given.

        Raises:
            FlashDecodeError: a subclass per status, with the library's
                message naming the argument at fault (e.g. a state whose
                shape differs from out's: :class:`InvalidShapeError`; an LSE
                that is not float32: :class:`InvalidDTypeError`); nothing is
                written.
            UnsupportedError: the library is older than 0.3.
            TypeError: ``outs`` or ``lses`` is not a sequence, or holds no array.

        Not a PyTorch custom op: inside ``torch.compile`` the call is a graph
        break (an error with ``fullgraph=True``).
        """
        return self._merge_states(outs, lses, out, lse, return_lse, layout, dtype, stream)

    def _merge_states(
        self, outs: Any, lses: Any, out: Any, lse: Any, return_lse: Any, layout: Any, dtype: Any, stream: Any
    ) -> Any:
        """:meth:`merge_states` with positional arguments (:func:`merge_states` calls it directly)."""
        _library.require("fd_merge_states", "merge_states")
        with self._lock:
            pointer = self._live_pointer()
            call = self._prepare_merge(outs, lses, out, lse, return_lse, layout, dtype, stream)
            check(library().fd_merge_states(pointer, ctypes.byref(call.args), call.stream or None))
        return (call.out, call.lse) if return_lse else call.out

    def append_kv(
        self,
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
        """Writes this step's new keys and values into the cache, converting them to its dtype
        (``fd_append_kv``, since 0.3).

        New token i of sequence b, of length L (``seq_lens[b]``, the length
        *with* the new tokens, as the decode of the same step takes it), goes
        to position ``L - new_len + i``; tokens whose position would be
        negative are not written, nor are pages outside the pool. Nothing
        else of the cache changes. Each element is converted from
        ``x = new / scale`` computed in float32: to float32, float16 or
        bfloat16 by rounding to nearest even; to fp8 E4M3/E5M2 by rounding
        to nearest even and saturating to +-448 / +-57344 (NaN stays NaN);
        to int8 by rounding to nearest even and clamping to [-127, 127]
        (NaN gives 0). With per-token scales, write this step's scales
        first: each written position's scale is read.

        Args:
            k_new, v_new: ``[batch, new_len, kv_heads, head_dim]`` (``"NHD"``),
                ``[batch, kv_heads, new_len, head_dim]`` (``"HND"``), or
                ``[batch, kv_heads, head_dim]`` (new_len 1); float32, float16
                or bfloat16 (each of its own).
            k, v: the cache, written in place, exactly as :meth:`decode`
                takes it (dense, or a page pool with ``block_table``), of any
                cache dtype.
            seq_lens, block_table: as in :meth:`decode`.
            k_scale, v_scale: the scales of an 8-bit cache, in the forms
                :meth:`decode` takes.
            layout: the dimension order of k_new, v_new, k, v (and 3-d scales).
            dtype: names raw storage, as in :meth:`decode`.
            stream: CUDA backend: the stream to enqueue on (default as for
                :meth:`decode`, from ``k``). Ignored by the CPU backend.

        Raises:
            FlashDecodeError: a subclass per status, naming the argument at
                fault; nothing is written.
            UnsupportedError: the library is older than 0.3, or its backend
                cannot append yet.
        """
        _library.require("fd_append_kv", "append_kv")
        with self._lock:
            pointer = self._live_pointer()
            call = self._prepare_append(
                k_new, v_new, k, v, seq_lens, block_table, k_scale, v_scale, layout, dtype, stream
            )
            check(library().fd_append_kv(pointer, ctypes.byref(call.args), call.stream or None))

    def _prepare_append(
        self,
        k_new: Any,
        v_new: Any,
        k: Any,
        v: Any,
        seq_lens: Any,
        block_table: Any,
        k_scale: Any,
        v_scale: Any,
        layout: Any,
        dtype: Any,
        stream: Any,
    ) -> "_PreparedAppend":
        """The C arguments of :meth:`append_kv` (under the lock)."""
        layout = _as_layout(layout)
        on_cuda = self._backend is Backend.CUDA
        stream_value = 0
        if on_cuda:
            stream_value = stream_pointer(stream) if stream is not None else default_stream(k)
        call = _PreparedAppend(args=_library.new_append_args(), stream=stream_value)

        def view(obj: Any, name: str, kind: str = "float", writable: bool = False) -> ArrayView:
            if kind == "int32" and isinstance(obj, (list, tuple)):
                if on_cuda:
                    raise refuse(InvalidArgumentError, f"{name}: a list is host memory; pass an int32 GPU array")
                obj = np.asarray(obj, dtype=np.int32)
            self._check_location(name, obj, *locate(obj))
            found = view_array(obj, name, kind=kind, writable=writable, cuda_stream=stream_value if on_cuda else None)
            self._check_location(name, found.array, found.location, found.device)
            call.views.append(found)
            return found

        k_new_view, v_new_view = view(k_new, "k_new"), view(v_new, "v_new")
        k_view, v_view = view(k, "k", "cache", writable=True), view(v, "v", "cache", writable=True)
        # The new keys and values may each have a type of their own (the cache's, or another):
        # dtype= names raw storage among them, and is checked against the cache only.
        _resolve_float_dtype(dtype, (("k_new", k_new_view), ("v_new", v_new_view)), check_typed=False)
        _resolve_float_dtype(dtype, (("k", k_view), ("v", v_view)))
        paged = block_table is not None
        _fill(call.args.k_new, k_new_view, _query_dims(k_new_view, layout, "k_new"))
        _fill(call.args.v_new, v_new_view, _query_dims(v_new_view, layout, "v_new"))
        _fill(call.args.k, k_view, _cache_dims(k_view, layout, "k", paged))
        _fill(call.args.v, v_view, _cache_dims(v_view, layout, "v", paged))
        _require_cache_dtype(k_view, v_view)
        _fill_scales(call.args, view, k_scale, v_scale, layout, on_cuda)
        if seq_lens is not None:
            lens_view = view(seq_lens, "seq_lens", kind="int32")
            _fill(call.args.seq_lens, lens_view, _own_dims(lens_view, "seq_lens"))
        if block_table is not None:
            table_view = view(block_table, "block_table", kind="int32")
            _fill(call.args.block_table, table_view, _own_dims(table_view, "block_table"))
        return call

    # ---- internals ------------------------------------------------------------

    def _live_pointer(self) -> int:
        if self._pointer is None:
            raise refuse(InvalidHandleError, "this Handle was closed")
        return self._pointer

    def _remember(self, signature: "_Signature", call: _PreparedCall) -> None:
        """Keeps ``call``'s C arguments for later calls of the same signature (under the lock).

        Not when the signature's pointers differ from the ones the full path
        read (the two ways of reading an array disagree: trust neither), nor
        for outputs allocated by a library the fast path cannot read.
        """
        key, pointers = signature
        for name, pointer in zip(_ARGUMENTS, pointers):
            if pointer is not None and call.named[name].pointer != pointer:
                return
        cuda = self._backend is Backend.CUDA
        torch_state = _torch.state
        if cuda and torch_state is None:
            return
        allocated = [found for found in (call.out, call.lse) if found is not None]
        pointer_of = _pointer_reader(type(allocated[0])) if allocated else None
        if allocated and (pointer_of is None or any(type(found) is not type(allocated[0]) for found in allocated)):
            return
        plans = self._plans
        if len(plans) >= _MAX_PLANS:
            del plans[next(iter(plans))]  # the oldest
        plan = plans[key] = _Plan(call, pointer_of, torch_state.current_stream if cuda and torch_state else None)
        self._last = (key, plan)

    def _with_layout_hint(
        self,
        error: FlashDecodeError,
        q: Any,
        k: Any,
        v: Any,
        out: Any,
        lse: Any,
        seq_lens: Any,
        block_table: Any,
        layout: Any,
        dtype: Any,
        alibi_slopes: Any = None,
        sinks: Any = None,
        k_scale: Any = None,
        v_scale: Any = None,
        q_lens: Any = None,
    ) -> FlashDecodeError:
        """``error``, saying so when the arguments only fit the other layout.

        Asks the library itself: the shape-only query fd_workspace_size
        validates the other layout's view of the same arrays as decode would.
        """
        if not isinstance(error, _LAYOUT_ERRORS) or not isinstance(layout, str) or layout.upper() not in LAYOUTS:
            return error
        other: Layout = "HND" if layout.upper() == "NHD" else "NHD"
        try:
            self.workspace_size(
                q, k, v, out=out, lse=lse, seq_lens=seq_lens, block_table=block_table, alibi_slopes=alibi_slopes,
                sinks=sinks, k_scale=k_scale, v_scale=v_scale, q_lens=q_lens, layout=other, dtype=dtype,
            )  # fmt: skip
        except Exception:  # the other layout does not fit either (or cannot be asked): no hint
            return error
        cache = (_PAGE_POOL_SHAPES if block_table is not None else _CACHE_SHAPES)[other]
        hinted = type(error)(
            f"{error.message}; these shapes fit layout={other!r} (q {_QUERY_SHAPES[other]}, k and v {cache}): "
            "did you mean it?"
        )
        hinted.status = error.status
        return hinted

    def _check_location(self, name: str, array: Any, location: str, device: Optional[int]) -> None:
        """Host memory for the CPU backend, the handle's device for CUDA: anything else
        would be dereferenced in the wrong address space."""
        if self._backend is Backend.CPU and location == CUDA:
            raise refuse(
                InvalidArgumentError,
                f"{name}: is in CUDA memory, but this handle runs on the CPU backend; use Handle('cuda')",
            )
        if self._backend is Backend.CUDA:
            if location == HOST:
                raise refuse(
                    InvalidArgumentError,
                    f"{name}: is in host memory ({type(array).__name__}), but this handle runs on "
                    f"CUDA device {self._device}; move it to the GPU",
                )
            if device is not None and device != self._device:
                raise refuse(
                    InvalidArgumentError,
                    f"{name}: is on CUDA device {device}, but this handle runs on device {self._device}",
                )

    def _prepare(
        self,
        q: Any,
        k: Any,
        v: Any,
        *,
        out: Any,
        lse: Any,
        return_lse: bool,
        seq_lens: Any,
        block_table: Any,
        softmax_scale: Optional[float],
        num_splits: Optional[int],
        layout: Layout,
        dtype: Any,
        stream: Any,
        split_tokens: Optional[int] = None,
        causal: Any = True,
        window_left: Optional[int] = None,
        logit_softcap: Optional[float] = None,
        alibi_slopes: Any = None,
        sinks: Any = None,
        k_scale: Any = None,
        v_scale: Any = None,
        q_lens: Any = None,
        size_query: bool = False,
    ) -> _PreparedCall:
        layout = _as_layout(layout)
        on_cuda = self._backend is Backend.CUDA
        stream_value = 0
        if on_cuda and not size_query:
            stream_value = stream_pointer(stream) if stream is not None else default_stream(q)
        call = _PreparedCall(args=_library.new_decode_args(), stream=stream_value)

        def view(obj: Any, name: str, kind: str = "float", writable: bool = False) -> ArrayView:
            if kind == "int32" and isinstance(obj, (list, tuple)):
                if on_cuda:
                    raise refuse(InvalidArgumentError, f"{name}: a list is host memory; pass an int32 GPU array")
                obj = np.asarray(obj, dtype=np.int32)
            # Checked before viewing: exporting through DLPack may already order work on a stream.
            self._check_location(name, obj, *locate(obj))
            found = view_array(obj, name, kind=kind, writable=writable, cuda_stream=stream_value if on_cuda else None)
            self._check_location(name, found.array, found.location, found.device)
            call.views.append(found)
            call.named[name] = found
            return found

        q_view, k_view, v_view = view(q, "q"), view(k, "k", "cache"), view(v, "v", "cache")
        element = _resolve_float_dtype(dtype, (("q", q_view), ("k", k_view), ("v", v_view)))
        paged = block_table is not None
        _fill(call.args.q, q_view, _query_dims(q_view, layout, "q"))
        _fill(call.args.k, k_view, _cache_dims(k_view, layout, "k", paged))
        _fill(call.args.v, v_view, _cache_dims(v_view, layout, "v", paged))
        _require_cache_dtype(k_view, v_view)
        _fill_scales(call.args, view, k_scale, v_scale, layout, on_cuda)

        placeholder_out = out is None and size_query
        if placeholder_out:
            # The size and plan queries read shapes only: the output is
            # described as the contiguous array decode would allocate, at an
            # address apart from every input's bytes (set below, once all are
            # described), which the library validates but never touches.
            shape, _ = _query_dims(q_view, layout, "out")
            _fill(call.args.out, q_view, (shape, _contiguous(shape)))
        else:
            if out is None:
                call.out_allocator = allocator_like(q_view.array, q_view.shape, "out")
                out = call.out_allocator()
            out_view = view(out, "out", writable=True)
            if out_view.dtype is None:  # uint16 storage holds q's 16-bit type
                if element not in (DType.F16, DType.BF16):
                    raise refuse(InvalidDTypeError, f"out: 16-bit integer storage cannot hold {dtype_name(element)}")
                out_view.dtype = element
            _fill(call.args.out, out_view, _query_dims(out_view, layout, "out"))
            call.out = out

        if lse is None and return_lse and not size_query:
            call.lse_allocator = allocator_like(q_view.array, q_view.shape[:-1], "lse", float32=True)
            lse = call.lse_allocator()
        if lse is not None:
            lse_view = view(lse, "lse", writable=True)
            if lse_view.dtype is None:  # 16-bit integer storage: only q, k, v and out may be 16-bit floats
                raise refuse(InvalidDTypeError, "lse: must be float32, not 16-bit integer storage")
            _fill(call.args.lse, lse_view, _lse_dims(lse_view, len(q_view.shape), layout))
            call.lse = lse
        if seq_lens is not None:
            lens_view = view(seq_lens, "seq_lens", kind="int32")
            _fill(call.args.seq_lens, lens_view, _own_dims(lens_view, "seq_lens"))
        if q_lens is not None:
            _library.require("fd_decode_args.q_lens", "q_lens")
            q_lens_view = view(q_lens, "q_lens", kind="int32")
            _fill(call.args.q_lens, q_lens_view, _own_dims(q_lens_view, "q_lens"))
        if block_table is not None:
            table_view = view(block_table, "block_table", kind="int32")
            _fill(call.args.block_table, table_view, _own_dims(table_view, "block_table"))
        for name, vector in (("alibi_slopes", alibi_slopes), ("sinks", sinks)):
            if vector is not None:
                _library.require("fd_decode_args." + name, name)
                if isinstance(vector, (list, tuple)):
                    if on_cuda:
                        raise refuse(InvalidArgumentError, f"{name}: a list is host memory; pass a float32 GPU array")
                    vector = np.asarray(vector, dtype=np.float32)
                vector_view = view(vector, name, kind="float32")
                _fill(getattr(call.args, name), vector_view, _own_dims(vector_view, name))
        call.args.softmax_scale = _softmax_scale(softmax_scale)
        call.args.num_splits = 0 if num_splits is None else _int32(num_splits, "num_splits")
        if split_tokens is not None:
            call.args.split_tokens = _split_tokens(split_tokens)
        if not _causal(causal):
            _library.require("fd_decode_args.mask", "causal=False")
            call.args.mask = _library.MASK_NONE
        if window_left is not None:
            call.args.window_left = _window_left(window_left)
        if logit_softcap is not None:
            call.args.logit_softcap = _logit_softcap(logit_softcap)
        if placeholder_out:
            call.args.out.data = _address_apart(call.args)
        return call

    def _prepare_merge(
        self,
        outs: Any,
        lses: Any,
        out: Any,
        lse: Any,
        return_lse: bool,
        layout: Any,
        dtype: Any,
        stream: Any,
    ) -> _PreparedMerge:
        """The C arguments of :meth:`merge_states` (under the lock)."""
        layout = _as_layout(layout)
        state_outs, state_lses = _state_sequence(outs, "outs"), _state_sequence(lses, "lses")
        count = len(state_outs)
        if len(state_lses) != count:
            raise refuse(
                InvalidArgumentError,
                f"outs and lses: {count} outputs but {len(state_lses)} LSEs; each state is an (out, lse) pair",
            )
        if count == 0:
            raise refuse(InvalidArgumentError, f"num_states must be in [1, {_library.MAX_MERGE_STATES}], got 0")
        on_cuda = self._backend is Backend.CUDA
        stream_value = 0
        if on_cuda:
            stream_value = stream_pointer(stream) if stream is not None else default_stream(state_outs[0])
        explicit = None if dtype is None else as_dtype(dtype)
        if explicit is DType.I32:
            raise refuse(InvalidDTypeError, "dtype: states and out hold float32, float16 or bfloat16, not int32")
        call = _PreparedMerge(
            args=_library.new_merge_args(),
            stream=stream_value,
            states_out=(FdTensor * count)(),
            states_lse=(FdTensor * count)(),
        )

        def view(obj: Any, name: str, writable: bool = False) -> ArrayView:
            # As in _prepare: checked before viewing, since a DLPack export may order work on a stream.
            self._check_location(name, obj, *locate(obj))
            found = view_array(
                obj, name, kind="float", writable=writable, cuda_stream=stream_value if on_cuda else None
            )
            self._check_location(name, found.array, found.location, found.device)
            call.views.append(found)
            return found

        def float_dtype(found: ArrayView, name: str) -> None:
            """Names the float type of 16-bit integer storage, from ``dtype=``."""
            if found.dtype is None:
                if explicit not in (DType.F16, DType.BF16):
                    raise refuse(
                        InvalidDTypeError,
                        f"{name}: 16-bit integer storage needs dtype='bfloat16' or dtype='float16' to say what it holds",
                    )
                found.dtype = explicit

        def lse_view(obj: Any, name: str, writable: bool = False) -> ArrayView:
            found = view(obj, name, writable)
            if found.dtype is None:  # 16-bit integer storage: only outputs may hold 16-bit floats
                raise refuse(InvalidDTypeError, f"{name}: must be float32, not 16-bit integer storage")
            return found

        first: Optional[ArrayView] = None
        for index in range(count):
            name = f"states_out[{index}]"
            found = view(state_outs[index], name)
            float_dtype(found, name)
            _fill(call.states_out[index], found, _merge_dims(found, layout, name, lse=False))
            if first is None:
                first = found
            name = f"states_lse[{index}]"
            found = lse_view(state_lses[index], name)
            _fill(call.states_lse[index], found, _merge_dims(found, layout, name, lse=True))
        assert first is not None

        allocated = out is None
        if allocated:
            out = allocator_like(first.array, first.shape, "out")()
        out_view = view(out, "out", writable=True)
        if out_view.dtype is None and allocated and explicit is None:
            out_view.dtype = first.dtype  # the 16-bit float type the first state's storage holds
        float_dtype(out_view, "out")
        _fill(call.args.out, out_view, _merge_dims(out_view, layout, "out", lse=False))
        call.out = out
        if lse is None and return_lse:
            lse = allocator_like(first.array, first.shape[:-1], "lse", float32=True)()
        if lse is not None:
            found = lse_view(lse, "lse", writable=True)
            _fill(call.args.lse, found, _merge_dims(found, layout, "lse", lse=True))
            call.lse = lse
        call.args.num_states = count
        call.args.states_out = ctypes.cast(call.states_out, ctypes.POINTER(FdTensor))
        call.args.states_lse = ctypes.cast(call.states_lse, ctypes.POINTER(FdTensor))
        return call


# ---- the fast path: per-handle plans keyed by call signatures ------------------

_ndarray = np.ndarray
_modules = sys.modules
_ARGUMENTS = (
    "q", "k", "v", "out", "lse", "seq_lens", "block_table", "alibi_slopes", "sinks", "k_scale", "v_scale", "q_lens",
)  # fmt: skip
_MAX_PLANS = 16
"""Signatures a handle remembers; the oldest is dropped beyond that."""
_LAYOUT_ERRORS = (InvalidShapeError, InvalidHeadCountError, InvalidHeadDimError, UnsupportedError)
_SCALE_TYPES = (float, int)  # bool is refused by the full path: type() is not isinstance()
_VARIANT_TYPES = (type(None), bool, int, float)  # causal, window_left, logit_softcap: exact types only
_DTYPE_ARGUMENT_TYPES = (str, DType)

# (key, data pointers in _ARGUMENTS order; None for an absent argument)
_Signature = Tuple[Tuple[Any, ...], Tuple[Optional[int], ...]]


def _signature(
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
    causal: Any = True,
    window_left: Any = None,
    logit_softcap: Any = None,
    alibi_slopes: Any = None,
    sinks: Any = None,
    k_scale: Any = None,
    v_scale: Any = None,
    q_lens: Any = None,
) -> Optional[_Signature]:
    """The key of a decode call's plan, and its data pointers.

    The key holds everything the binding's checks and the C arguments depend
    on: each array's type, dtype, shape, strides, device (and, for outputs,
    whether it may be written), and the other arguments. None sends the call
    down the full path: arrays other than NumPy arrays or plain PyTorch
    tensors (all of one kind), a NULL pointer, or an argument of a type the
    key does not hold exactly (e.g. a NumPy integer as num_splits).
    """
    if not (
        (softmax_scale is None or type(softmax_scale) in _SCALE_TYPES)
        and (num_splits is None or type(num_splits) is int)
        and (split_tokens is None or type(split_tokens) is int)
        and (dtype is None or type(dtype) in _DTYPE_ARGUMENT_TYPES)
        and type(layout) is str
        and type(causal) in _VARIANT_TYPES
        and type(window_left) in _VARIANT_TYPES
        and type(logit_softcap) in _VARIANT_TYPES
    ):
        return None
    cls = type(q)
    optional = (out, lse, seq_lens, block_table, alibi_slopes, sinks, k_scale, v_scale, q_lens)
    if cls is _ndarray:
        arrays = _numpy_signature(q, k, v, optional)
    else:
        torch_state = _torch.state
        if torch_state is None or cls is not torch_state.Tensor:
            return None
        arrays = _torch_signature(cls, q, k, v, optional)
    if arrays is None:
        return None
    # The types of the variant options are in the key too: True and 1 (or 2 and 2.0) are equal keys.
    options = (
        layout, dtype, softmax_scale, num_splits, split_tokens, bool(return_lse),
        causal, type(causal), window_left, type(window_left), logit_softcap, type(logit_softcap),
    )  # fmt: skip
    return options + arrays[0], arrays[1]


# Whether each optional array of a signature (out, lse, seq_lens, block_table, alibi_slopes, sinks,
# k_scale, v_scale, q_lens) is written.
_OUTPUTS = (True, True, False, False, False, False, False, False, False)


def _numpy_signature(q: Any, k: Any, v: Any, optional: Tuple[Any, ...]) -> Optional[_Signature]:
    """:func:`_signature`'s arrays when all are NumPy arrays: dtype (not the typestr, which
    ml_dtypes' bfloat16 shares with raw void), the real strides, and for outputs writeability."""
    ndarray, data = _ndarray, _numpy_pointer
    if type(k) is not ndarray or type(v) is not ndarray:
        return None
    key: Tuple[Any, ...] = (
        "numpy",
        q.dtype,
        q.shape,
        q.strides,
        k.dtype,
        k.shape,
        k.strides,
        v.dtype,
        v.shape,
        v.strides,
    )
    pointers: Tuple[Optional[int], ...] = (data(q), data(k), data(v))
    for array, output in zip(optional, _OUTPUTS):
        if array is None:
            key += (None,)
            pointers += (None,)
        elif type(array) is ndarray:
            key += (array.dtype, array.shape, array.strides, array.flags.writeable if output else None)
            pointers += (data(array),)
        else:
            return None
    if 0 in pointers:
        return None
    return key, pointers


def _torch_signature(tensor: Any, q: Any, k: Any, v: Any, optional: Tuple[Any, ...]) -> Optional[_Signature]:
    """:func:`_signature`'s arrays when all are plain PyTorch tensors: dtype, shape, strides,
    device, the lazy negative bit (refused), and for outputs requires_grad (inputs are read detached)."""
    if type(k) is not tensor or type(v) is not tensor:
        return None
    key: Tuple[Any, ...] = (
        "torch",
        q.dtype, q.shape, q.stride(), q.device, q.is_neg(),
        k.dtype, k.shape, k.stride(), k.device, k.is_neg(),
        v.dtype, v.shape, v.stride(), v.device, v.is_neg(),
    )  # fmt: skip
    pointers: Tuple[Optional[int], ...] = (q.data_ptr(), k.data_ptr(), v.data_ptr())
    for array, output in zip(optional, _OUTPUTS):
        if array is None:
            key += (None,)
            pointers += (None,)
        elif type(array) is tensor:
            key += (
                array.dtype,
                array.shape,
                array.stride(),
                array.device,
                array.is_neg(),
                output and array.requires_grad,
            )
            pointers += (array.data_ptr(),)
        else:
            return None
    if 0 in pointers:
        return None
    return key, pointers


def _numpy_interface_pointer(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]  # type: ignore[no-any-return]


def _numpy_pointer_reader() -> Callable[[np.ndarray], int]:
    """How to read an ndarray's data pointer: ``__array_interface__`` builds a
    dict of seven entries per call, the costliest step of a fast call. NumPy's
    array object (``PyArrayObject_fields``) holds the ``data`` pointer right
    after the object header, where ``PyArray_DATA`` in every compiled NumPy
    extension reads it: read it there, when the interpreter's ``id`` is the
    object's address (CPython) and the read agrees with ``__array_interface__``
    on arrays of every sort (views, read-only, empty); else use the interface.
    """
    offset = object.__basicsize__  # sizeof(PyObject): the header
    read = ctypes.c_void_p.from_address

    def pointer(array: np.ndarray) -> int:
        return read(id(array) + offset).value or 0

    base = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    frozen = np.frombuffer(b"flashdecode", dtype=np.uint8)
    samples = (base, base[1:, ::2, 1:], base.transpose(2, 0, 1), frozen, np.zeros(0, np.int32), np.empty((3, 0)))
    try:
        agree = all(pointer(sample) == _numpy_interface_pointer(sample) for sample in samples)
    except (ValueError, OverflowError):  # an id that is no address
        agree = False
    return pointer if agree else _numpy_interface_pointer


_numpy_pointer = _numpy_pointer_reader()


def _pointer_reader(cls: type) -> Optional[Callable[[Any], int]]:
    """How to read the data pointer of arrays of ``cls`` that decode allocated."""
    if cls is _ndarray:
        return _numpy_pointer
    torch_state = _torch.state
    if torch_state is None:
        return None
    tensor: Any = torch_state.Tensor
    data_ptr: Callable[[Any], int] = tensor.data_ptr
    return data_ptr if cls is tensor else None


class _Plan:
    """The C arguments of one call signature, built by the full path; each call writes only the data pointers."""

    __slots__ = (
        "args",
        "address",
        "q",
        "k",
        "v",
        "out",
        "lse",
        "seq_lens",
        "block_table",
        "alibi_slopes",
        "sinks",
        "k_scale",
        "v_scale",
        "q_lens",
        "new_out",
        "new_lse",
        "pointer_of",
        "cuda",
        "current_stream",
    )

    def __init__(
        self,
        call: _PreparedCall,
        pointer_of: Optional[Callable[[Any], int]],
        current_stream: Optional[Callable[[int], int]],
    ) -> None:
        self.args = FdDecodeArgs.from_buffer_copy(call.args)
        self.address = ctypes.addressof(self.args)

        def data(name: str) -> ctypes.c_void_p:
            """The ``data`` member of the fd_tensor ``name`` in ``args``, as a ctypes object sharing its memory."""
            offset = getattr(FdDecodeArgs, name).offset + FdTensor.data.offset
            return ctypes.c_void_p.from_buffer(self.args, offset)

        def optional(name: str) -> Optional[ctypes.c_void_p]:
            return data(name) if name in call.named else None

        self.q, self.k, self.v, self.out = data("q"), data("k"), data("v"), data("out")
        self.lse, self.seq_lens, self.block_table = optional("lse"), optional("seq_lens"), optional("block_table")
        self.alibi_slopes, self.sinks = optional("alibi_slopes"), optional("sinks")
        self.k_scale, self.v_scale = optional("k_scale"), optional("v_scale")
        self.q_lens = optional("q_lens")
        # The fast path calls these only when the signature says the output was allocated.
        self.new_out: Callable[[], Any] = call.out_allocator or _unreachable
        self.new_lse: Callable[[], Any] = call.lse_allocator or _unreachable
        self.pointer_of: Callable[[Any], int] = pointer_of or _unreachable
        self.cuda = current_stream is not None
        self.current_stream: Callable[[int], int] = current_stream or _unreachable


def _unreachable(*args: Any) -> Any:
    raise AssertionError("flashdecode: a plan was used against its signature")


def _raw_decode(lib: ctypes.CDLL) -> Any:
    """``fd_decode`` taking plain addresses: no ``byref`` per call (ints convert fastest)."""
    prototype = ctypes.CFUNCTYPE(_library.c_enum, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
    return prototype(("fd_decode", lib))


# ---- errors said plainly -------------------------------------------------------------


def _no_gpu_message(message: str) -> str:
    """The library's NO_DEVICE message, saying plainly when this machine has no usable GPU at all."""
    if "built without CUDA" in message:
        return message + "; use Handle('cpu'), or a libflashdecode built with CUDA (-DFLASHDECODE_CUDA=ON)"
    marker = "no CUDA device is usable ("
    start = message.find(marker)
    if start < 0:  # a device ordinal out of range, or a GPU this build cannot run on: the library says it
        return message
    why = _gpu_absence()
    if why is None:  # a driver that sees GPUs: the runtime's reason is the real one
        return message
    runtime = message[start + len(marker) :].rstrip(")")
    return f"{message[:start]}this machine has no usable GPU: {why} (the CUDA runtime says: {runtime})"


def _gpu_absence() -> Optional[str]:
    """Why the NVIDIA driver offers no GPU, or None if it offers some (asked only after a failure)."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "no NVIDIA driver is installed (libcuda.so.1 cannot be loaded)"
    try:
        cu_init, cu_count = driver.cuInit, driver.cuDeviceGetCount
    except AttributeError:
        return None
    cu_init.argtypes, cu_init.restype = [ctypes.c_uint], ctypes.c_int
    cu_count.argtypes, cu_count.restype = [ctypes.POINTER(ctypes.c_int)], ctypes.c_int
    result = cu_init(0)
    if result == 100:  # CUDA_ERROR_NO_DEVICE
        return "the NVIDIA driver finds no GPU"
    if result == 34:  # CUDA_ERROR_STUB_LIBRARY
        return "no NVIDIA driver is installed (the libcuda.so.1 found is the CUDA toolkit's placeholder, not a driver)"
    if result != 0:
        return f"the NVIDIA driver does not start (cuInit error {result})"
    count = ctypes.c_int(0)
    if cu_count(ctypes.byref(count)) == 0 and count.value == 0:
        return "the NVIDIA driver finds no GPU"
    return None


def _dtype_choices(dtype: Any) -> Tuple[Optional[DType], Optional[DType]]:
    """What ``dtype=`` names: (the 16- or 32-bit float type, the 8-bit cache type), either None.

    One name, or a pair (list or tuple) of a float name and an 8-bit one."""
    if dtype is None:
        return None, None
    wide: Optional[DType] = None
    narrow: Optional[DType] = None
    for value in dtype if isinstance(dtype, (tuple, list)) else (dtype,):
        found = as_dtype(value)
        if found is DType.I32:
            raise refuse(InvalidDTypeError, "dtype: q, k and v hold float32, float16 or bfloat16, not int32")
        if found in CACHE_DTYPES_8_BIT:
            if narrow is not None and narrow is not found:
                raise refuse(
                    InvalidDTypeError, f"dtype: names two 8-bit types, {dtype_name(narrow)} and {dtype_name(found)}"
                )
            narrow = found
        else:
            if wide is not None and wide is not found:
                raise refuse(
                    InvalidDTypeError, f"dtype: names two float types, {dtype_name(wide)} and {dtype_name(found)}"
                )
            wide = found
    return wide, narrow


def _resolve_float_dtype(
    dtype: Any, views: Tuple[Tuple[str, ArrayView], ...], check_typed: bool = True
) -> Optional[DType]:
    """Names the type of raw storage (16-bit: a float type; 8-bit, k and v: a cache type) from
    ``dtype=``, and (``check_typed``) checks what it names against typed arrays; returns the first
    array's type."""
    wide, narrow = _dtype_choices(dtype)
    for name, found in views:
        if found.dtype is None:
            if found.itemsize == 1:
                if narrow is None:
                    raise refuse(
                        InvalidDTypeError,
                        f"{name}: 8-bit integer storage (uint8) needs dtype='float8_e4m3fn', 'float8_e5m2' or "
                        "'int8' to say what it holds",
                    )
                found.dtype = narrow
            else:
                if wide not in (DType.F16, DType.BF16):
                    raise refuse(
                        InvalidDTypeError,
                        f"{name}: 16-bit integer storage needs dtype='bfloat16' or dtype='float16' to say what it holds",
                    )
                found.dtype = wide
        elif not check_typed:
            continue
        elif found.dtype in CACHE_DTYPES_8_BIT:
            if narrow is not None and found.dtype is not narrow:
                raise refuse(
                    InvalidDTypeError,
                    f"{name}: holds {dtype_name(found.dtype)}, but dtype={dtype_name(narrow)} was given",
                )
        elif wide is not None and found.dtype is not wide:
            raise refuse(
                InvalidDTypeError,
                f"{name}: holds {dtype_name(found.dtype)}, but dtype={dtype_name(wide)} was given",
            )
    return views[0][1].dtype


def _require_cache_dtype(k_view: ArrayView, v_view: ArrayView) -> None:
    """An 8-bit cache needs a 0.3 library: an older one would refuse it by its dtype number."""
    for found in (k_view, v_view):
        if found.dtype in CACHE_DTYPES_8_BIT:
            assert found.dtype is not None
            name = found.dtype.name.lower()
            _library.require(f"fd_dtype.{name}", f"an {dtype_name(found.dtype)} cache")


def _fill_scales(
    args: Any, view: Callable[..., ArrayView], k_scale: Any, v_scale: Any, layout: str, on_cuda: bool
) -> None:
    """Describes ``k_scale``/``v_scale`` in ``args`` (fd_decode_args or fd_append_args, whose k is
    filled): a size-1 array broadcast with strides of 0, a ``[kv_heads]`` one along the heads, a 3-d
    one as it is (in ``layout``'s order). Nothing is copied but Python numbers and lists."""
    cache = tuple(args.k.shape[:3])
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        if scale is None:
            continue
        _library.require("fd_decode_args." + name, name)
        if isinstance(scale, (numbers.Real, list, tuple)) and not isinstance(scale, bool):
            if on_cuda:
                raise refuse(
                    InvalidArgumentError, f"{name}: a Python number or list is host memory; pass a float32 GPU array"
                )
            scale = np.asarray(scale, dtype=np.float32)
        found = view(scale, name, "float32")
        _fill(getattr(args, name), found, _scale_dims(found, cache, layout, name))


def _scale_dims(view: ArrayView, cache: Tuple[int, ...], layout: str, name: str) -> Dims:
    size = 1
    for extent in view.shape:
        size *= extent
    if size == 1:  # per tensor
        return cache, (0, 0, 0)
    if len(view.shape) == 1:  # per KV head
        return (cache[0], cache[1], view.shape[0]), (0, 0, view.strides[0])
    if len(view.shape) == 3:  # per token and head
        return _c_order(view, layout)
    expected = _SCALE_SHAPES[layout]
    raise refuse(
        InvalidShapeError,
        f"{name}: expected one scale (size 1), [kv_heads] or {expected} (layout {layout!r}), got shape {view.shape}",
    )


_SCALE_SHAPES = {"NHD": "[batch, kv_len, kv_heads]", "HND": "[batch, kv_heads, kv_len]"}


# Stands in for the data of an empty array whose producer gives it no
# address (PyTorch, CuPy: 0): the library refuses NULL even where it reads
# nothing, and wants element alignment, which 8 bytes give every dtype.
_EMPTY_DATA = ctypes.c_uint64(0)
_EMPTY_ADDRESS = ctypes.addressof(_EMPTY_DATA)


def _fill(tensor: FdTensor, view: ArrayView, dims: Dims) -> None:
    shape, strides = dims
    assert view.dtype is not None
    if not view.pointer and 0 in shape:
        tensor.data = ctypes.addressof(_EMPTY_DATA)
    else:
        tensor.data = view.pointer or None
    tensor.dtype = int(view.dtype)
    tensor.ndim = len(shape)
    for axis, (extent, stride) in enumerate(zip(shape, strides)):
        tensor.shape[axis] = extent
        tensor.strides[axis] = stride


_ELEMENT_BYTES: Dict[int, int] = {
    DType.F32: 4,
    DType.F16: 2,
    DType.BF16: 2,
    DType.I32: 4,
    DType.E4M3: 1,
    DType.E5M2: 1,
    DType.I8: 1,
}
_ADDRESS_LIMIT = 2**63  # below any sign or address-space trouble on 64-bit Linux


def _extent_bytes(tensor: FdTensor) -> int:
    """Bytes of a described tensor from its first element to the end of its furthest one; 0 if it is empty."""
    furthest = 0
    for axis in range(tensor.ndim):
        extent = int(tensor.shape[axis])
        if extent <= 0:
            return 0
        furthest += (extent - 1) * int(tensor.strides[axis])
    return (furthest + 1) * _ELEMENT_BYTES.get(int(tensor.dtype), 4)


def _address_apart(args: FdDecodeArgs) -> int:
    """An address for a size query's stand-in output (``args.out``, described but for its data)
    whose bytes overlap no input's, aligned as a fresh allocation is: the library refuses an output
    that overlaps an input other than as ``out`` = ``q`` exactly, and plans the same for any out."""
    inputs: List[Tuple[int, int]] = []
    for tensor in (
        args.q, args.k, args.v, args.seq_lens, args.block_table, args.alibi_slopes, args.sinks, args.k_scale,
        args.v_scale, args.q_lens,
    ):  # fmt: skip
        start = int(tensor.data or 0)
        size = _extent_bytes(tensor) if start else 0
        if size > 0:
            inputs.append((start, start + size))
    alignment = _library.WORKSPACE_ALIGNMENT
    if not inputs:
        return alignment
    size = _extent_bytes(args.out)
    above = -(-max(end for _, end in inputs) // alignment) * alignment
    if above + size <= _ADDRESS_LIMIT:
        return above
    below = (min(start for start, _ in inputs) - size) // alignment * alignment
    return below if below >= alignment else above  # nowhere apart: an input's strides span the address space


def _contiguous(shape: Tuple[int, ...]) -> Tuple[int, ...]:
    """Row-major element strides of ``shape``."""
    strides, step = [], 1
    for extent in reversed(shape):
        strides.append(step)
        step *= max(1, extent)
    return tuple(reversed(strides))


def _c_order(view: ArrayView, layout: str) -> Dims:
    """(shape, strides) in the C order: NHD as is, HND with dimensions 1 and 2 swapped."""
    shape, strides = view.shape, view.strides
    if layout == "HND":
        order = (0, 2, 1) + tuple(range(3, len(shape)))
        return tuple(shape[i] for i in order), tuple(strides[i] for i in order)
    return shape, strides


def _query_dims(view: ArrayView, layout: str, name: str) -> Dims:
    if len(view.shape) == 3:  # [batch, heads, head_dim]: q_len 1 inserted
        (batch, heads, head_dim), (s_batch, s_heads, s_dim) = view.shape, view.strides
        return (batch, 1, heads, head_dim), (s_batch, 0, s_heads, s_dim)
    if len(view.shape) == 4:
        return _c_order(view, layout)
    raise refuse(
        InvalidShapeError,
        f"{name}: expected {_QUERY_SHAPES[layout]} (layout {layout!r}) or [batch, heads, head_dim], got shape {view.shape}",
    )


def _cache_dims(view: ArrayView, layout: str, name: str, paged: bool) -> Dims:
    if len(view.shape) == 4:
        return _c_order(view, layout)
    expected = (_PAGE_POOL_SHAPES if paged else _CACHE_SHAPES)[layout]
    raise refuse(InvalidShapeError, f"{name}: expected {expected} (layout {layout!r}), got shape {view.shape}")


def _lse_dims(view: ArrayView, query_ndim: int, layout: str) -> Dims:
    if query_ndim == 3 and len(view.shape) == 2:
        (batch, heads), (s_batch, s_heads) = view.shape, view.strides
        return (batch, 1, heads), (s_batch, 0, s_heads)
    if query_ndim == 4 and len(view.shape) == 3:
        return _c_order(view, layout)
    expected = "[batch, heads]" if query_ndim == 3 else f"{_LSE_SHAPES[layout]} (layout {layout!r})"
    raise refuse(InvalidShapeError, f"lse: expected {expected}, got shape {view.shape}")


_MERGE_SHAPES = {"NHD": "[batch, q_len, heads, head_dim]", "HND": "[batch, heads, q_len, head_dim]"}
_MERGE_LSE_SHAPES = {"NHD": "[batch, q_len, heads]", "HND": "[batch, heads, q_len]"}


def _merge_dims(view: ArrayView, layout: str, name: str, *, lse: bool) -> Dims:
    """A merge state's (or the merged) output or LSE in the C order: as :meth:`Handle.decode`
    reads q and lse, with q_len any length; the 3-D (LSE: 2-D) form has q_len 1."""
    ndim = len(view.shape)
    if ndim == (2 if lse else 3):  # q_len 1 inserted
        shape, strides = view.shape, view.strides
        return (shape[0], 1) + tuple(shape[1:]), (strides[0], 0) + tuple(strides[1:])
    if ndim == (3 if lse else 4):
        return _c_order(view, layout)
    expected = (
        f"{_MERGE_LSE_SHAPES[layout]} (layout {layout!r}) or [batch, heads]"
        if lse
        else f"{_MERGE_SHAPES[layout]} (layout {layout!r}) or [batch, heads, head_dim]"
    )
    raise refuse(InvalidShapeError, f"{name}: expected {expected}, got shape {view.shape}")


def _state_sequence(value: Any, name: str) -> List[Any]:
    """``outs`` or ``lses`` of :meth:`Handle.merge_states` as a list: a sequence of arrays, not one array."""
    if isinstance(value, (str, bytes)) or not isinstance(value, collections.abc.Sequence):
        raise TypeError(
            f"{name}: expected a sequence (list or tuple) of arrays, one per state, got {type(value).__name__}"
            + ("; for states stacked in one array, pass list(array)" if hasattr(value, "shape") else "")
        )
    return list(value)


def _own_dims(view: ArrayView, name: str) -> Dims:
    if len(view.shape) > _library.MAX_DIMS:
        raise refuse(InvalidShapeError, f"{name}: {len(view.shape)} dimensions, at most {_library.MAX_DIMS}")
    return view.shape, view.strides


def _as_backend(value: Union[Backend, str]) -> Backend:
    if isinstance(value, Backend):
        return value
    if isinstance(value, str) and value.upper() in Backend.__members__:
        return Backend[value.upper()]
    raise refuse(InvalidArgumentError, f"backend: expected 'auto', 'cpu' or 'cuda', got {value!r}")


def _as_layout(value: Any) -> Layout:
    if isinstance(value, str) and value.upper() in LAYOUTS:
        return cast(Layout, value.upper())
    raise refuse(InvalidArgumentError, f"layout: expected 'NHD' or 'HND', got {value!r}")


def _int32(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise refuse(InvalidArgumentError, f"{name}: expected an int, got {type(value).__name__}")
    if not -(2**31) <= int(value) < 2**31:
        raise refuse(InvalidArgumentError, f"{name}: {value} does not fit in 32 bits")
    return int(value)


def _split_tokens(value: Any) -> int:
    """``split_tokens`` for fd_decode_args: an int; a non-zero one needs a 0.3 library (the library checks its range)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise refuse(InvalidArgumentError, f"split_tokens: expected an int, got {type(value).__name__}")
    if not -(2**63) <= int(value) < 2**63:
        raise refuse(InvalidArgumentError, f"split_tokens: {value} does not fit in 64 bits")
    if value:
        _library.require("fd_decode_args.split_tokens", "split_tokens")
    return int(value)


def _causal(value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise refuse(InvalidArgumentError, f"causal: expected a bool, got {type(value).__name__}")
    return bool(value)


def _window_left(value: Any) -> int:
    """``window_left`` for fd_decode_args: an int > 0 (None, not 0, means no window); needs a 0.3 library."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise refuse(InvalidArgumentError, f"window_left: expected an int, got {type(value).__name__}")
    if int(value) <= 0:
        raise refuse(
            InvalidArgumentError,
            f"window_left: must be a positive number of keys, got {int(value)}; None means no window",
        )
    _library.require("fd_decode_args.window_left", "window_left")
    return min(int(value), 2**63 - 1)  # a window beyond every position is no window: the library says so too


def _logit_softcap(value: Any) -> float:
    """``logit_softcap`` for fd_decode_args (a C float): finite and > 0 in float32 (None, not 0, means no cap)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise refuse(InvalidArgumentError, f"logit_softcap: expected a float, got {type(value).__name__}")
    try:
        number = float(value)
    except OverflowError:  # an int beyond every float
        number = math.inf
    with np.errstate(over="ignore"):  # a value beyond float32 becomes inf, refused below
        as_float32 = float(np.float32(number))
    if not math.isfinite(as_float32) or as_float32 <= 0.0:
        raise refuse(
            InvalidArgumentError,
            f"logit_softcap: must be finite and positive in float32, got {number:g}; None means no cap",
        )
    _library.require("fd_decode_args.logit_softcap", "logit_softcap")
    return as_float32


def _size(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= int(value) < 2**63:
        raise refuse(InvalidArgumentError, f"{name}: expected a byte count (an int >= 0), got {value!r}")
    return int(value)


def _softmax_scale(value: Optional[float]) -> float:
    if value is None:
        return 0.0  # the C API's "1/sqrt(head_dim)"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise refuse(InvalidArgumentError, f"softmax_scale: expected a float, got {type(value).__name__}")
    if float(value) == 0.0:
        raise refuse(InvalidArgumentError, "softmax_scale: must not be 0; None selects 1/sqrt(head_dim)")
    return float(value)


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


# ---- PyTorch: the custom op and torch.compile -------------------------------------


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
