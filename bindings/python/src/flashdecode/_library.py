# SPDX-License-Identifier: Apache-2.0
"""Finding and loading libflashdecode, and its C ABI declared for ctypes.

This is the only module that knows the layout of ``include/flashdecode.h``;
the rest of the package uses the names defined here.

The library is looked for, in order, at ``$FLASHDECODE_LIBRARY`` (and only
there when it is set: an explicit choice must not fall back silently), as a
copy bundled inside this package (``flashdecode/_lib``, present in wheels built
with the library), then on the system by its SONAME ``libflashdecode.so.0``
(``LD_LIBRARY_PATH``, the ld.so cache) and by ``ctypes.util.find_library``.
The first candidate that loads, exports every function and has this binding's
major version wins; otherwise :class:`LibraryError` lists what was tried.

A library of an older minor version, down to :data:`OLDEST_MINOR`, is used
as it is: what it does not have (see :data:`SINCE`) raises
:class:`UnsupportedError` naming the version it needs when it is asked for,
and everything else works as that library does.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from ._errors import LibraryError, UnsupportedError, error_from_status, refuse

ABI_MAJOR = 0
"""The major version (ABI, SONAME suffix) these declarations were written for."""
ABI_MINOR = 3
"""The minor version of the header these declarations were written from."""
OLDEST_MINOR = 2
"""The oldest minor version this binding loads: a 0.2 library lacks the features
of :data:`SINCE`, which then raise :class:`UnsupportedError` when asked for."""
SONAME = f"libflashdecode.so.{ABI_MAJOR}"
LIBRARY_ENV = "FLASHDECODE_LIBRARY"
BUNDLED_LIBRARY = Path(__file__).resolve().parent / "_lib" / SONAME
MAX_DIMS = 4
WORKSPACE_ALIGNMENT = 256
"""Bytes: fd_set_workspace() requires caller memory aligned to this."""

# C enums (fd_status, fd_dtype, fd_backend) are int-sized on every ABI we build for.
c_enum = ctypes.c_int


class FdTensor(ctypes.Structure):
    """``fd_tensor``: pointer, dtype, shape and element strides."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", c_enum),
        ("ndim", ctypes.c_int32),
        ("shape", ctypes.c_int64 * MAX_DIMS),
        ("strides", ctypes.c_int64 * MAX_DIMS),
    ]


class FdOptions(ctypes.Structure):
    """``fd_options``."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("backend", c_enum),
        ("device", ctypes.c_int32),
        ("num_threads", ctypes.c_int32),
        ("reserved_0", ctypes.c_uint32),  # 0.2's trailing padding: never read
        ("checks", ctypes.c_uint32),  # since 0.3: fd_check flags
        ("reserved_1", ctypes.c_uint32),
    ]


CHECK_NONE = 0
CHECK_CONTENTS = 1
"""``fd_check``: the flags of ``fd_options.checks`` (since 0.3)."""


class FdDecodeArgs(ctypes.Structure):
    """``fd_decode_args``."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("q", FdTensor),
        ("k", FdTensor),
        ("v", FdTensor),
        ("out", FdTensor),
        ("lse", FdTensor),
        ("seq_lens", FdTensor),
        ("block_table", FdTensor),
        ("softmax_scale", ctypes.c_double),
        ("num_splits", ctypes.c_int32),
        ("reserved_0", ctypes.c_int32),  # 0.2's trailing padding: never read
        ("split_tokens", ctypes.c_int64),  # since 0.3
        ("mask", c_enum),  # since 0.3: fd_attention_mask
        ("logit_softcap", ctypes.c_float),  # since 0.3
        ("window_left", ctypes.c_int64),  # since 0.3
        ("alibi_slopes", FdTensor),  # since 0.3
        ("sinks", FdTensor),  # since 0.3
        ("k_scale", FdTensor),  # since 0.3: dequantization scales of an 8-bit k
        ("v_scale", FdTensor),  # since 0.3: of an 8-bit v
        ("q_lens", FdTensor),  # since 0.3: per-sequence query tokens
    ]


MAX_Q_LEN = 64
"""``FD_MAX_Q_LEN``: the most query tokens per sequence (dimension 1 of q) one decode takes (since 0.3)."""
MASK_CAUSAL = 0
MASK_NONE = 1
"""``fd_attention_mask``: the values of ``fd_decode_args.mask`` (since 0.3)."""


class FdPlanInfo(ctypes.Structure):
    """``fd_plan_info`` (since 0.2)."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("backend", c_enum),
        ("num_splits", ctypes.c_int32),
        ("split_tokens", ctypes.c_int64),
        ("workspace_bytes", ctypes.c_size_t),
        ("kernel", ctypes.c_char_p),
        ("merge", c_enum),
        ("launches", ctypes.c_int32),
        ("blocks", ctypes.c_int64),
        ("schedule", c_enum),  # since 0.3; a 0.2 library leaves the zero ctypes starts it with (fixed)
        ("reserved_0", ctypes.c_int32),  # since 0.3: padding
    ]


MAX_MERGE_STATES = 64
"""``FD_MAX_MERGE_STATES``: the most states one ``fd_merge_states`` call merges (since 0.3)."""


class FdMergeArgs(ctypes.Structure):
    """``fd_merge_args`` (since 0.3)."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("num_states", ctypes.c_int32),
        ("reserved_0", ctypes.c_int32),  # padding: never read
        ("states_out", ctypes.POINTER(FdTensor)),
        ("states_lse", ctypes.POINTER(FdTensor)),
        ("out", FdTensor),
        ("lse", FdTensor),
    ]


class FdAppendArgs(ctypes.Structure):
    """``fd_append_args`` (since 0.3)."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("k_new", FdTensor),
        ("v_new", FdTensor),
        ("k", FdTensor),
        ("v", FdTensor),
        ("k_scale", FdTensor),
        ("v_scale", FdTensor),
        ("seq_lens", FdTensor),
        ("block_table", FdTensor),
    ]


def new_options() -> FdOptions:
    """``fd_options`` with the defaults of ``fd_options_init()``.

    Filled here rather than through ctypes: every default is zero but
    ``struct_size``, and the library reads only ``struct_size`` bytes of ours
    and defaults the rest.
    """
    return FdOptions(struct_size=ctypes.sizeof(FdOptions), backend=0, device=0, num_threads=0)


def new_decode_args() -> FdDecodeArgs:
    """``fd_decode_args`` with the defaults of ``fd_decode_args_init()`` (see :func:`new_options`)."""
    return FdDecodeArgs(struct_size=ctypes.sizeof(FdDecodeArgs), softmax_scale=0.0, num_splits=0)


def new_merge_args() -> FdMergeArgs:
    """``fd_merge_args`` with the defaults of ``fd_merge_args_init()`` (see :func:`new_options`)."""
    return FdMergeArgs(struct_size=ctypes.sizeof(FdMergeArgs), num_states=0)


def new_append_args() -> FdAppendArgs:
    """``fd_append_args`` with the defaults of ``fd_append_args_init()`` (see :func:`new_options`)."""
    return FdAppendArgs(struct_size=ctypes.sizeof(FdAppendArgs))


_handle_p = ctypes.c_void_p
_PROTOTYPES: Sequence[Tuple[str, Any, List[Any]]] = (
    ("fd_version_number", ctypes.c_uint, []),
    ("fd_version_string", ctypes.c_char_p, []),
    ("fd_status_string", ctypes.c_char_p, [c_enum]),
    ("fd_last_error_message", ctypes.c_size_t, [ctypes.c_char_p, ctypes.c_size_t]),
    ("fd_options_init", ctypes.c_size_t, [ctypes.c_void_p, ctypes.c_size_t]),
    ("fd_decode_args_init", ctypes.c_size_t, [ctypes.c_void_p, ctypes.c_size_t]),
    ("fd_create", c_enum, [ctypes.POINTER(_handle_p), ctypes.POINTER(FdOptions)]),
    ("fd_destroy", c_enum, [_handle_p]),
    ("fd_get_backend", c_enum, [_handle_p, ctypes.POINTER(c_enum)]),
    ("fd_decode", c_enum, [_handle_p, ctypes.POINTER(FdDecodeArgs), ctypes.c_void_p]),
    ("fd_workspace_size", c_enum, [_handle_p, ctypes.POINTER(FdDecodeArgs), ctypes.POINTER(ctypes.c_size_t)]),
    ("fd_reserve_workspace", c_enum, [_handle_p, ctypes.c_size_t]),
    ("fd_set_workspace", c_enum, [_handle_p, ctypes.c_void_p, ctypes.c_size_t]),
    ("fd_plan_info_init", ctypes.c_size_t, [ctypes.c_void_p, ctypes.c_size_t]),
    ("fd_describe_plan", c_enum, [_handle_p, ctypes.POINTER(FdDecodeArgs), ctypes.POINTER(FdPlanInfo)]),
    ("fd_check_contents", c_enum, [_handle_p, ctypes.c_void_p]),
    ("fd_merge_args_init", ctypes.c_size_t, [ctypes.c_void_p, ctypes.c_size_t]),
    ("fd_merge_states", c_enum, [_handle_p, ctypes.POINTER(FdMergeArgs), ctypes.c_void_p]),
    ("fd_append_args_init", ctypes.c_size_t, [ctypes.c_void_p, ctypes.c_size_t]),
    ("fd_append_kv", c_enum, [_handle_p, ctypes.POINTER(FdAppendArgs), ctypes.c_void_p]),
)

SINCE: Dict[str, int] = {
    "fd_plan_info_init": 2,
    "fd_describe_plan": 2,
    "fd_check_contents": 3,
    "fd_options.checks": 3,
    "fd_decode_args.split_tokens": 3,
    "fd_decode_args.mask": 3,
    "fd_decode_args.logit_softcap": 3,
    "fd_decode_args.window_left": 3,
    "fd_decode_args.alibi_slopes": 3,
    "fd_decode_args.sinks": 3,
    "fd_merge_args_init": 3,
    "fd_merge_states": 3,
    "fd_decode_args.k_scale": 3,
    "fd_decode_args.v_scale": 3,
    "fd_decode_args.q_lens": 3,
    "fd_append_args_init": 3,
    "fd_append_kv": 3,
    "fd_dtype.e4m3": 3,
    "fd_dtype.e5m2": 3,
    "fd_dtype.i8": 3,
    "fd_plan_info.schedule": 3,
}
"""The minor version that added each function and struct field of a later minor than 0.1."""


@dataclass(frozen=True)
class LibraryInfo:
    """The libflashdecode this process uses.

    Attributes:
        path: the file that was loaded (resolved by the dynamic loader).
        source: how it was found: ``"FLASHDECODE_LIBRARY"``, ``"bundled"``,
            ``"system"`` or ``"explicit"`` (given to :func:`load_library`).
        version: its version string, e.g. ``"0.3.0"``.
        version_number: ``major * 10000 + minor * 100 + patch``.
    """

    path: str
    source: str
    version: str
    version_number: int

    @property
    def minor(self) -> int:
        """The minor version: which features of :data:`SINCE` the library has."""
        return (self.version_number // 100) % 100


_load_lock = threading.Lock()
_loaded: Optional[Tuple[ctypes.CDLL, LibraryInfo]] = None


def load_library(path: Union[str, "os.PathLike[str]", None] = None) -> LibraryInfo:
    """Loads libflashdecode (once per process) and returns what was loaded.

    Calling this is optional: the first handle loads the library by the search
    order of this module. Pass ``path`` to choose the file explicitly; that is
    only possible before the library is loaded.

    Raises:
        LibraryError: nothing loadable was found, a symbol is missing, the
            major version differs, or another library is already loaded.
    """
    global _loaded
    with _load_lock:
        if _loaded is not None:
            info = _loaded[1]
            if path is not None and os.path.realpath(path) != os.path.realpath(info.path):
                raise LibraryError(
                    f"flashdecode: {info.path} is already loaded (from {info.source}); cannot switch to {path}"
                )
            return info
        candidates: Iterator[Tuple[str, str]] = iter([("explicit", os.fspath(path))]) if path else _candidates()
        failures: List[str] = []
        for source, name in candidates:
            try:
                _loaded = _open(source, name)
                return _loaded[1]
            except LibraryError as error:
                failures.append(str(error))
        raise LibraryError(
            f"flashdecode: cannot load libflashdecode (major version {ABI_MAJOR}). Tried:\n  - "
            + "\n  - ".join(failures)
            + f"\nSet {LIBRARY_ENV} to the library's path, install it (cmake --install), "
            "or install a flashdecode wheel that bundles it."
        )


def library() -> ctypes.CDLL:
    """The loaded library, loading it on first use."""
    loaded = _loaded
    if loaded is None:
        load_library()
        loaded = _loaded
        assert loaded is not None
    return loaded[0]


def info() -> LibraryInfo:
    """What :func:`load_library` loaded, loading it on first use."""
    loaded = _loaded
    if loaded is None:
        return load_library()
    return loaded[1]


def require(feature: str, what: str) -> None:
    """Raises :class:`UnsupportedError` if the loaded library is older than ``feature`` (a key of
    :data:`SINCE`); ``what`` is how the caller asked for it, e.g. ``"check_contents=True"``.

    For what this binding asks of an older library: the library would refuse
    an unknown field too, but by its byte offset; this names the feature and
    the version that has it.
    """
    loaded = info()
    needed = SINCE[feature]
    if loaded.minor < needed:
        raise refuse(
            UnsupportedError,
            f"{what} needs libflashdecode {ABI_MAJOR}.{needed} or later ({feature}); "
            f"{loaded.path} is version {loaded.version}",
        )


def last_error_message() -> str:
    """The calling thread's last detailed error message (``fd_last_error_message``)."""
    lib = library()
    size = lib.fd_last_error_message(None, 0)
    buffer = ctypes.create_string_buffer(size + 1)
    lib.fd_last_error_message(buffer, len(buffer))
    return buffer.value.decode("utf-8", "replace")


def check(status: int) -> None:
    """Raises the exception for ``status`` unless it is ``FD_SUCCESS``.

    Must follow the failing call on the same thread: the message is thread-local.
    """
    if status != 0:
        raise error_from_status(status, last_error_message())


def _candidates() -> Iterator[Tuple[str, str]]:
    explicit = os.environ.get(LIBRARY_ENV)
    if explicit:
        yield LIBRARY_ENV, explicit
        return
    if BUNDLED_LIBRARY.exists():
        yield "bundled", str(BUNDLED_LIBRARY)
    yield "system", SONAME
    # Only consulted when the SONAME did not load: it runs ldconfig or a compiler.
    found = ctypes.util.find_library("flashdecode")
    if found and found != SONAME:
        yield "system", found


def _open(source: str, name: str) -> Tuple[ctypes.CDLL, LibraryInfo]:
    where = f"{name} ({source})"
    try:
        lib = ctypes.CDLL(name)
    except OSError as error:
        raise LibraryError(f"{where}: {error}") from None
    # The version first: an older library lacks later functions, and saying
    # its version is the useful message.
    declare(lib, where, only=_VERSION_FUNCTIONS)
    path = _loaded_file(lib) or name
    number = int(lib.fd_version_number())
    version = lib.fd_version_string().decode()
    minor = (number // 100) % 100
    if number // 10000 != ABI_MAJOR or minor < OLDEST_MINOR:
        raise LibraryError(
            f"{path} ({source}) is version {version}; this binding needs {ABI_MAJOR}.x with x >= {OLDEST_MINOR}"
        )
    declare(lib, where, minor=minor)
    _check_struct_sizes(lib, path, number)
    return lib, LibraryInfo(path=path, source=source, version=version, version_number=number)


_VERSION_FUNCTIONS = ("fd_version_number", "fd_version_string")


def declare(
    lib: ctypes.CDLL, where: str, require_all: bool = True, only: Sequence[str] = (), minor: Optional[int] = None
) -> None:
    """Sets the argument and result types of every exported function on ``lib``.

    For tools that load several builds of the library side by side (the
    benchmarks in ``tests/bench``), which :func:`load_library` does not.
    With ``require_all`` false, functions an older build lacks (e.g.
    ``fd_describe_plan`` before 0.2) are left undeclared instead; with
    ``minor``, only those a library of that minor version must have (see
    :data:`SINCE`) are required. ``only`` limits the work to the functions
    it names.

    Raises:
        LibraryError: a function is missing (``where`` names the library).
    """
    for function, restype, argtypes in _PROTOTYPES:
        if only and function not in only:
            continue
        try:
            declared = getattr(lib, function)
        except AttributeError:
            if not require_all or (minor is not None and SINCE.get(function, 0) > minor):
                continue
            raise LibraryError(f"{where}: does not export {function}; not a flashdecode library?") from None
        declared.restype = restype
        declared.argtypes = argtypes


def struct_size_of_minor(name: str, struct: Any, minor: int) -> int:
    """The sizeof of struct ``name`` in a library of an older ``minor`` version: where the first
    field a later minor added begins (later minors append only past every earlier sizeof)."""
    later = [
        getattr(struct, key.split(".", 1)[1]).offset
        for key, since in SINCE.items()
        if key.startswith(name + ".") and since > minor
    ]
    return min(later) if later else ctypes.sizeof(struct)


def _check_struct_sizes(lib: ctypes.CDLL, path: str, number: int) -> None:
    """Catches a header/binding mismatch: the init functions return the library's sizeof.

    A library of this binding's minor has exactly its structs, a newer one at
    least as large, an older one exactly that minor's (which this binding
    passes in its larger structs, the fields the library lacks left zero).
    """
    minor = (number // 100) % 100
    structs: List[Tuple[str, Any, Any]] = [
        ("fd_options", lib.fd_options_init, FdOptions),
        ("fd_decode_args", lib.fd_decode_args_init, FdDecodeArgs),
        ("fd_plan_info", lib.fd_plan_info_init, FdPlanInfo),
    ]
    if minor >= SINCE["fd_merge_args_init"]:  # a struct of 0.3: an older library has none
        structs.append(("fd_merge_args", lib.fd_merge_args_init, FdMergeArgs))
    if minor >= SINCE["fd_append_args_init"]:
        structs.append(("fd_append_args", lib.fd_append_args_init, FdAppendArgs))
    for name, init, struct in structs:
        library_size = int(init(None, 0))  # NULL: only the size is asked for
        ours = ctypes.sizeof(struct)
        if minor < ABI_MINOR:
            expected = struct_size_of_minor(name, struct, minor)
            wrong = library_size != expected
        else:
            expected = ours
            wrong = library_size < ours or (minor == ABI_MINOR and library_size != ours)
        if wrong:
            raise LibraryError(
                f"{path}: its {name} is {library_size} bytes, this binding expects {expected} of version "
                f"{ABI_MAJOR}.{minor}; the binding and the library disagree on the ABI"
            )


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


def _loaded_file(lib: ctypes.CDLL) -> Optional[str]:
    """The file the dynamic loader actually mapped for ``lib`` (via dladdr), if it can tell."""
    try:
        dladdr = ctypes.CDLL(None).dladdr
    except (OSError, AttributeError):
        return None
    dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    dladdr.restype = ctypes.c_int
    info = _DlInfo()
    address = ctypes.cast(lib.fd_version_number, ctypes.c_void_p).value
    file_name: Optional[bytes] = info.dli_fname if dladdr(address, ctypes.byref(info)) else None
    return os.path.realpath(file_name.decode()) if file_name else None
