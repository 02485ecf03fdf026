# SPDX-License-Identifier: Apache-2.0
"""The fast path: per-handle plans keyed by call signatures.

A decode call's signature (:func:`_signature`) holds everything the binding's
checks and the C arguments depend on, and the call's data pointers; a
:class:`_Plan` keeps the C arguments that the full path built for one
signature, so that a later call with the same signature only writes the new
data pointers into them (:meth:`flashdecode.Handle.decode`).
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any, Callable, Optional, Tuple

import numpy as np

from . import _library, _torch
from ._arrays import DType
from ._describe import _PreparedCall
from ._library import FdDecodeArgs, FdTensor

_ndarray = np.ndarray
_modules = sys.modules
_ARGUMENTS = (
    "q", "k", "v", "out", "lse", "seq_lens", "block_table", "alibi_slopes", "sinks", "k_scale", "v_scale", "q_lens",
)  # fmt: skip
_MAX_PLANS = 16
"""Signatures a handle remembers; the oldest is dropped beyond that."""
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
    try:
        return _torch_key(tensor, q, k, v, optional)
    except RuntimeError:  # a tensor without strides or storage (sparse): the full path refuses it by name
        return None


def _torch_key(tensor: Any, q: Any, k: Any, v: Any, optional: Tuple[Any, ...]) -> Optional[_Signature]:
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
