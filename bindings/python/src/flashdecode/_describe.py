# SPDX-License-Identifier: Apache-2.0
"""Python arguments as the C API's: arrays as ``fd_tensor`` fields in its dimension order,
the dtypes that raw storage holds, and the scalar arguments checked.

What a :class:`~flashdecode.Handle` fills its ``fd_decode_args``, ``fd_append_args`` and
``fd_merge_args`` with; every error names the argument at fault.
"""

from __future__ import annotations

import collections.abc
import ctypes
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Literal, Optional, Tuple, Type, cast

import numpy as np

from . import _library
from ._arrays import CACHE_DTYPES_8_BIT, ArrayView, DType, as_dtype, dtype_name
from ._errors import (
    FlashDecodeError,
    InvalidArgumentError,
    InvalidDTypeError,
    InvalidShapeError,
    InvalidSplitsError,
    refuse,
)
from ._library import FdDecodeArgs, FdTensor

Layout = Literal["NHD", "HND"]
"""The ``layout=`` argument: see :data:`LAYOUTS` (lower case is accepted too)."""

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


# ---- the C arguments of one call, and the arrays they point into -------------


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


# ---- dtypes, arrays and scalar arguments as the C API takes them -------------


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


_CACHE_NAMES = ("k", "v")
"""The arrays an 8-bit name in ``dtype=`` is about (q and new tokens never hold 8 bits)."""


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
        elif name in _CACHE_NAMES and narrow is not None and found.dtype not in CACHE_DTYPES_8_BIT:
            raise refuse(
                InvalidDTypeError,
                f"{name}: holds {dtype_name(found.dtype)}, but dtype={dtype_name(narrow)} names an 8-bit cache",
            )
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


def _as_layout(value: Any) -> Layout:
    if isinstance(value, str) and value.upper() in LAYOUTS:
        return cast(Layout, value.upper())
    raise refuse(InvalidArgumentError, f"layout: expected 'NHD' or 'HND', got {value!r}")


def _int32(value: Any, name: str, out_of_range: Type[FlashDecodeError] = InvalidArgumentError) -> int:
    """An int argument of 32 bits; one beyond them raises ``out_of_range`` (the status the library gives
    a value too large of that argument: InvalidSplitsError for num_splits)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise refuse(InvalidArgumentError, f"{name}: expected an int, got {type(value).__name__}")
    if not -(2**31) <= int(value) < 2**31:
        raise refuse(out_of_range, f"{name}: {value} does not fit in 32 bits")
    return int(value)


def _split_tokens(value: Any) -> int:
    """``split_tokens`` for fd_decode_args: an int; a non-zero one needs a 0.3 library (the library checks its range)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise refuse(InvalidArgumentError, f"split_tokens: expected an int, got {type(value).__name__}")
    if not -(2**63) <= int(value) < 2**63:
        raise refuse(InvalidSplitsError, f"split_tokens: {value} does not fit in 64 bits")
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
