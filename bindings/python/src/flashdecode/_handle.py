# SPDX-License-Identifier: Apache-2.0
"""Decode handles, the decode call, and :func:`flash_decode`, a drop-in for the Triton split-K reference kernel."""

from __future__ import annotations

import ctypes
import enum
import numbers
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np

from . import _library
from ._arrays import (
    CUDA,
    HOST,
    ArrayView,
    DType,
    allocate_like,
    as_dtype,
    default_stream,
    dtype_name,
    locate,
    stream_pointer,
    view_array,
)
from ._errors import (
    InvalidArgumentError,
    InvalidDTypeError,
    InvalidHandleError,
    InvalidShapeError,
    refuse,
)
from ._library import FdDecodeArgs, FdTensor, check, library


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
        num_splits: splits of the KV sequence (requested, or the planner's choice).
        split_tokens: KV tokens of each split.
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


LAYOUTS = ("NHD", "HND")
"""Dimension orders: ``"NHD"`` puts the sequence before the heads (q
``[batch, 1, heads, head_dim]``, k/v ``[batch, kv_len, kv_heads, head_dim]``,
the C API's order); ``"HND"`` puts the heads first (the order of the Triton
split-K reference kernel and of PyTorch SDPA). Any other layout is a strided view of one of these."""

_QUERY_SHAPES = {"NHD": "[batch, 1, heads, head_dim]", "HND": "[batch, heads, 1, head_dim]"}
_CACHE_SHAPES = {"NHD": "[batch, kv_len, kv_heads, head_dim]", "HND": "[batch, kv_heads, kv_len, head_dim]"}
_PAGE_POOL_SHAPES = {
    "NHD": "[num_pages, page_size, kv_heads, head_dim]",
    "HND": "[num_pages, kv_heads, page_size, head_dim]",
}
_LSE_SHAPES = {"NHD": "[batch, 1, heads]", "HND": "[batch, heads, 1]"}

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
    out: Any = None
    lse: Any = None


class Handle:
    """A decode handle: a backend, its device, and a workspace reused across calls.

    Create one per thread (or per CUDA stream) and reuse it; it is a context
    manager, and :meth:`close` (or garbage collection) destroys it and frees
    its library-owned workspace. Calls on one handle are serialised by a lock,
    so sharing one between threads is safe but not concurrent.

    Args:
        backend: ``"auto"`` (CUDA when the library can use the device, else
            the CPU), ``"cpu"`` or ``"cuda"``; or a :class:`Backend`.
        device: CUDA device ordinal for the CUDA backend.
        num_threads: worker threads of the CPU backend; 0 uses every core.

    Raises:
        NoDeviceError: CUDA was asked for but the device or CUDA support is missing.
        InvalidArgumentError: a bad backend, device or thread count.
    """

    def __init__(self, backend: Union[Backend, str] = Backend.AUTO, *, device: int = 0, num_threads: int = 0) -> None:
        self._pointer: Optional[int] = None  # first, so that __del__ works if creation fails
        self._lock = threading.Lock()
        self._workspace: Optional[ArrayView] = None
        lib = library()
        options = _library.new_options()
        options.backend = _as_backend(backend)
        options.device = _int32(device, "device")
        options.num_threads = _int32(num_threads, "num_threads")
        pointer = ctypes.c_void_p()
        check(lib.fd_create(ctypes.byref(pointer), ctypes.byref(options)))
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
        layout: str = "NHD",
        dtype: Any = None,
        stream: Any = None,
    ) -> Any:
        """Decode attention: one query token per sequence against its KV cache.

        ``out[b, h] = softmax(scale * q[b, h] . K[b, :len_b, g]) V[b, :len_b, g]``
        where g is the KV head of query head h's group (GQA; MQA with one KV head).

        Args:
            q: queries, ``[batch, 1, heads, head_dim]`` (``layout="NHD"``),
                ``[batch, heads, 1, head_dim]`` (``"HND"``), or
                ``[batch, heads, head_dim]``.
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
            block_table: int32 ``[batch, max_pages]`` page indices: k and v
                are then a paged cache.
            softmax_scale: multiplies q.k; None means 1/sqrt(head_dim).
            num_splits: KV splits; None (or 0) lets the library choose.
            layout: ``"NHD"`` or ``"HND"``, see :data:`LAYOUTS`.
            dtype: the element type of q, k and v when their storage does not
                say it: ``"bfloat16"`` or ``"float16"`` for ``uint16`` arrays
                holding the bits.
            stream: CUDA backend: the stream to enqueue on (an int
                ``cudaStream_t`` or a PyTorch/CuPy/Numba stream). Default: the
                stream q's ``__cuda_array_interface__`` names, else PyTorch's
                current stream, else the legacy default stream. The call is
                asynchronous on it: the arrays must stay alive until the
                stream has run it. With a stream other than the one your
                array library allocates on, a temporary argument (``k.half()``
                inline) can go back to that library's cache and be reused
                while the kernel still reads it: keep such arrays referenced
                (or ``record_stream`` them, in PyTorch) until the stream is
                done. Ignored by the CPU backend.

        Returns:
            ``out``, or ``(out, lse)`` with ``return_lse=True``.

        Raises:
            FlashDecodeError: a subclass per status, with the library's
                message naming the argument at fault; nothing is written.
            TypeError: an argument is not an array at all.
        """
        with self._lock:
            pointer = self._live_pointer()
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
                layout=layout,
                dtype=dtype,
                stream=stream,
            )
            check(library().fd_decode(pointer, ctypes.byref(call.args), call.stream or None))
        return (call.out, call.lse) if return_lse else call.out

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
        layout: str = "NHD",
        dtype: Any = None,
    ) -> int:
        """Bytes of workspace :meth:`decode` needs for these arguments on this handle.

        Depends only on shapes and ``num_splits``; validates like :meth:`decode`.
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
        layout: str = "NHD",
        dtype: Any = None,
    ) -> PlanInfo:
        """What :meth:`decode` would run for these arguments on this handle, without running it.

        Validates like :meth:`decode`; ``out`` may be omitted. The plan holds
        for decodes with the same shapes, split count and pointer alignment.
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

    # ---- internals ------------------------------------------------------------

    def _live_pointer(self) -> int:
        if self._pointer is None:
            raise refuse(InvalidHandleError, "this Handle was closed")
        return self._pointer

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
        layout: str,
        dtype: Any,
        stream: Any,
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
            return found

        q_view, k_view, v_view = view(q, "q"), view(k, "k"), view(v, "v")
        element = _resolve_float_dtype(dtype, (("q", q_view), ("k", k_view), ("v", v_view)))
        paged = block_table is not None
        _fill(call.args.q, q_view, _query_dims(q_view, layout, "q"))
        _fill(call.args.k, k_view, _cache_dims(k_view, layout, "k", paged))
        _fill(call.args.v, v_view, _cache_dims(v_view, layout, "v", paged))

        if out is None and size_query:
            # The size and plan queries read shapes only: q's memory stands in
            # for the output, described as the contiguous array decode would
            # allocate (q itself may be a broadcast view, which no output may be).
            shape, _ = _query_dims(q_view, layout, "out")
            _fill(call.args.out, q_view, (shape, _contiguous(shape)))
        else:
            if out is None:
                out = allocate_like(q_view.array, q_view.shape, "out")
            out_view = view(out, "out", writable=True)
            if out_view.dtype is None:  # uint16 storage holds q's 16-bit type
                if element not in (DType.F16, DType.BF16):
                    raise refuse(InvalidDTypeError, f"out: 16-bit integer storage cannot hold {dtype_name(element)}")
                out_view.dtype = element
            _fill(call.args.out, out_view, _query_dims(out_view, layout, "out"))
            call.out = out

        if lse is None and return_lse and not size_query:
            lse = allocate_like(q_view.array, q_view.shape[:-1], "lse", float32=True)
        if lse is not None:
            lse_view = view(lse, "lse", writable=True)
            if lse_view.dtype is None:  # 16-bit integer storage: only q, k, v and out may be 16-bit floats
                raise refuse(InvalidDTypeError, "lse: must be float32, not 16-bit integer storage")
            _fill(call.args.lse, lse_view, _lse_dims(lse_view, len(q_view.shape), layout))
            call.lse = lse
        if seq_lens is not None:
            lens_view = view(seq_lens, "seq_lens", kind="int32")
            _fill(call.args.seq_lens, lens_view, _own_dims(lens_view, "seq_lens"))
        if block_table is not None:
            table_view = view(block_table, "block_table", kind="int32")
            _fill(call.args.block_table, table_view, _own_dims(table_view, "block_table"))
        call.args.softmax_scale = _softmax_scale(softmax_scale)
        call.args.num_splits = 0 if num_splits is None else _int32(num_splits, "num_splits")
        return call


def _resolve_float_dtype(dtype: Any, views: Tuple[Tuple[str, ArrayView], ...]) -> Optional[DType]:
    """Names the float type of 16-bit integer storage and checks an explicit ``dtype`` against the arrays."""
    explicit = None if dtype is None else as_dtype(dtype)
    if explicit is DType.I32:
        raise refuse(InvalidDTypeError, "dtype: q, k and v hold float32, float16 or bfloat16, not int32")
    for name, found in views:
        if found.dtype is None:
            if explicit not in (DType.F16, DType.BF16):
                raise refuse(
                    InvalidDTypeError,
                    f"{name}: 16-bit integer storage needs dtype='bfloat16' or dtype='float16' to say what it holds",
                )
            found.dtype = explicit
        elif explicit is not None and found.dtype is not explicit:
            raise refuse(
                InvalidDTypeError,
                f"{name}: holds {dtype_name(found.dtype)}, but dtype={dtype_name(explicit)} was given",
            )
    return views[0][1].dtype


# Stands in for the data of an empty array whose producer gives it no
# address (PyTorch, CuPy: 0): the library refuses NULL even where it reads
# nothing, and wants element alignment, which 8 bytes give every dtype.
_EMPTY_DATA = ctypes.c_uint64(0)


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


def _as_layout(value: str) -> str:
    if isinstance(value, str) and value.upper() in LAYOUTS:
        return value.upper()
    raise refuse(InvalidArgumentError, f"layout: expected 'NHD' or 'HND', got {value!r}")


def _int32(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise refuse(InvalidArgumentError, f"{name}: expected an int, got {type(value).__name__}")
    if not -(2**31) <= int(value) < 2**31:
        raise refuse(InvalidArgumentError, f"{name}: {value} does not fit in 32 bits")
    return int(value)


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


def _thread_handle(backend: Backend, device: int, stream: int) -> Handle:
    """This thread's handle for a device and stream: reused, so its workspace is too.

    One per stream, because calls on different streams may overlap on the GPU
    and must not share a workspace.
    """
    handles: Optional[Dict[Tuple[Backend, int, int], Handle]] = getattr(_per_thread, "handles", None)
    if handles is None:
        handles = _per_thread.handles = {}
    key = (backend, device, stream)
    handle = handles.get(key)
    if handle is None:
        handle = handles[key] = Handle(backend, device=device)
    return handle


def flash_decode(
    q: Any,
    k: Any,
    v: Any,
    sm_scale: Optional[float] = None,
    num_splits: Optional[int] = None,
    *,
    out: Any = None,
    stream: Any = None,
) -> Any:
    """Decode attention: a drop-in for the Triton split-K reference kernel's ``flash_decode_splitk``.

    Args:
        q: ``[batch, heads, 1, head_dim]``.
        k, v: ``[batch, kv_heads, kv_len, head_dim]``; kv_heads may divide
            heads (grouped-query attention).
        sm_scale: softmax scale; None means 1/sqrt(head_dim).
        num_splits: KV splits; None lets the library choose.
        out: optional output, shaped like q.
        stream: CUDA stream (see :meth:`Handle.decode`).

    Returns:
        ``[batch, heads, 1, head_dim]`` in q's dtype, of q's kind: a NumPy
        array (computed on the CPU backend) for NumPy input, a tensor on the
        same GPU for PyTorch or CuPy CUDA input.

    Each thread keeps one handle per device and stream, so the workspace is
    reused across calls. For more (paged caches, ragged lengths, LSE,
    workspace control) use :class:`Handle`.
    """
    location, device = locate(q)
    if location == CUDA:
        stream_value = stream_pointer(stream) if stream is not None else default_stream(q)
        handle = _thread_handle(Backend.CUDA, device or 0, stream_value)
        return handle.decode(
            q, k, v, out=out, softmax_scale=sm_scale, num_splits=num_splits, layout="HND", stream=stream_value
        )
    handle = _thread_handle(Backend.CPU, 0, 0)
    return handle.decode(q, k, v, out=out, softmax_scale=sm_scale, num_splits=num_splits, layout="HND")
