# SPDX-License-Identifier: Apache-2.0
"""PEP 517 build backend for the flashdecode package, standard library only.

Not setuptools nor scikit-build-core, so that building needs nothing from the
network: pip has nothing to install into its isolated build environment
(unless no CMake >= 3.24 is on PATH), and machines without a package index can
still ``pip install`` the package or its sdist. A wheel carrying
libflashdecode is tagged ``py3-none-<platform>`` (ctypes works on any Python
3, the library is for one platform), or with the manylinux tag PyPI wants,
when told it (see bindings/README.md, "Building the Python package").

Config settings (``pip wheel -C key=value``), or the environment:

``bundle-library`` / ``FLASHDECODE_BUNDLE_LIBRARY``
    What the wheel carries as ``flashdecode/_lib/libflashdecode.so.0``, which
    the package loads before looking on the system:

    - a path: that built ``libflashdecode.so.0``;
    - ``build``: a library built here with CMake from the C sources (the
      sdist's ``libflashdecode/`` folder, or the repository around
      ``bindings/python``);
    - ``none``: nothing; the package finds the library on the system.

    Unset: ``build`` in an sdist (which carries the C sources), ``none`` in the
    repository's ``bindings/python``.

``platform-tag`` / ``FLASHDECODE_PLATFORM_TAG`` (with a library)
    The wheel's platform tag instead of this machine's ``linux_<arch>``, e.g.
    ``manylinux_2_35_x86_64``: a claim about the library's symbol versions
    and dependencies, which ``auditwheel show`` checks (this backend does
    not). ``bindings/tools/python_dist.sh`` takes the tag from auditwheel.

``cuda`` / ``FLASHDECODE_CUDA`` (``build`` only)
    ``ON``, ``OFF`` or ``AUTO`` (CMake's default: CUDA when nvcc is found).

``cmake-args`` / ``CMAKE_ARGS`` (``build`` only)
    More CMake arguments, split like a shell line and given last, e.g.
    ``-DFLASHDECODE_CUDA_ARCHS=90a-real``. ``CMAKE_BUILD_PARALLEL_LEVEL`` and
    ``CMAKE_GENERATOR`` are honoured as CMake honours them.
"""

from __future__ import annotations

import ast
import base64
import gzip
import hashlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "flashdecode"
SONAME = "libflashdecode.so.0"
# Where an sdist keeps the C project (the repository's CMake project, less its tests and bindings).
SDIST_C_DIR = "libflashdecode"
# What of the repository the library's CMake build reads, with FLASHDECODE_TESTS=OFF and FLASHDECODE_PROGRAM=OFF.
C_PROJECT_FILES = ("CMakeLists.txt", "LICENSE", "flashdecode.pc.in", "docs/CMakeLists.txt", "docs/Doxyfile.in")
C_PROJECT_FOLDERS = ("include", "src")
CMAKE_MINIMUM = (3, 24)  # the top-level CMakeLists.txt's cmake_minimum_required
# Fixed timestamps make wheels and sdists reproducible (the zip format starts at 1980).
ZIP_TIME = (1980, 1, 1, 0, 0, 0)

FileEntry = Tuple[str, bytes, int]  # archive path, contents, permission bits


def read_project(pyproject: Path = ROOT / "pyproject.toml") -> Dict[str, Any]:
    """The ``[project]`` table (with ``optional-dependencies`` and ``urls``) of pyproject.toml.

    Uses tomllib where it exists (3.11+). Before that, reads the ``key =
    value`` entries this project keeps: TOML strings and arrays of strings are
    also Python literals (an array may span lines).
    """
    text = pyproject.read_text(encoding="utf-8")
    try:
        import tomllib
    except ImportError:
        pass
    else:
        return dict(tomllib.loads(text)["project"])
    project: Dict[str, Any] = {}
    tables = {"project": project}
    for name in ("optional-dependencies", "urls"):
        tables[f"project.{name}"] = project.setdefault(name, {})
    table: Optional[Dict[str, Any]] = None
    pending: Optional[Tuple[str, str]] = None  # a key whose value continues on the next line
    for raw in text.splitlines():
        if pending is not None:
            key, value = pending[0], f"{pending[1]}\n{raw}"
        else:
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("["):
                table = tables.get(line.strip("[]").strip())
                continue
            if table is None:
                continue
            key, _, value = line.partition("=")
            key, value = key.strip(), value.strip()
        assert table is not None
        try:
            table[key] = ast.literal_eval(value)
            pending = None
        except SyntaxError:
            pending = (key, value)
    if pending is not None:
        raise ValueError(f"{pyproject}: the value of {pending[0]} does not end")
    return {key: value for key, value in project.items() if value != {}}


def _license_files(project: Mapping[str, Any]) -> List[Path]:
    """The files ``license-files`` names (globs in the project folder); each pattern must match one (PEP 639)."""
    files: List[Path] = []
    for pattern in project.get("license-files", []):
        matches = sorted(path for path in ROOT.glob(pattern) if path.is_file())
        if not matches:
            raise FileNotFoundError(f"pyproject.toml: license-files: {pattern!r} matches no file in {ROOT}")
        files += [path for path in matches if path not in files]
    return files


def _metadata(project: Mapping[str, Any]) -> bytes:
    """Core metadata 2.4: 2.4 is the first version with License-Expression and License-File (PEP 639)."""
    lines = [
        "Metadata-Version: 2.4",
        f"Name: {project['name']}",
        f"Version: {project['version']}",
        f"Summary: {project['description']}",
    ]
    if project.get("keywords"):
        lines.append(f"Keywords: {','.join(project['keywords'])}")
    lines += [f"Project-URL: {label}, {url}" for label, url in project.get("urls", {}).items()]
    lines.append(f"License-Expression: {project['license']}")
    lines += [f"License-File: {path.relative_to(ROOT).as_posix()}" for path in _license_files(project)]
    lines += [f"Classifier: {classifier}" for classifier in project.get("classifiers", [])]
    lines.append(f"Requires-Python: {project['requires-python']}")
    lines += [f"Requires-Dist: {requirement}" for requirement in project.get("dependencies", [])]
    for extra, requirements in project.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f'Requires-Dist: {requirement}; extra == "{extra}"' for requirement in requirements]
    text = "\n".join(lines) + "\n"
    readme = project.get("readme")
    if readme:
        if not readme.endswith(".md"):
            raise ValueError(f"pyproject.toml: readme {readme!r}: this backend knows Markdown (.md) only")
        text += "Description-Content-Type: text/markdown; charset=UTF-8\n\n"
        text += (ROOT / readme).read_text(encoding="utf-8")
    return text.encode()


def _package_files() -> List[FileEntry]:
    source = ROOT / "src" / PACKAGE
    return [
        (f"{PACKAGE}/{path.relative_to(source).as_posix()}", path.read_bytes(), 0o644)
        for path in sorted(source.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc" and "_lib" not in path.parts
    ]


def _setting(config_settings: Optional[Mapping[str, Any]], name: str, env: str) -> Optional[str]:
    """A config setting (``name`` or ``name`` with underscores; the last one if given twice), else ``$env``."""
    settings = config_settings or {}
    value = settings.get(name, settings.get(name.replace("-", "_")))
    if isinstance(value, list):
        value = value[-1] if value else None
    if value is None or value == "":
        value = os.environ.get(env)
    return value or None


def c_project_root() -> Optional[Path]:
    """The C project to build: the sdist's copy, else the repository around bindings/python, else None."""
    for root in (ROOT / SDIST_C_DIR, ROOT.parent.parent):
        if (root / "CMakeLists.txt").is_file() and (root / "include" / "flashdecode.h").is_file():
            return root
    return None


def library_choice(config_settings: Optional[Mapping[str, Any]] = None) -> str:
    """``"none"``, ``"build"`` or the path of a library to bundle, as ``bundle-library`` says (see the module)."""
    value = _setting(config_settings, "bundle-library", "FLASHDECODE_BUNDLE_LIBRARY")
    if value is None:
        return "build" if (ROOT / SDIST_C_DIR / "CMakeLists.txt").is_file() else "none"
    return value


def _library_to_bundle(choice: str) -> Path:
    library = Path(choice)
    if not library.is_file():
        where = ""
        if not library.is_absolute():
            where = f" (a relative path, read from {Path.cwd()}: pip runs this backend there)"
        raise FileNotFoundError(f"bundle-library: {library} is not a file{where}")
    return library


def _cmake_version(cmake: str) -> Optional[Tuple[int, ...]]:
    try:
        output = subprocess.run([cmake, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    match = re.search(r"version (\d+)\.(\d+)", output)
    return (int(match.group(1)), int(match.group(2))) if match else None


def find_cmake() -> Optional[str]:
    """``cmake`` on PATH if it is recent enough for the project, else None."""
    cmake = shutil.which("cmake")
    if cmake is None:
        return None
    version = _cmake_version(cmake)
    return cmake if version is not None and version >= CMAKE_MINIMUM else None


def cmake_configure_args(config_settings: Optional[Mapping[str, Any]] = None) -> List[str]:
    """The project's CMake options for a bundled library, then ``cuda``, then ``cmake-args`` (later ones win)."""
    args = ["-DCMAKE_BUILD_TYPE=Release", "-DFLASHDECODE_TESTS=OFF", "-DFLASHDECODE_PROGRAM=OFF",
            "-DCMAKE_INSTALL_LIBDIR=lib"]
    if "CMAKE_GENERATOR" not in os.environ and shutil.which("ninja"):
        args += ["-G", "Ninja"]
    cuda = _setting(config_settings, "cuda", "FLASHDECODE_CUDA")
    if cuda is not None:
        if cuda.upper() not in ("ON", "OFF", "AUTO"):
            raise ValueError(f"cuda / FLASHDECODE_CUDA: {cuda!r} is not ON, OFF or AUTO")
        args.append(f"-DFLASHDECODE_CUDA={cuda.upper()}")
    extra = _setting(config_settings, "cmake-args", "CMAKE_ARGS")
    if extra:
        args += shlex.split(extra)
    return args


def _run(command: Sequence[str]) -> None:
    print("flashdecode_build:", shlex.join(command), file=sys.stderr, flush=True)
    subprocess.run(command, check=True)


def build_library(config_settings: Optional[Mapping[str, Any]], workdir: Path) -> Path:
    """Configures, builds and installs libflashdecode under ``workdir``; the installed library."""
    source = c_project_root()
    if source is None:
        raise FileNotFoundError(
            f"bundle-library=build: no C sources: neither {ROOT / SDIST_C_DIR} nor {ROOT.parent.parent} "
            "holds flashdecode's CMakeLists.txt and include/flashdecode.h"
        )
    cmake = find_cmake()
    if cmake is None:
        wanted = ".".join(map(str, CMAKE_MINIMUM))
        raise RuntimeError(f"bundle-library=build needs CMake >= {wanted} on PATH (pip install cmake, or apt)")
    build, prefix = workdir / "build", workdir / "install"
    _run([cmake, "-S", str(source), "-B", str(build), *cmake_configure_args(config_settings)])
    parallel = [] if os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") else ["--parallel", str(os.cpu_count() or 1)]
    _run([cmake, "--build", str(build), *parallel])
    _run([cmake, "--install", str(build), "--prefix", str(prefix)])
    return prefix / "lib" / SONAME


def _platform_tag(config_settings: Optional[Mapping[str, Any]] = None) -> str:
    """``platform-tag`` when given (a claim; ``auditwheel show`` checks it), else this machine's ``linux_<arch>``."""
    native = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    claimed = _setting(config_settings, "platform-tag", "FLASHDECODE_PLATFORM_TAG")
    if claimed is None:
        return native
    arch = native.partition("_")[2]
    form = rf"(linux|(many|musl)linux_\d+_\d+)_{re.escape(arch)}"
    if not native.startswith("linux_") or not re.fullmatch(form, claimed):
        raise ValueError(f"platform-tag: {claimed!r} is not a Linux tag for {arch}, e.g. manylinux_2_35_{arch}")
    return claimed


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def _dist_info(tag: str, purelib: bool) -> Tuple[str, List[FileEntry]]:
    """The name of the wheel's .dist-info folder, and its files but RECORD."""
    project = read_project()
    dist_info = f"{project['name']}-{project['version']}.dist-info"
    wheel_info = (
        "Wheel-Version: 1.0\nGenerator: flashdecode_build\n"
        f"Root-Is-Purelib: {'true' if purelib else 'false'}\nTag: {tag}\n"
    ).encode()
    licenses = [
        (f"{dist_info}/licenses/{path.relative_to(ROOT).as_posix()}", path.read_bytes(), 0o644)
        for path in _license_files(project)
    ]
    return dist_info, [
        (f"{dist_info}/METADATA", _metadata(project), 0o644),
        (f"{dist_info}/WHEEL", wheel_info, 0o644),
        (f"{dist_info}/top_level.txt", f"{PACKAGE}\n".encode(), 0o644),
        *licenses,
    ]


def _wheel_tag(config_settings: Optional[Mapping[str, Any]]) -> Tuple[str, bool]:
    """The wheel's tag, and whether it is pure Python: a wheel carrying the library is for one platform."""
    if library_choice(config_settings) == "none":
        if _setting(config_settings, "platform-tag", "FLASHDECODE_PLATFORM_TAG"):
            raise ValueError("platform-tag: a wheel without the library (bundle-library=none) is py3-none-any")
        return "py3-none-any", True
    return f"py3-none-{_platform_tag(config_settings)}", False


def _write_wheel(directory: str, files: List[FileEntry], tag: str, purelib: bool) -> str:
    dist_info, metadata = _dist_info(tag, purelib)
    entries = files + metadata
    record = "".join(f"{path},{_record_hash(data)},{len(data)}\n" for path, data, _ in entries)
    entries.append((f"{dist_info}/RECORD", (record + f"{dist_info}/RECORD,,\n").encode(), 0o644))
    filename = f"{dist_info[: -len('.dist-info')]}-{tag}.whl"
    with zipfile.ZipFile(Path(directory) / filename, "w", compression=zipfile.ZIP_DEFLATED) as wheel:
        for path, data, mode in entries:
            info = zipfile.ZipInfo(path, date_time=ZIP_TIME)
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            wheel.writestr(info, data)
    return filename


# ---- PEP 517 / PEP 660 hooks ------------------------------------------------


def get_requires_for_build_wheel(config_settings: Optional[Mapping[str, Any]] = None) -> List[str]:
    """Nothing, unless the library is to be built and no recent enough CMake is on PATH."""
    if library_choice(config_settings) == "build" and find_cmake() is None:
        return [f"cmake>={'.'.join(map(str, CMAKE_MINIMUM))}"]
    return []


def get_requires_for_build_sdist(config_settings: Optional[Mapping[str, Any]] = None) -> List[str]:
    return []


def get_requires_for_build_editable(config_settings: Optional[Mapping[str, Any]] = None) -> List[str]:
    return []


def prepare_metadata_for_build_wheel(
    metadata_directory: str, config_settings: Optional[Mapping[str, Any]] = None
) -> str:
    """The wheel's .dist-info, without building the library: pip resolves the dependencies first."""
    dist_info, entries = _dist_info(*_wheel_tag(config_settings))
    for path, data, _ in entries:
        target = Path(metadata_directory) / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return dist_info


def build_wheel(
    wheel_directory: str,
    config_settings: Optional[Mapping[str, Any]] = None,
    metadata_directory: Optional[str] = None,
) -> str:
    """A wheel of the package, carrying the library ``bundle-library`` chooses (see the module)."""
    tag, purelib = _wheel_tag(config_settings)
    files = _package_files()
    choice = library_choice(config_settings)
    if choice != "none":
        with tempfile.TemporaryDirectory(prefix="flashdecode-build-") as workdir:
            library = build_library(config_settings, Path(workdir)) if choice == "build" else _library_to_bundle(choice)
            files.append((f"{PACKAGE}/_lib/{SONAME}", library.read_bytes(), 0o755))
    return _write_wheel(wheel_directory, files, tag, purelib)


def build_editable(
    wheel_directory: str,
    config_settings: Optional[Mapping[str, Any]] = None,
    metadata_directory: Optional[str] = None,
) -> str:
    """An editable install: a .pth file putting this source tree's ``src`` on sys.path."""
    pth = f"{(ROOT / 'src').as_posix()}\n".encode()
    return _write_wheel(wheel_directory, [(f"_{PACKAGE}_editable.pth", pth, 0o644)], "py3-none-any", purelib=True)


def sdist_files() -> List[Tuple[str, Path]]:
    """(path in the sdist, file here): the Python project, its tests, and the C project under libflashdecode/."""
    project = read_project()
    python = [ROOT / "pyproject.toml", Path(__file__).resolve(), *_license_files(project)]
    if project.get("readme"):
        python.append(ROOT / project["readme"])
    for folder in ("src", "tests"):
        python += sorted(
            p for p in (ROOT / folder).rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
        )
    files = [(path.relative_to(ROOT).as_posix(), path) for path in python]
    c_root = c_project_root()
    if c_root is None:
        raise FileNotFoundError(
            f"build_sdist: flashdecode's C project is neither in {ROOT / SDIST_C_DIR} nor in {ROOT.parent.parent}"
        )
    c_files = [c_root / name for name in C_PROJECT_FILES]
    for folder in C_PROJECT_FOLDERS:
        c_files += sorted(p for p in (c_root / folder).rglob("*") if p.is_file())
    files += [(f"{SDIST_C_DIR}/{path.relative_to(c_root).as_posix()}", path) for path in c_files]
    return files


def build_sdist(sdist_directory: str, config_settings: Optional[Mapping[str, Any]] = None) -> str:
    """A source distribution from which ``pip install`` builds the library and bundles it."""
    project = read_project()
    base = f"{project['name']}-{project['version']}"
    filename = f"{base}.tar.gz"
    members = [(path, source.read_bytes()) for path, source in sdist_files()]
    members.append(("PKG-INFO", _metadata(project)))
    # gzip's header carries a time and a file name: zero and none, for a reproducible archive.
    with open(Path(sdist_directory) / filename, "wb") as raw, gzip.GzipFile(
        filename="", mode="wb", fileobj=raw, mtime=0
    ) as compressed, tarfile.open(fileobj=compressed, mode="w", format=tarfile.PAX_FORMAT) as sdist:
        for path, data in members:
            info = tarfile.TarInfo(f"{base}/{path}")
            info.size = len(data)
            info.mode = 0o644
            sdist.addfile(info, io.BytesIO(data))
    return filename
