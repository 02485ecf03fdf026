# SPDX-License-Identifier: Apache-2.0
"""flashdecode: flash-decoding attention over libflashdecode's C ABI (ctypes only).

One new query token per sequence attends to a KV cache, split along the
sequence and merged; with grouped-query attention, ragged lengths, paged
caches, any strided layout, the log-sum-exp and a reusable workspace.

Quick use, with the signature of the Triton split-K reference kernel's
``flash_decode_splitk`` (``[batch, heads, 1, head_dim]``)::

    out = flashdecode.flash_decode(q, k, v)          # NumPy, or PyTorch/CuPy on the GPU

Everything else goes through a :class:`Handle`::

    with flashdecode.Handle("cpu") as handle:
        out, lse = handle.decode(q, k, v, seq_lens=lens, return_lse=True, layout="HND")

Partial results of a cache decoded in parts (a shared prefix and each
sequence's suffix, or shards on several GPUs), each with its LSE, merge into
the attention over the whole cache (since 0.3)::

    out = flashdecode.merge_states([prefix_out, suffix_out], [prefix_lse, suffix_lse])

8-bit K/V caches (fp8 E4M3/E5M2 or int8, since 0.3) with their scales; new
tokens are quantized into the cache by :func:`append_kv`::

    handle.append_kv(k_new, v_new, k_cache, v_cache, seq_lens=lens, k_scale=ks, v_scale=vs)
    out = handle.decode(q, k_cache, v_cache, seq_lens=lens, k_scale=ks, v_scale=vs)

NumPy arrays run on the CPU backend; CUDA arrays from any library with
``__cuda_array_interface__`` or ``__dlpack__`` run on the CUDA backend;
PyTorch tensors, CPU or CUDA, are read directly. Failures raise
:class:`FlashDecodeError` subclasses carrying the library's message. The
library is found as :func:`load_library` describes.

PyTorch is optional and never imported by this package. Where it is
imported, ``torch.ops.flashdecode.decode`` is registered (see
:func:`torch_op`), and :func:`flash_decode` and :meth:`Handle.decode` call it
inside ``torch.compile``.
"""

from typing import Any

from ._arrays import DType
from ._errors import (
    CudaError,
    FlashDecodeError,
    InternalError,
    InvalidArgumentError,
    InvalidBlockTableError,
    InvalidDTypeError,
    InvalidHandleError,
    InvalidHeadCountError,
    InvalidHeadDimError,
    InvalidLengthError,
    InvalidShapeError,
    InvalidSplitsError,
    InvalidStrideError,
    LibraryError,
    NoDeviceError,
    NullPointerError,
    OutOfMemoryError,
    Status,
    UnsupportedError,
    WorkspaceTooSmallError,
)
from . import _torch
from ._describe import LAYOUTS, Layout
from ._functions import append_kv, flash_decode, flash_decode_splitk, merge_states
from ._handle import Backend, Handle, Merge, PlanInfo, Schedule, host_workspace
from ._library import LIBRARY_ENV, SONAME, LibraryInfo, load_library

__version__ = "0.3.0"


def version() -> str:
    """The loaded library's version string, e.g. ``"0.3.0"`` (loads it if needed)."""
    return load_library().version


def torch_op() -> Any:
    """``torch.ops.flashdecode.decode``, registered if it is not yet (imports PyTorch).

    ``decode(q, k, v, seq_lens=None, block_table=None, softmax_scale=None,
    num_splits=None, layout="NHD", split_tokens=None, causal=True,
    window_left=None, logit_softcap=None, alibi_slopes=None, sinks=None,
    k_scale=None, v_scale=None, q_lens=None) -> (out, lse)``: :meth:`Handle.decode`
    with ``return_lse=True``, as a PyTorch custom op with a fake
    implementation, so that it works under ``torch.compile`` (any backend)
    and in captured CUDA graphs. It runs on this thread's handle for q's
    device and PyTorch's current stream. It is registered as soon as this
    package sees PyTorch imported (at import, at the first call with a
    tensor, or when torch.compile first traces a call); call this to make sure.

    Raises:
        ImportError: PyTorch is not installed.
        NotImplementedError: PyTorch is older than 2.4 (no ``torch.library.custom_op``).
    """
    op = _torch.require().op
    if op is None:
        raise NotImplementedError("flashdecode: torch.ops.flashdecode.decode needs PyTorch 2.4 or later")
    return op


_torch.get()  # registers the op now if PyTorch is already imported; a dict look-up otherwise


__all__ = [
    "LAYOUTS",
    "LIBRARY_ENV",
    "SONAME",
    "Backend",
    "CudaError",
    "DType",
    "FlashDecodeError",
    "Handle",
    "InternalError",
    "InvalidArgumentError",
    "InvalidBlockTableError",
    "InvalidDTypeError",
    "InvalidHandleError",
    "InvalidHeadCountError",
    "InvalidHeadDimError",
    "InvalidLengthError",
    "InvalidShapeError",
    "InvalidSplitsError",
    "InvalidStrideError",
    "Layout",
    "LibraryError",
    "LibraryInfo",
    "Merge",
    "NoDeviceError",
    "NullPointerError",
    "OutOfMemoryError",
    "PlanInfo",
    "Schedule",
    "Status",
    "UnsupportedError",
    "WorkspaceTooSmallError",
    "append_kv",
    "flash_decode",
    "flash_decode_splitk",
    "host_workspace",
    "load_library",
    "merge_states",
    "torch_op",
    "version",
]
