# SPDX-License-Identifier: Apache-2.0
"""Decode handles: :class:`Handle` (decode, workspace, plans, merges, appends) and what it reports."""

from __future__ import annotations

import ctypes
import enum
import threading
from dataclasses import dataclass
from typing import Any, Dict, List, Literal, Optional, Sequence, Tuple, TypeVar, Union, overload

import numpy as np

from . import _library, _torch
from ._arrays import (
    CUDA,
    HOST,
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
from ._describe import (
    LAYOUTS,
    _CACHE_SHAPES,
    _EMPTY_ADDRESS,
    _PAGE_POOL_SHAPES,
    _QUERY_SHAPES,
    Layout,
    _PreparedAppend,
    _PreparedCall,
    _PreparedMerge,
    _address_apart,
    _as_layout,
    _cache_dims,
    _causal,
    _contiguous,
    _fill,
    _fill_scales,
    _int32,
    _logit_softcap,
    _lse_dims,
    _merge_dims,
    _own_dims,
    _query_dims,
    _require_cache_dtype,
    _resolve_float_dtype,
    _size,
    _softmax_scale,
    _split_tokens,
    _state_sequence,
    _window_left,
)
from ._errors import (
    FlashDecodeError,
    InvalidArgumentError,
    InvalidDTypeError,
    InvalidHandleError,
    InvalidHeadCountError,
    InvalidHeadDimError,
    InvalidShapeError,
    InvalidSplitsError,
    NoDeviceError,
    UnsupportedError,
    error_from_status,
    refuse,
)
from ._library import FdTensor, check, last_error_message, library
from ._signature import (
    _ARGUMENTS,
    _MAX_PLANS,
    _Plan,
    _Signature,
    _modules,
    _ndarray,
    _pointer_reader,
    _raw_decode,
    _signature,
)
from ._torch_compile import _compiled_decode

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


class Schedule(enum.IntEnum):
    """``fd_schedule``: how a decode lays its splits out over the batch (since 0.3). Values are pinned."""

    FIXED = 0
    """``num_splits`` splits of ``split_tokens`` keys for every (sequence, KV head), in index order."""
    LONGEST_FIRST = 1
    """CUDA: the fixed splits, handed out longest sequence first by a one-block kernel ahead (one more launch)."""
    FITTED = 2
    """CUDA: splits whose length the device fits to the lengths at run time (few (sequence, KV head) pairs)."""
    BALANCED = 3
    """CUDA: every thread block takes an equal share of the batch's keys; ``num_splits`` is 0."""


def _schedule(value: int) -> Union[Schedule, int]:
    """``fd_schedule`` as a :class:`Schedule`, or the plain number for a value a later library added."""
    try:
        return Schedule(value)
    except ValueError:
        return int(value)


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
        launches: CUDA kernels per decode (1 to 3, one more when checking contents); 0 on the CPU.
        blocks: CUDA thread blocks of the split kernel; CPU tasks of the split pass.
        schedule: how the splits are laid out over the batch (a plain int for a kind a later
            library added; :attr:`Schedule.FIXED` from a 0.2 library).
    """

    backend: "Backend"
    num_splits: int
    split_tokens: int
    workspace_bytes: int
    kernel: str
    merge: Union[Merge, int]
    launches: int
    blocks: int
    schedule: Union[Schedule, int]


def host_workspace(nbytes: int) -> np.ndarray:
    """An uninitialised NumPy ``uint8`` buffer of ``nbytes``, aligned as :meth:`Handle.set_workspace` requires."""
    nbytes = _size(nbytes, "nbytes")
    alignment = _library.WORKSPACE_ALIGNMENT
    raw = np.empty(nbytes + alignment, dtype=np.uint8)
    offset = -raw.__array_interface__["data"][0] % alignment
    # NumPy gives an empty slice its base's address: cut one byte, then trim, to keep the aligned one.
    return raw[offset : offset + max(nbytes, 1)][:nbytes]


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
            schedule=_schedule(info.schedule),
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
            return self._view(call.views, obj, name, kind, writable, stream_value)

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

    def _view(self, keep: List[ArrayView], obj: Any, name: str, kind: str, writable: bool, stream: int) -> ArrayView:
        """One argument of a call as the C API takes it, checked to be where this handle
        runs and kept alive in ``keep``. An int32 argument may be a list (host memory)."""
        on_cuda = self._backend is Backend.CUDA
        if kind == "int32" and isinstance(obj, (list, tuple)):
            if on_cuda:
                raise refuse(InvalidArgumentError, f"{name}: a list is host memory; pass an int32 GPU array")
            obj = np.asarray(obj, dtype=np.int32)
        # Checked before viewing: exporting through DLPack may already order work on a stream.
        self._check_location(name, obj, *locate(obj))
        found = view_array(obj, name, kind=kind, writable=writable, cuda_stream=stream if on_cuda else None)
        self._check_location(name, found.array, found.location, found.device)
        keep.append(found)
        return found

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
            found = self._view(call.views, obj, name, kind, writable, stream_value)
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
            lse_view = view(lse, "lse", "float32", writable=True)  # float32 only: no raw storage
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
        call.args.num_splits = 0 if num_splits is None else _int32(num_splits, "num_splits", InvalidSplitsError)
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

        def view(obj: Any, name: str, kind: str = "float", writable: bool = False) -> ArrayView:
            return self._view(call.views, obj, name, kind, writable, stream_value)

        def float_dtype(found: ArrayView, name: str) -> None:
            """Names the float type of 16-bit integer storage, from ``dtype=``."""
            if found.dtype is None:
                if explicit not in (DType.F16, DType.BF16):
                    raise refuse(
                        InvalidDTypeError,
                        f"{name}: 16-bit integer storage needs dtype='bfloat16' or dtype='float16' to say what it holds",
                    )
                found.dtype = explicit

        first: Optional[ArrayView] = None
        for index in range(count):
            name = f"states_out[{index}]"
            found = view(state_outs[index], name)
            float_dtype(found, name)
            _fill(call.states_out[index], found, _merge_dims(found, layout, name, lse=False))
            if first is None:
                first = found
            name = f"states_lse[{index}]"
            found = view(state_lses[index], name, kind="float32")
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
            found = view(lse, "lse", writable=True, kind="float32")
            _fill(call.args.lse, found, _merge_dims(found, layout, "lse", lse=True))
            call.lse = lse
        call.args.num_states = count
        call.args.states_out = ctypes.cast(call.states_out, ctypes.POINTER(FdTensor))
        call.args.states_lse = ctypes.cast(call.states_lse, ctypes.POINTER(FdTensor))
        return call


_LAYOUT_ERRORS = (InvalidShapeError, InvalidHeadCountError, InvalidHeadDimError, UnsupportedError)


def _as_backend(value: Union[Backend, str]) -> Backend:
    if isinstance(value, Backend):
        return value
    if isinstance(value, str) and value.upper() in Backend.__members__:
        return Backend[value.upper()]
    raise refuse(InvalidArgumentError, f"backend: expected 'auto', 'cpu' or 'cuda', got {value!r}")


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
