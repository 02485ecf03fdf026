# SPDX-License-Identifier: Apache-2.0
"""The in-tree build backend: metadata, wheel contents and tags, the sdist, build settings, editable installs.

(The CTest suite also makes the wheel and the sdist as for PyPI, checks the
wheel's tag with auditwheel, installs both into fresh venvs — the sdist by
building the library — and runs the READMEs' quickstarts from them.)"""

from __future__ import annotations

import base64
import email.parser
import hashlib
import importlib.util
import os
import sys
import tarfile
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

import flashdecode

BINDING_ROOT = Path(__file__).resolve().parent.parent
REPOSITORY = BINDING_ROOT.parent.parent
VERSION = flashdecode.__version__
DIST_INFO = f"flashdecode-{VERSION}.dist-info"


def load_backend(root: Path, name: str = "flashdecode_build") -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, root / "build_backend" / "flashdecode_build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def backend() -> ModuleType:
    return load_backend(BINDING_ROOT)


@pytest.fixture(autouse=True)
def no_build_environment(monkeypatch) -> None:
    """The backend's environment variables, unset: each test says what it wants."""
    for name in ("FLASHDECODE_BUNDLE_LIBRARY", "FLASHDECODE_PLATFORM_TAG", "FLASHDECODE_CUDA", "CMAKE_ARGS"):
        monkeypatch.delenv(name, raising=False)


def test_project_table_without_tomllib(backend, monkeypatch) -> None:
    parsed = backend.read_project()
    monkeypatch.setitem(sys.modules, "tomllib", None)  # as on Python < 3.11
    assert backend.read_project() == parsed
    assert parsed["name"] == "flashdecode" and parsed["version"] == VERSION
    assert parsed["dependencies"] == ["numpy>=1.21"]
    assert len(parsed["classifiers"]) > 5 and parsed["urls"]["Repository"].startswith("https://")


def test_multiline_arrays_without_tomllib(backend, tmp_path, monkeypatch) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        '[project]\nname = "x"\nkeywords = [\n  "a",  # why\n  "b[c]",\n]\n[tool.other]\nkeys = [\n "z"]\n'
        '[project.urls]\nRepository = "https://example.org/x"\n'
    )
    monkeypatch.setitem(sys.modules, "tomllib", None)
    assert backend.read_project(pyproject) == {
        "name": "x",
        "keywords": ["a", "b[c]"],
        "urls": {"Repository": "https://example.org/x"},
    }
    pyproject.write_text('[project]\nkeywords = [\n  "a",\n')
    with pytest.raises(ValueError, match="keywords"):
        backend.read_project(pyproject)


def test_license_is_the_repository_license() -> None:
    # pyproject.toml's license-files cannot reach outside bindings/python: it keeps a copy.
    assert (BINDING_ROOT / "LICENSE").read_bytes() == (REPOSITORY / "LICENSE").read_bytes()


def wheel_entries(path: Path) -> dict:
    with zipfile.ZipFile(path) as wheel:
        entries = {info.filename: (wheel.read(info), info.external_attr >> 16) for info in wheel.infolist()}
    record = entries[f"{DIST_INFO}/RECORD"][0].decode().splitlines()
    for line in record:
        name, digest, size = line.rsplit(",", 2)
        if name.endswith("RECORD"):
            continue
        data = entries[name][0]
        expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        assert digest == f"sha256={expected}" and int(size) == len(data), name
    assert len(record) == len(entries)
    return entries


def check_metadata(text: str) -> None:
    """Core metadata 2.4 as PyPI wants it: PEP 639 license fields, a URL, classifiers, the README."""
    metadata = email.parser.Parser().parsestr(text)
    assert metadata["Metadata-Version"] == "2.4"
    assert metadata["Name"] == "flashdecode" and metadata["Version"] == VERSION
    assert metadata["License-Expression"] == "Apache-2.0" and metadata.get_all("License-File") == ["LICENSE"]
    # PyPI refuses license classifiers beside License-Expression.
    classifiers = metadata.get_all("Classifier")
    assert classifiers and not any(classifier.startswith("License ::") for classifier in classifiers)
    assert metadata.get_all("Project-URL") == ["Repository, https://github.com/flashdecode/flashdecode"]
    assert metadata["Requires-Python"] == ">=3.8"
    assert "Requires-Dist: numpy>=1.21" in text and 'Requires-Dist: ml_dtypes; extra == "bf16"' in text
    assert metadata["Description-Content-Type"] == "text/markdown; charset=UTF-8"
    assert metadata.get_payload() == (BINDING_ROOT / "README.md").read_text(encoding="utf-8")
    try:
        from packaging.metadata import Metadata  # 24.1 and newer know 2.4
        from packaging.version import Version
        import packaging
    except ImportError:
        return
    if Version(packaging.__version__) >= Version("24.1"):
        Metadata.from_email(text, validate=True)


def test_pure_wheel(backend, tmp_path) -> None:
    name = backend.build_wheel(str(tmp_path))
    assert name == f"flashdecode-{VERSION}-py3-none-any.whl"
    entries = wheel_entries(tmp_path / name)
    assert "flashdecode/__init__.py" in entries and "flashdecode/py.typed" in entries
    assert not any(entry.startswith("flashdecode/_lib/") or "__pycache__" in entry for entry in entries)
    wheel_info = entries[f"{DIST_INFO}/WHEEL"][0].decode()
    assert "Root-Is-Purelib: true" in wheel_info and "Tag: py3-none-any" in wheel_info
    check_metadata(entries[f"{DIST_INFO}/METADATA"][0].decode())
    assert entries[f"{DIST_INFO}/licenses/LICENSE"][0] == (REPOSITORY / "LICENSE").read_bytes()
    with pytest.raises(ValueError, match="platform-tag"):
        backend.build_wheel(str(tmp_path), {"platform-tag": "manylinux_2_35_x86_64"})


@pytest.fixture
def library() -> str:
    library = os.environ.get("FLASHDECODE_LIBRARY")
    if not library:
        pytest.skip("FLASHDECODE_LIBRARY names no library to bundle")
    return library


def test_wheel_bundling_the_library(backend, library, tmp_path) -> None:
    name = backend.build_wheel(str(tmp_path), {"bundle-library": library})
    assert name.startswith(f"flashdecode-{VERSION}-py3-none-linux_")
    entries = wheel_entries(tmp_path / name)
    data, mode = entries["flashdecode/_lib/libflashdecode.so.0"]
    assert data == Path(library).read_bytes() and mode & 0o777 == 0o755
    assert "Root-Is-Purelib: false" in entries[f"{DIST_INFO}/WHEEL"][0].decode()
    assert f"{DIST_INFO}/licenses/LICENSE" in entries
    with pytest.raises(FileNotFoundError, match="bundle-library"):
        backend.build_wheel(str(tmp_path), {"bundle-library": str(tmp_path / "missing.so")})
    # A relative path is read from the backend's working folder, which pip chooses: the message says so.
    with pytest.raises(FileNotFoundError, match="relative path, read from"):
        backend.build_wheel(str(tmp_path), {"bundle-library": "build/stage/lib/missing.so"})


def test_claimed_platform_tag(backend, tmp_path, monkeypatch) -> None:
    arch = backend._platform_tag().partition("_")[2]
    stand_in = tmp_path / "libflashdecode.so.0"  # the backend bundles the file as it is
    stand_in.write_bytes(b"\x7fELF")
    monkeypatch.setenv("FLASHDECODE_BUNDLE_LIBRARY", str(stand_in))
    name = backend.build_wheel(str(tmp_path), {"platform-tag": f"manylinux_2_35_{arch}"})
    assert name == f"flashdecode-{VERSION}-py3-none-manylinux_2_35_{arch}.whl"
    assert f"Tag: py3-none-manylinux_2_35_{arch}\n" in wheel_entries(tmp_path / name)[f"{DIST_INFO}/WHEEL"][0].decode()
    # pip asks for the metadata before the wheel: the same files, without building anything.
    prepared = tmp_path / "prepared"
    assert (
        backend.prepare_metadata_for_build_wheel(str(prepared), {"platform-tag": f"manylinux_2_35_{arch}"}) == DIST_INFO
    )
    entries = wheel_entries(tmp_path / name)
    for path in prepared.rglob("*"):
        if path.is_file():
            assert path.read_bytes() == entries[path.relative_to(prepared).as_posix()][0], path
    assert (prepared / DIST_INFO / "licenses" / "LICENSE").is_file()
    monkeypatch.setenv("FLASHDECODE_PLATFORM_TAG", f"linux_{arch}")
    assert backend.build_wheel(str(tmp_path)) == f"flashdecode-{VERSION}-py3-none-linux_{arch}.whl"
    for wrong in ("manylinux2014_x86_64", "linux_2_35_x86_64", "manylinux_2_35_other", "any"):
        with pytest.raises(ValueError, match="not a Linux tag"):
            backend.build_wheel(str(tmp_path), {"platform-tag": wrong})


def unpack(sdist: Path, into: Path) -> Path:
    with tarfile.open(sdist) as archive:
        # The "data" filter where this Python has it (3.8.17, 3.11.4 and newer), as 3.14 makes it the default.
        archive.extractall(into, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return into / f"flashdecode-{VERSION}"


def test_sdist(backend, tmp_path) -> None:
    sdist = tmp_path / backend.build_sdist(str(tmp_path))
    assert sdist.name == f"flashdecode-{VERSION}.tar.gz"
    with tarfile.open(sdist) as archive:
        members = {member.name: archive.extractfile(member).read() for member in archive.getmembers()}
    base = f"flashdecode-{VERSION}/"
    names = {name[len(base) :] for name in members}
    python = {"pyproject.toml", "PKG-INFO", "README.md", "LICENSE", "build_backend/flashdecode_build.py"}
    python |= {"src/flashdecode/__init__.py", "src/flashdecode/_library.py", "tests/conftest.py"}
    assert python <= names
    # The C project, as the repository has it: every file of include/ and src/ and what CMake reads besides.
    c_project = {"CMakeLists.txt", "LICENSE", "flashdecode.pc.in", "docs/CMakeLists.txt", "docs/Doxyfile.in"}
    for folder in ("include", "src"):
        c_project |= {path.relative_to(REPOSITORY).as_posix() for path in (REPOSITORY / folder).rglob("*")}
    c_project = {name for name in c_project if not (REPOSITORY / name).is_dir()}
    assert {name[len("libflashdecode/") :] for name in names if name.startswith("libflashdecode/")} == c_project
    assert members[f"{base}libflashdecode/src/CMakeLists.txt"] == (REPOSITORY / "src" / "CMakeLists.txt").read_bytes()
    assert not any("__pycache__" in name or name.endswith(".pyc") for name in names)
    check_metadata(members[f"{base}PKG-INFO"].decode())

    # Reproducible, and an sdist made from the unpacked sdist is the same archive.
    again = tmp_path / "again"
    again.mkdir()
    assert (again / backend.build_sdist(str(again))).read_bytes() == sdist.read_bytes()
    unpacked = unpack(sdist, tmp_path / "unpacked")
    from_sdist = tmp_path / "from_sdist"
    from_sdist.mkdir()
    sdist_backend = load_backend(unpacked, "flashdecode_build_in_sdist")
    assert (from_sdist / sdist_backend.build_sdist(str(from_sdist))).read_bytes() == sdist.read_bytes()
    # In an sdist the library is built by default; in the repository the system's is used.
    assert sdist_backend.library_choice() == "build" and backend.library_choice() == "none"
    assert sdist_backend.c_project_root() == unpacked / "libflashdecode"
    assert backend.c_project_root() == REPOSITORY


def test_build_settings(backend, monkeypatch) -> None:
    defaults = ["-DCMAKE_BUILD_TYPE=Release", "-DFLASHDECODE_TESTS=OFF", "-DFLASHDECODE_PROGRAM=OFF",
                "-DCMAKE_INSTALL_LIBDIR=lib"]
    args = backend.cmake_configure_args()
    assert args[:4] == defaults and not any("FLASHDECODE_CUDA" in arg for arg in args)
    args = backend.cmake_configure_args({"cuda": "off", "cmake-args": "-DFLASHDECODE_CUDA_ARCHS='90a-real;80-real'"})
    assert args[-2:] == ["-DFLASHDECODE_CUDA=OFF", "-DFLASHDECODE_CUDA_ARCHS=90a-real;80-real"]
    monkeypatch.setenv("FLASHDECODE_CUDA", "on")
    monkeypatch.setenv("CMAKE_ARGS", "-DA=1 -DB=2")
    assert backend.cmake_configure_args()[-3:] == ["-DFLASHDECODE_CUDA=ON", "-DA=1", "-DB=2"]
    # A config setting wins over the environment; given twice, the last one counts.
    assert backend.cmake_configure_args({"cuda": ["ON", "AUTO"]})[-3] == "-DFLASHDECODE_CUDA=AUTO"
    with pytest.raises(ValueError, match="FLASHDECODE_CUDA"):
        backend.cmake_configure_args({"cuda": "yes"})
    monkeypatch.setenv("CMAKE_GENERATOR", "Unix Makefiles")
    assert "-G" not in backend.cmake_configure_args()

    assert backend.library_choice({"bundle_library": "build"}) == "build"
    monkeypatch.setenv("FLASHDECODE_BUNDLE_LIBRARY", "build")
    assert backend.library_choice() == "build"
    assert backend.get_requires_for_build_wheel({"bundle-library": "none"}) == []
    monkeypatch.setattr(backend, "find_cmake", lambda: None)
    assert backend.get_requires_for_build_wheel() == ["cmake>=3.24"]
    with pytest.raises(RuntimeError, match="CMake >= 3.24"):
        backend.build_library(None, Path("/nonexistent"))


def test_cmake_minimum_matches_the_project(backend) -> None:
    text = (REPOSITORY / "CMakeLists.txt").read_text()
    wanted = ".".join(map(str, backend.CMAKE_MINIMUM))
    assert f"cmake_minimum_required(VERSION {wanted})" in text


def test_editable(backend, tmp_path) -> None:
    editable = wheel_entries(tmp_path / backend.build_editable(str(tmp_path)))
    assert editable["_flashdecode_editable.pth"][0].decode().strip() == (BINDING_ROOT / "src").as_posix()
    assert backend.get_requires_for_build_wheel() == [] and backend.get_requires_for_build_sdist() == []
