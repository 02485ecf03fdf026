# SPDX-License-Identifier: Apache-2.0
"""How the package finds libflashdecode, and what it says when it cannot.

Each case runs in a fresh interpreter: a process loads the library once."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest

import flashdecode
from flashdecode import _library

PACKAGE_ROOT = Path(flashdecode.__file__).resolve().parent.parent
LIBRARY = os.environ.get(_library.LIBRARY_ENV)
needs_library_path = pytest.mark.skipif(not LIBRARY, reason=f"{_library.LIBRARY_ENV} names no library to test with")

REPORT = "import flashdecode; info = flashdecode.load_library(); print(info.source, info.path, info.version)"


def run_python(
    code: str, library: Optional[str] = None, loader_path: Optional[str] = None
) -> subprocess.CompletedProcess:
    env = {name: value for name, value in os.environ.items() if name not in (_library.LIBRARY_ENV, "LD_LIBRARY_PATH")}
    env["PYTHONPATH"] = str(PACKAGE_ROOT)
    if library is not None:
        env[_library.LIBRARY_ENV] = library
    if loader_path is not None:
        env["LD_LIBRARY_PATH"] = loader_path
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


@needs_library_path
def test_environment_variable_names_the_library() -> None:
    assert LIBRARY is not None
    result = run_python(REPORT, library=LIBRARY)
    assert result.returncode == 0, result.stderr
    source, path, version = result.stdout.split()
    assert source == _library.LIBRARY_ENV and path == os.path.realpath(LIBRARY)
    assert version == flashdecode.version()


def test_environment_variable_has_no_silent_fallback() -> None:
    result = run_python(REPORT, library="/nonexistent/libflashdecode.so.0")
    assert result.returncode != 0
    assert "LibraryError" in result.stderr
    assert "/nonexistent/libflashdecode.so.0 (FLASHDECODE_LIBRARY)" in result.stderr
    assert "(system)" not in result.stderr


@needs_library_path
def test_system_search_by_soname() -> None:
    if _library.BUNDLED_LIBRARY.exists():
        pytest.skip("this installation bundles the library, which comes first")
    assert LIBRARY is not None
    result = run_python(REPORT, loader_path=os.path.dirname(LIBRARY))
    assert result.returncode == 0, result.stderr
    source, path, _ = result.stdout.split()
    assert source == "system" and path == os.path.realpath(LIBRARY)


def test_nothing_found_lists_what_was_tried() -> None:
    result = run_python(REPORT)
    if result.returncode == 0:
        pytest.skip(f"a libflashdecode is installed on this system: {result.stdout.strip()}")
    assert "cannot load libflashdecode (major version 0). Tried:" in result.stderr
    assert "libflashdecode.so.0 (system)" in result.stderr
    assert "Set FLASHDECODE_LIBRARY" in result.stderr


def build_fake_library(directory: Path, version_number: int, version: str, functions: list) -> str:
    """A shared library exporting stubs of ``functions`` and the given version."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build a fake library with")
    body = [
        f"unsigned fd_version_number(void) {{ return {version_number}u; }}",
        f'const char *fd_version_string(void) {{ return "{version}"; }}',
    ]
    body += [f"int {name}(void) {{ return 0; }}" for name in functions if not name.startswith("fd_version")]
    source = directory / "fake.c"
    source.write_text("\n".join(body) + "\n")
    library = directory / "libflashdecode.so.0"
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    return str(library)


def test_incompatible_major_version_is_refused(tmp_path: Path) -> None:
    every_function = [name for name, _, _ in _library._PROTOTYPES]
    fake = build_fake_library(tmp_path, 10000, "1.0.0", every_function)
    result = run_python(REPORT, library=fake)
    assert result.returncode != 0
    assert "is version 1.0.0; this binding needs 0.x with x >= 2" in result.stderr


def test_missing_function_is_refused(tmp_path: Path) -> None:
    fake = build_fake_library(tmp_path, 200, "0.2.0", [])
    result = run_python(REPORT, library=fake)
    assert result.returncode != 0
    assert "does not export fd_status_string" in result.stderr


def test_older_minor_version_is_refused_by_its_version(tmp_path: Path) -> None:
    # A 0.1 library lacks the 0.2 functions: the message names its version.
    added_in_0_2 = ("fd_plan_info_init", "fd_describe_plan")
    functions_of_0_1 = [name for name, _, _ in _library._PROTOTYPES if name not in added_in_0_2]
    fake = build_fake_library(tmp_path, 100, "0.1.0", functions_of_0_1)
    result = run_python(REPORT, library=fake)
    assert result.returncode != 0
    assert "is version 0.1.0; this binding needs 0.x with x >= 2" in result.stderr


def test_library_of_this_minor_must_have_its_functions(tmp_path: Path) -> None:
    # A library that says 0.3 must export fd_check_contents; an older one need not (see test_old_library.py).
    functions = [name for name, _, _ in _library._PROTOTYPES if name != "fd_check_contents"]
    fake = build_fake_library(tmp_path, 300, "0.3.0", functions)
    result = run_python(REPORT, library=fake)
    assert result.returncode != 0
    assert "does not export fd_check_contents" in result.stderr


def test_older_minor_must_have_that_minors_struct_sizes(tmp_path: Path) -> None:
    # A 0.2 library is loaded without the 0.3 functions, but its structs must be 0.2's
    # (the stubs here report sizes of 0).
    functions = [name for name, _, _ in _library._PROTOTYPES if _library.SINCE.get(name, 0) <= 2]
    fake = build_fake_library(tmp_path, 200, "0.2.0", functions)
    result = run_python(REPORT, library=fake)
    assert result.returncode != 0
    assert "its fd_options is 0 bytes, this binding expects 24 of version 0.2" in result.stderr


def test_struct_sizes_of_older_minors() -> None:
    # 0.3 appended its fields where 0.2's structs ended (their old padding became reserved_0).
    assert _library.struct_size_of_minor("fd_options", _library.FdOptions, 2) == 24
    assert _library.struct_size_of_minor("fd_decode_args", _library.FdDecodeArgs, 2) == 584
    assert _library.struct_size_of_minor("fd_plan_info", _library.FdPlanInfo, 2) == 56
    assert _library.struct_size_of_minor("fd_plan_info", _library.FdPlanInfo, 3) == 64
    assert _library.struct_size_of_minor("fd_options", _library.FdOptions, 3) == 32
    assert _library.struct_size_of_minor("fd_decode_args", _library.FdDecodeArgs, 3) == 1008
    assert ctypes.sizeof(_library.FdAppendArgs) == 648


def test_attention_variant_fields_sit_where_the_header_puts_them() -> None:
    """The 0.3 fields of fd_decode_args at the offsets of C's offsetof (LP64): a misplaced one
    would pass the size check and be read as another field."""
    offsets = {name: getattr(_library.FdDecodeArgs, name).offset for name, _ in _library.FdDecodeArgs._fields_}
    assert {name: offsets[name] for name in ("split_tokens", "mask", "logit_softcap", "window_left")} == {
        "split_tokens": 584,
        "mask": 592,
        "logit_softcap": 596,
        "window_left": 600,
    }
    assert (offsets["alibi_slopes"], offsets["sinks"]) == (608, 688)
    assert (offsets["k_scale"], offsets["v_scale"], offsets["q_lens"]) == (768, 848, 928)
    assert ctypes.sizeof(_library.FdDecodeArgs) == 1008


def test_switching_library_after_loading_is_refused() -> None:
    info = flashdecode.load_library()
    assert flashdecode.load_library(info.path) == info
    with pytest.raises(flashdecode.LibraryError, match="is already loaded"):
        flashdecode.load_library("/elsewhere/libflashdecode.so.0")


def test_versions_agree() -> None:
    info = flashdecode.load_library()
    assert info.version == flashdecode.version()
    assert info.version_number // 10000 == _library.ABI_MAJOR
    assert flashdecode.__version__.split(".")[:2] == info.version.split(".")[:2]
