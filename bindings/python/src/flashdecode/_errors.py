# SPDX-License-Identifier: Apache-2.0
"""Status codes and the exceptions they become.

Every ``fd_status`` other than success raises a :class:`FlashDecodeError`
subclass carrying the status and the library's detailed message. Arguments the
binding can reject before calling the library raise the same classes, so one
``except`` clause covers both. Each class also derives from the closest
built-in exception (``ValueError`` for bad arguments, ``TypeError`` for bad
dtypes, ...), so code written against the ``ValueError`` of the Triton split-K
reference kernel keeps working.
"""

from __future__ import annotations

import enum
from typing import Dict, Type, Union


class Status(enum.IntEnum):
    """``fd_status``: the result of every fallible call. Values are pinned."""

    SUCCESS = 0
    NULL_POINTER = 1
    INVALID_ARGUMENT = 2
    INVALID_DTYPE = 3
    INVALID_HEAD_DIM = 4
    INVALID_HEAD_COUNT = 5
    INVALID_SHAPE = 6
    INVALID_STRIDE = 7
    INVALID_LENGTH = 8
    INVALID_BLOCK_TABLE = 9
    INVALID_SPLITS = 10
    WORKSPACE_TOO_SMALL = 11
    INVALID_HANDLE = 12
    UNSUPPORTED = 13
    NO_DEVICE = 14
    OUT_OF_MEMORY = 15
    CUDA = 16
    INTERNAL = 17

    @property
    def summary(self) -> str:
        """The short text ``fd_status_string()`` gives for this status."""
        return _SUMMARIES[self]


# fd_status_string(), repeated so that errors raised before the library is
# called read the same; a test checks the two stay equal.
_SUMMARIES: Dict[Status, str] = {
    Status.SUCCESS: "success",
    Status.NULL_POINTER: "null pointer",
    Status.INVALID_ARGUMENT: "invalid argument",
    Status.INVALID_DTYPE: "invalid dtype",
    Status.INVALID_HEAD_DIM: "invalid head_dim",
    Status.INVALID_HEAD_COUNT: "invalid head count",
    Status.INVALID_SHAPE: "invalid shape",
    Status.INVALID_STRIDE: "invalid stride",
    Status.INVALID_LENGTH: "invalid length",
    Status.INVALID_BLOCK_TABLE: "invalid block table",
    Status.INVALID_SPLITS: "invalid split count",
    Status.WORKSPACE_TOO_SMALL: "workspace too small",
    Status.INVALID_HANDLE: "invalid handle",
    Status.UNSUPPORTED: "unsupported",
    Status.NO_DEVICE: "no device",
    Status.OUT_OF_MEMORY: "out of memory",
    Status.CUDA: "CUDA error",
    Status.INTERNAL: "internal error",
}


class LibraryError(ImportError):
    """libflashdecode could not be found or loaded, or has an incompatible version."""


class FlashDecodeError(Exception):
    """A flashdecode call failed, or the binding refused its arguments.

    Attributes:
        status: the :class:`Status` (an ``int`` for a status newer than this
            binding).
        message: the detailed message, naming the argument at fault, e.g.
            ``"invalid stride: k: stride of head_dim must be 1, got 3"``.
    """

    status: Union[Status, int] = Status.INTERNAL

    def __init__(self, message: str, status: Union[Status, int, None] = None) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status
        self.message = message


class NullPointerError(FlashDecodeError, ValueError):
    """A required pointer was NULL (an output pointer, or a tensor's data)."""

    status = Status.NULL_POINTER


class InvalidArgumentError(FlashDecodeError, ValueError):
    """A scalar argument is invalid, or an array is on the wrong device."""

    status = Status.INVALID_ARGUMENT


class InvalidDTypeError(FlashDecodeError, TypeError):
    """A dtype is not supported for that tensor, or q/k/v dtypes differ."""

    status = Status.INVALID_DTYPE


class InvalidHeadDimError(FlashDecodeError, ValueError):
    """head_dim is out of range."""

    status = Status.INVALID_HEAD_DIM


class InvalidHeadCountError(FlashDecodeError, ValueError):
    """A head count is out of range, or query heads are not a multiple of KV heads."""

    status = Status.INVALID_HEAD_COUNT


class InvalidShapeError(FlashDecodeError, ValueError):
    """A tensor's rank or extents are invalid or disagree with another tensor's."""

    status = Status.INVALID_SHAPE


class InvalidStrideError(FlashDecodeError, ValueError):
    """A stride is negative, not a whole number of elements, or head_dim is not contiguous."""

    status = Status.INVALID_STRIDE


class InvalidLengthError(FlashDecodeError, ValueError):
    """A sequence length is negative or longer than its cache."""

    status = Status.INVALID_LENGTH


class InvalidBlockTableError(FlashDecodeError, ValueError):
    """A paged-cache block table entry points outside the page pool."""

    status = Status.INVALID_BLOCK_TABLE


class InvalidSplitsError(FlashDecodeError, ValueError):
    """num_splits is negative or larger than the library allows."""

    status = Status.INVALID_SPLITS


class WorkspaceTooSmallError(FlashDecodeError, ValueError):
    """The caller-provided workspace is smaller than the problem needs."""

    status = Status.WORKSPACE_TOO_SMALL


class InvalidHandleError(FlashDecodeError, ValueError):
    """The handle was closed (destroyed) already."""

    status = Status.INVALID_HANDLE


class UnsupportedError(FlashDecodeError, NotImplementedError):
    """Valid input that the handle's backend does not support (yet)."""

    status = Status.UNSUPPORTED


class NoDeviceError(FlashDecodeError, RuntimeError):
    """No usable CUDA device with that ordinal, or a library built without CUDA."""

    status = Status.NO_DEVICE


class OutOfMemoryError(FlashDecodeError, MemoryError):
    """Host or device memory could not be allocated."""

    status = Status.OUT_OF_MEMORY


class CudaError(FlashDecodeError, RuntimeError):
    """The CUDA runtime reported an error; the message carries its text."""

    status = Status.CUDA


class InternalError(FlashDecodeError, RuntimeError):
    """A bug in flashdecode; please report it with the message."""

    status = Status.INTERNAL


ERROR_CLASSES: Dict[Status, Type[FlashDecodeError]] = {
    cls.status: cls for cls in FlashDecodeError.__subclasses__()  # type: ignore[misc]
}


def error_from_status(status: int, message: str) -> FlashDecodeError:
    """The exception for a status the library returned, with its message."""
    try:
        known = Status(status)
    except ValueError:
        return FlashDecodeError(message or f"unknown status {status}", status)
    return ERROR_CLASSES[known](message or known.summary)


def refuse(error_class: Type[FlashDecodeError], detail: str) -> FlashDecodeError:
    """An error for arguments the binding rejects itself, worded as the library words its own."""
    return error_class(f"{Status(error_class.status).summary}: {detail}")
