# SPDX-License-Identifier: Apache-2.0
"""Arrays from NumPy and from GPU libraries, seen as the C API sees them.

Host memory comes from NumPy arrays, from anything NumPy can turn into one
(inputs only), or from objects exporting CPU memory through DLPack. Device
memory comes through ``__dlpack__`` (CuPy, JAX) or ``__cuda_array_interface__``
(Numba, CuPy, JAX). PyTorch tensors, CPU or CUDA, are read directly
(``data_ptr()``, ``stride()``, ``dtype``): far cheaper than a DLPack capsule,
and their errors can name torch dtypes. None of those libraries is imported
here: only the protocols are used, and PyTorch once the process has imported it.
"""

from __future__ import annotations

import ctypes
import enum
import functools
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from . import _torch
from ._errors import InvalidArgumentError, InvalidDTypeError, InvalidStrideError, refuse

HOST = "host"
CUDA = "cuda"


class DType(enum.IntEnum):
    """``fd_dtype``: the element types of the C API. Values are pinned."""

    F32 = 0
    F16 = 1
    BF16 = 2
    I32 = 3
    E4M3 = 4
    """Since 0.3: OCP fp8 E4M3 (``float8_e4m3fn``), for K/V caches."""
    E5M2 = 5
    """Since 0.3: OCP fp8 E5M2 (``float8_e5m2``), for K/V caches."""
    I8 = 6
    """Since 0.3: int8, for K/V caches."""


CACHE_DTYPES_8_BIT = (DType.E4M3, DType.E5M2, DType.I8)
"""The 8-bit cache dtypes (since 0.3): k and v only, with optional ``k_scale``/``v_scale``."""

_DTYPE_NAMES: Dict[str, DType] = {
    "float32": DType.F32,
    "f32": DType.F32,
    "float16": DType.F16,
    "f16": DType.F16,
    "half": DType.F16,
    "bfloat16": DType.BF16,
    "bf16": DType.BF16,
    "int32": DType.I32,
    "i32": DType.I32,
    "float8_e4m3fn": DType.E4M3,
    "e4m3": DType.E4M3,
    "float8_e5m2": DType.E5M2,
    "e5m2": DType.E5M2,
    "int8": DType.I8,
    "i8": DType.I8,
}


def as_dtype(value: Any) -> DType:
    """A :class:`DType` from a DType, a name (``"bfloat16"``, ``"bf16"``, ``"float8_e4m3fn"``, ...),
    a NumPy (ml_dtypes included) or a PyTorch dtype."""
    if isinstance(value, DType):
        return value
    if isinstance(value, str):
        key = value
    else:
        try:
            key = np.dtype(value).name
        except TypeError:
            key = getattr(value, "name", None) or str(value)  # e.g. torch.bfloat16 -> "torch.bfloat16"
    found = _DTYPE_NAMES.get(key.lower().rpartition(".")[2])
    if found is None:
        raise refuse(
            InvalidDTypeError,
            f"dtype: unknown element type {value!r}; use 'float32', 'float16' or 'bfloat16' "
            "(or, for an 8-bit K/V cache, 'float8_e4m3fn', 'float8_e5m2' or 'int8')",
        )
    return found


def dtype_name(dtype: Optional[DType]) -> str:
    return "16-bit integer storage" if dtype is None else dtype.name.lower()


@dataclass
class ArrayView:
    """One array as the C API sees it.

    Attributes:
        pointer: address of the first element.
        dtype: its element type; None for 16-bit integer storage (``uint16``)
            whose float type the caller names with ``dtype=``, or (k and v)
            8-bit storage (``uint8``) whose cache type ``dtype=`` names.
        itemsize: bytes per element.
        shape: extents, in the array's own dimension order.
        strides: distances in elements (not bytes).
        location: :data:`HOST` or :data:`CUDA`.
        device: the CUDA ordinal when the array tells it.
        readonly: whether the producer marked it read-only.
        array: the array itself, or the NumPy array it was turned into.
        capsule: a DLPack capsule to keep alive until the call returns.
    """

    pointer: int
    dtype: Optional[DType]
    itemsize: int
    shape: Tuple[int, ...]
    strides: Tuple[int, ...]
    location: str
    device: Optional[int]
    readonly: bool
    array: Any
    capsule: Any = None

    def __post_init__(self) -> None:
        # An array without elements addresses nothing, and NumPy 2 gives it
        # strides of 0, which the library refuses (head_dim's must be 1):
        # describe it row-major, as the Rust and Go bindings do.
        if 0 in self.shape:
            self.strides = _contiguous_strides(self.shape)

    def is_contiguous(self) -> bool:
        expected = 1
        for extent, stride in zip(reversed(self.shape), reversed(self.strides)):
            if extent != 1 and stride != expected:
                return False
            expected *= extent
        return True


def view_array(
    obj: Any, name: str, *, kind: str, writable: bool = False, cuda_stream: Optional[int] = None
) -> ArrayView:
    """Describes ``obj`` for the C API without copying it (lists excepted).

    Args:
        obj: the array.
        name: its role, for messages (``"q"``, ``"seq_lens"``, ...).
        kind: ``"float"`` (q, out, lse, new keys and values), ``"cache"``
            (k and v: also 8-bit types, and ``uint8`` storage),
            ``"float32"`` (alibi_slopes, sinks, scales: no 16-bit storage),
            ``"int32"`` (seq_lens, block_table) or ``"bytes"`` (a workspace:
            any dtype); used to word the error for a dtype the C API cannot
            express, and to allow raw storage where a dtype= may name it.
        writable: the call writes it: it must not be read-only, and must be
            an array (a list would be written as a temporary copy).
        cuda_stream: the stream the call runs on, passed to ``__dlpack__`` so
            that the producer orders its pending work before it (for a
            PyTorch tensor: when it is not PyTorch's current stream).
    """
    torch_state = _torch.get() if not isinstance(obj, np.ndarray) else None
    if isinstance(obj, np.ndarray):
        view = _from_numpy(obj, name, kind)
    elif torch_state is not None and isinstance(obj, torch_state.Tensor):
        view = _from_torch(obj, name, kind, writable, cuda_stream, torch_state)
    elif hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        # DLPack first: its dtypes are exact, while PyTorch describes bfloat16
        # as "<f2" (float16) in __cuda_array_interface__.
        view = _from_dlpack(obj, name, kind, cuda_stream)
    else:
        interface, interface_error = cuda_array_interface(obj)
        if interface is not None:
            view = _from_cuda_array_interface(obj, interface, name, kind)
        elif interface_error is not None:
            raise TypeError(f"{name}: {type(obj).__name__}.__cuda_array_interface__ failed: {interface_error}")
        elif writable:
            raise TypeError(
                f"{name}: a {type(obj).__name__} cannot be written in place; pass a NumPy array "
                "or a GPU array (with __cuda_array_interface__ or __dlpack__)"
            )
        else:
            array = np.asarray(obj)
            if array.dtype == object:
                raise TypeError(f"{name}: expected an array, got {type(obj).__name__}")
            view = _from_numpy(array, name, kind)
    if writable and view.readonly:
        raise refuse(InvalidArgumentError, f"{name}: the array is read-only")
    return view


def cuda_array_interface(obj: Any) -> Tuple[Optional[Dict[str, Any]], Optional[Exception]]:
    """``obj.__cuda_array_interface__``, or why it is unavailable.

    Producers may raise (PyTorch does for tensors that require grad); the
    error is returned so that the caller can report it in context.
    """
    try:
        return obj.__cuda_array_interface__, None
    except AttributeError:
        return None, None
    except Exception as error:  # any producer error: DLPack may still work
        return None, error


def locate(obj: Any) -> Tuple[str, Optional[int]]:
    """Where an array lives: (:data:`HOST`, None) or (:data:`CUDA`, ordinal or None)."""
    if isinstance(obj, np.ndarray):
        return HOST, None
    torch_state = _torch.get()
    if torch_state is not None and isinstance(obj, torch_state.Tensor):
        return (CUDA, obj.get_device()) if obj.is_cuda else (HOST, None)
    device = _dlpack_device(obj)
    if device is not None:
        device_type, device_id = device
        if device_type in _DLPACK_DEVICE_TYPES:
            return CUDA, device_id
        return HOST, None
    interface, _ = cuda_array_interface(obj)
    if interface is not None:
        return CUDA, _cuda_ordinal(obj)
    return HOST, None


def stream_pointer(stream: Any) -> int:
    """A ``cudaStream_t`` as an int, from an int or the stream objects of CUDA libraries.

    Accepts ``__cuda_stream__`` (the CUDA stream protocol), ``.cuda_stream``
    (PyTorch), ``.ptr`` (CuPy) and ``.handle`` (Numba).
    """
    if isinstance(stream, bool):
        raise TypeError("stream: expected a CUDA stream, got a bool")
    if isinstance(stream, int):
        return stream
    protocol = getattr(stream, "__cuda_stream__", None)
    if protocol is not None:
        value = protocol()
        return int(value[1] if isinstance(value, tuple) else value)
    for attribute in ("cuda_stream", "ptr", "handle"):
        value = getattr(stream, attribute, None)
        if isinstance(value, ctypes.c_void_p):
            return value.value or 0
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    raise TypeError(
        f"stream: expected an int (a cudaStream_t) or a stream object with __cuda_stream__, "
        f".cuda_stream, .ptr or .handle; got {type(stream).__name__}"
    )


def default_stream(q: Any) -> int:
    """The stream to run on when the caller names none.

    PyTorch's current stream on q's device for a PyTorch tensor, else the
    stream q's CUDA Array Interface asks consumers to use, else the legacy
    default stream (0).
    """
    torch_state = _torch.get()
    if torch_state is not None and isinstance(q, torch_state.Tensor):
        return int(torch_state.current_stream(q.get_device()))
    interface, _ = cuda_array_interface(q)
    if interface is not None and interface.get("stream") is not None:
        stream = int(interface["stream"])
        return 0 if stream == 1 else stream  # 1 is the legacy default stream, NULL in the C API
    return 0


def allocate_like(reference: Any, shape: Tuple[int, ...], name: str, *, float32: bool = False) -> Any:
    """A new uninitialised array of ``shape`` from ``reference``'s library, on its device.

    The dtype is ``reference``'s, or float32. NumPy, PyTorch and libraries
    with an ``empty(shape, dtype=...)`` function (CuPy) are supported.
    """
    return allocator_like(reference, shape, name, float32=float32)()


def allocator_like(reference: Any, shape: Tuple[int, ...], name: str, *, float32: bool = False) -> Callable[[], Any]:
    """What :func:`allocate_like` would call, to be called as often as needed:
    every array it returns is contiguous, of the same shape, dtype and device."""
    shape = tuple(shape)
    if isinstance(reference, np.ndarray):
        return functools.partial(np.empty, shape, np.float32 if float32 else reference.dtype)
    torch_state = _torch.get()
    if torch_state is not None and isinstance(reference, torch_state.Tensor):
        torch = torch_state.torch
        dtype = torch.float32 if float32 else reference.dtype
        return functools.partial(torch.empty, shape, dtype=dtype, device=reference.device)
    module = sys.modules.get(type(reference).__module__.partition(".")[0])
    empty = getattr(module, "empty", None)
    if not callable(empty):
        raise TypeError(f"{name}: cannot allocate it like a {type(reference).__name__}; pass {name}= explicitly")
    dtype = "float32" if float32 else reference.dtype
    device: Any = getattr(reference, "device", None)

    def allocate() -> Any:
        if hasattr(device, "__enter__"):  # CuPy: entering the array's device makes it current
            with device:
                return empty(shape, dtype=dtype)
        return empty(shape, dtype=dtype)

    return allocate


# ---- NumPy -----------------------------------------------------------------

_NUMPY_DTYPES = {
    np.dtype(np.float32): DType.F32,
    np.dtype(np.float16): DType.F16,
    np.dtype(np.int32): DType.I32,
    np.dtype(np.int8): DType.I8,
}
# ml_dtypes' types, by name (without importing ml_dtypes); float8_e4m3 (IEEE-like, with
# infinities), e4m3fnuz and e5m2fnuz are other formats and stay refused.
_NUMPY_DTYPE_NAMES = {"bfloat16": DType.BF16, "float8_e4m3fn": DType.E4M3, "float8_e5m2": DType.E5M2}
_KIND_HINTS = {
    "float": "use float32, float16 or bfloat16 (ml_dtypes.bfloat16, or uint16 bits with dtype='bfloat16')",
    "cache": "use float32, float16, bfloat16, or an 8-bit cache type: ml_dtypes.float8_e4m3fn, "
    "ml_dtypes.float8_e5m2, int8, or uint8 bits with dtype='float8_e4m3fn' or 'float8_e5m2'",
    "float32": "it must be float32",
    "int32": "it must be int32",
    "bytes": "",
}


def _numpy_dtype(dtype: np.dtype, name: str, kind: str) -> Optional[DType]:
    if kind == "bytes":
        return None
    named = _NUMPY_DTYPE_NAMES.get(dtype.name)  # ml_dtypes' types, without importing ml_dtypes
    if named is not None and dtype.itemsize == (2 if named is DType.BF16 else 1):
        return named
    if not dtype.isnative:
        raise refuse(InvalidDTypeError, f"{name}: {dtype} is not in native byte order")
    found = _NUMPY_DTYPES.get(dtype)
    if found is not None:
        return found
    if kind in ("float", "cache") and dtype.itemsize == 2 and dtype.kind in "uiV":
        return None  # raw 16-bit storage: the caller names the float type
    if kind == "cache" and dtype.itemsize == 1 and (dtype.kind == "u" or dtype.name == "void8"):
        return None  # raw 8-bit storage (not another 8-bit float type): the caller names the cache type
    raise refuse(InvalidDTypeError, f"{name}: dtype {dtype} is not supported; {_KIND_HINTS[kind]}")


def _element_strides(byte_strides: Tuple[int, ...], itemsize: int, name: str) -> Tuple[int, ...]:
    for stride in byte_strides:
        if stride % itemsize:
            raise refuse(
                InvalidStrideError, f"{name}: byte stride {stride} is not a multiple of the element size {itemsize}"
            )
    return tuple(stride // itemsize for stride in byte_strides)


def _contiguous_strides(shape: Tuple[int, ...]) -> Tuple[int, ...]:
    strides = []
    step = 1
    for extent in reversed(shape):
        strides.append(step)
        step *= max(extent, 1)
    return tuple(reversed(strides))


def _from_numpy(array: np.ndarray, name: str, kind: str) -> ArrayView:
    dtype = _numpy_dtype(array.dtype, name, kind)
    return ArrayView(
        pointer=array.__array_interface__["data"][0],
        dtype=dtype,
        itemsize=array.itemsize,
        shape=tuple(array.shape),
        strides=_element_strides(array.strides, array.itemsize, name),
        location=HOST,
        device=None,
        readonly=not array.flags.writeable,
        array=array,
    )


# ---- CUDA Array Interface --------------------------------------------------


def _from_cuda_array_interface(obj: Any, interface: Dict[str, Any], name: str, kind: str) -> ArrayView:
    if interface.get("mask") is not None:
        raise refuse(InvalidArgumentError, f"{name}: masked arrays are not supported")
    dtype = np.dtype(interface["typestr"])
    shape = tuple(int(extent) for extent in interface["shape"])
    byte_strides = interface.get("strides")
    strides = (
        _contiguous_strides(shape)
        if byte_strides is None
        else _element_strides(tuple(int(s) for s in byte_strides), dtype.itemsize, name)
    )
    pointer, readonly = interface["data"]
    element = _numpy_dtype(dtype, name, kind)
    if element is DType.F16 and str(getattr(obj, "dtype", "")).endswith("bfloat16"):
        element = DType.BF16  # producers that describe bfloat16 as "<f2", for want of a typestr
    return ArrayView(
        pointer=int(pointer or 0),
        dtype=element,
        itemsize=dtype.itemsize,
        shape=shape,
        strides=strides,
        location=CUDA,
        device=_cuda_ordinal(obj),
        readonly=bool(readonly),
        array=obj,
    )


def _cuda_ordinal(obj: Any) -> Optional[int]:
    device = _dlpack_device(obj)
    if device is not None and device[0] in _DLPACK_DEVICE_TYPES:
        return device[1]
    holder = getattr(obj, "device", None)
    for attribute in ("index", "id"):  # torch.device.index, cupy.cuda.Device.id
        value = getattr(holder, attribute, None)
        if isinstance(value, int):
            return value
    return None


# ---- PyTorch -----------------------------------------------------------------

_TORCH_HINTS = {
    "float": "use torch.float32, torch.float16 or torch.bfloat16",
    "cache": "use torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2 or torch.int8",
    "float32": "it must be torch.float32",
    "int32": "it must be torch.int32",
    "bytes": "",
}


def _from_torch(
    tensor: Any, name: str, kind: str, writable: bool, cuda_stream: Optional[int], torch_state: "_torch.TorchState"
) -> ArrayView:
    """A PyTorch tensor, read directly rather than through DLPack.

    Inputs that require grad are read as ``tensor.detach()`` would be: decode
    has no backward, and its results never require grad. An output that
    requires grad is refused: writing it behind autograd's back would leave
    autograd's record of it wrong.
    """
    if tensor.layout is not torch_state.torch.strided:
        raise refuse(
            InvalidArgumentError,
            f"{name}: is a PyTorch tensor of layout {tensor.layout}; flashdecode reads strided (dense) tensors "
            "(.to_dense() makes one)",
        )
    device = tensor.device
    if device.type == "cuda":
        location, ordinal = CUDA, device.index
    elif device.type == "cpu":
        location, ordinal = HOST, None
    else:
        raise refuse(
            InvalidArgumentError,
            f"{name}: is a PyTorch tensor on device '{device}'; flashdecode reads CPU or CUDA memory",
        )
    if writable and tensor.requires_grad:
        raise refuse(
            InvalidArgumentError,
            f"{name}: requires grad; decode writes it in place and has no backward: pass a tensor that does "
            "not require grad (e.g. allocate it under torch.no_grad(), or let decode allocate it)",
        )
    if tensor.is_neg() or tensor.is_conj():
        raise refuse(
            InvalidArgumentError,
            f"{name}: is a lazily negated or conjugated PyTorch view; call .resolve_neg() / .resolve_conj() first",
        )
    dtype: Optional[DType] = None
    if kind != "bytes":
        code = torch_state.dtypes.get(tensor.dtype)
        if code is not None:
            dtype = DType(code)
        elif not (
            (kind in ("float", "cache") and tensor.dtype in torch_state.raw_16_bit)
            or (kind == "cache" and tensor.dtype in torch_state.raw_8_bit)
        ):  # 16-bit (or, for a cache, 8-bit) storage: dtype= names it
            raise refuse(InvalidDTypeError, f"{name}: dtype {tensor.dtype} is not supported; {_TORCH_HINTS[kind]}")
    if location == CUDA and cuda_stream is not None and cuda_stream != torch_state.current_stream(ordinal):
        # Another stream than PyTorch's current one: it waits for the work
        # PyTorch has queued so far, as a DLPack export to it would.
        _wait_for_current_stream(torch_state.torch, ordinal, cuda_stream)
    return ArrayView(
        pointer=tensor.data_ptr(),
        dtype=dtype,
        itemsize=tensor.element_size(),
        shape=tuple(tensor.shape),
        strides=tuple(tensor.stride()),
        location=location,
        device=ordinal,
        readonly=False,
        array=tensor,
    )


def _wait_for_current_stream(torch: Any, device: int, stream: int) -> None:
    """Makes ``stream`` (0: the legacy default stream) wait for PyTorch's current stream on ``device``."""
    cuda = torch.cuda
    current = cuda.current_stream(device)
    target = cuda.default_stream(device) if stream == 0 else cuda.ExternalStream(stream, device=device)
    if target.cuda_stream != current.cuda_stream:
        event = cuda.Event()
        event.record(current)
        target.wait_event(event)


# ---- DLPack ----------------------------------------------------------------

_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED = 1, 2, 3, 13
_DLPACK_DEVICE_TYPES = (_DL_CUDA, _DL_CUDA_MANAGED)
_DL_INT, _DL_UINT, _DL_FLOAT, _DL_BFLOAT = 0, 1, 2, 4
_DL_FLOAT8_E4M3FN, _DL_FLOAT8_E5M2 = 10, 12  # DLPack 1.1's kDLFloat8_e4m3fn, kDLFloat8_e5m2
_DLPACK_DTYPES = {
    (_DL_FLOAT, 32): DType.F32,
    (_DL_FLOAT, 16): DType.F16,
    (_DL_BFLOAT, 16): DType.BF16,
    (_DL_INT, 32): DType.I32,
    (_DL_INT, 8): DType.I8,
    (_DL_FLOAT8_E4M3FN, 8): DType.E4M3,
    (_DL_FLOAT8_E5M2, 8): DType.E5M2,
}


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class _DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _DLManagedTensorVersioned(ctypes.Structure):
    """DLPack 1.0's capsule content: it carries flags, read-only among them."""

    _fields_ = [
        ("version", _DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", _DLTensor),
    ]


_DLPACK_FLAG_READ_ONLY = 1


# A private handle on the C API, so that these argtypes do not clash with
# anyone else's use of ctypes.pythonapi.
_capsule_pointer = ctypes.PyDLL(None).PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_name = ctypes.PyDLL(None).PyCapsule_GetName
_capsule_name.restype = ctypes.c_char_p
_capsule_name.argtypes = [ctypes.py_object]


def _export_dlpack(obj: Any, stream: Optional[int]) -> Any:
    """The producer's capsule: DLPack 1.0 (with its read-only flag) when it
    offers it, else the older unversioned one; on ``stream`` (CUDA) when the
    producer takes the argument."""
    attempts: List[Dict[str, Any]] = [{"max_version": (1, 0)}, {}]
    if stream is not None:
        attempts = [{"stream": stream, "max_version": (1, 0)}, {"stream": stream}, {}]
    for kwargs in attempts[:-1]:
        try:
            return obj.__dlpack__(**kwargs)
        except TypeError:  # a producer predating the argument
            pass
    return obj.__dlpack__(**attempts[-1])


def _dlpack_device(obj: Any) -> Optional[Tuple[int, int]]:
    method = getattr(obj, "__dlpack_device__", None)
    if method is None:
        return None
    try:
        device_type, device_id = method()
    except Exception:  # a producer that cannot say: unknown
        return None
    return int(device_type), int(device_id)


def _from_dlpack(obj: Any, name: str, kind: str, cuda_stream: Optional[int]) -> ArrayView:
    device = _dlpack_device(obj)
    if device is None:
        raise TypeError(f"{name}: {type(obj).__name__}.__dlpack_device__() failed")
    device_type, device_id = device
    if device_type in _DLPACK_DEVICE_TYPES:
        # The DLPack stream protocol: 1 names the legacy default stream (0 is ambiguous).
        capsule = _export_dlpack(obj, 1 if not cuda_stream else cuda_stream)
        location = CUDA
    elif device_type in (_DL_CPU, _DL_CUDA_HOST):
        capsule = _export_dlpack(obj, None)
        location = HOST
    else:
        raise refuse(InvalidArgumentError, f"{name}: DLPack device type {device_type} is neither CPU nor CUDA memory")
    # Reading the capsule does not consume it: when it is released, its
    # destructor calls the producer's deleter, as DLPack specifies.
    capsule_name = _capsule_name(capsule)
    readonly = False  # an unversioned capsule cannot say
    if capsule_name == b"dltensor_versioned":
        versioned = _DLManagedTensorVersioned.from_address(_capsule_pointer(capsule, capsule_name))
        if versioned.version.major != 1:
            raise refuse(
                InvalidArgumentError, f"{name}: DLPack {versioned.version.major}.x capsule; this binding reads 1.x"
            )
        readonly = bool(versioned.flags & _DLPACK_FLAG_READ_ONLY)
        tensor = versioned.dl_tensor
    else:
        tensor = _DLManagedTensor.from_address(_capsule_pointer(capsule, b"dltensor")).dl_tensor
    code, bits, lanes = tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes
    if lanes != 1:
        raise refuse(InvalidDTypeError, f"{name}: vector dtypes ({lanes} lanes) are not supported")
    if kind == "bytes":
        dtype = None
    elif (code, bits) in _DLPACK_DTYPES:
        dtype = _DLPACK_DTYPES[(code, bits)]
    elif kind in ("float", "cache") and bits == 16 and code in (_DL_INT, _DL_UINT):
        dtype = None
    elif kind == "cache" and bits == 8 and code == _DL_UINT:
        dtype = None
    else:
        raise refuse(
            InvalidDTypeError, f"{name}: DLPack dtype (code {code}, {bits} bits) is not supported; {_KIND_HINTS[kind]}"
        )
    shape = tuple(tensor.shape[i] for i in range(tensor.ndim))
    strides = tuple(tensor.strides[i] for i in range(tensor.ndim)) if tensor.strides else _contiguous_strides(shape)
    return ArrayView(
        pointer=(tensor.data or 0) + tensor.byte_offset,
        dtype=dtype,
        itemsize=max(1, bits // 8),
        shape=shape,
        strides=strides,
        location=location,
        device=device_id if location == CUDA else None,
        readonly=readonly,
        array=obj,
        capsule=capsule,
    )
