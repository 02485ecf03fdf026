# SPDX-License-Identifier: Apache-2.0
"""PEP 517 build backend for the flashdecode package, standard library only.

Not setuptools, so that building needs nothing from the network (pip has
nothing to install into the build environment, and machines without a
package index can still ``pip install`` the package), and so that a wheel
bundling libflashdecode gets the right tag: ``py3-none-<platform>`` (ctypes
works on any Python 3, but the library is for one platform), or the
manylinux tag PyPI wants, when told it (see bindings/README.md, "Building the
Python package").

Config settings (``pip wheel -C key=value``), or the environment:

``bundle-library`` / ``FLASHDECODE_BUNDLE_LIBRARY``
    Path of a built ``libflashdecode.so.0`` to ship as
    ``flashdecode/_lib/libflashdecode.so.0``, which the package loads before
    looking on the system.

``platform-tag`` / ``FLASHDECODE_PLATFORM_TAG`` (with a library)
    The wheel's platform tag instead of this machine's ``linux_<arch>``, e.g.
    ``manylinux_2_35_x86_64``: a claim about the library's symbol versions
    and dependencies, which ``auditwheel show`` checks (this backend does
    not). ``bindings/tools/python_dist.sh`` takes the tag from auditwheel.
"""

from __future__ import annotations

import ast
import base64
import hashlib
import io
import os
import re
import sysconfig
import tarfile
import zipfile
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "flashdecode"
SONAME = "libflashdecode.so.0"
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


def _library_to_bundle(config_settings: Optional[Mapping[str, Any]]) -> Optional[Path]:
    value = _setting(config_settings, "bundle-library", "FLASHDECODE_BUNDLE_LIBRARY")
    if value is None:
        return None
    library = Path(value)
    if not library.is_file():
        where = ""
        if not library.is_absolute():
            where = f" (a relative path, read from {Path.cwd()}: pip runs this backend there)"
        raise FileNotFoundError(f"bundle-library: {library} is not a file{where}")
    return library


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


def _write_wheel(directory: str, files: List[FileEntry], tag: str, purelib: bool) -> str:
    project = read_project()
    name, version = project["name"], project["version"]
    dist_info = f"{name}-{version}.dist-info"
    wheel_info = (
        "Wheel-Version: 1.0\nGenerator: flashdecode_build\n"
        f"Root-Is-Purelib: {'true' if purelib else 'false'}\nTag: {tag}\n"
    ).encode()
    licenses = [
        (f"{dist_info}/licenses/{path.relative_to(ROOT).as_posix()}", path.read_bytes(), 0o644)
        for path in _license_files(project)
    ]
    entries = files + [
        (f"{dist_info}/METADATA", _metadata(project), 0o644),
        (f"{dist_info}/WHEEL", wheel_info, 0o644),
        (f"{dist_info}/top_level.txt", f"{PACKAGE}\n".encode(), 0o644),
        *licenses,
    ]
    record = "".join(f"{path},{_record_hash(data)},{len(data)}\n" for path, data, _ in entries)
    entries.append((f"{dist_info}/RECORD", (record + f"{dist_info}/RECORD,,\n").encode(), 0o644))
    filename = f"{name}-{version}-{tag}.whl"
    with zipfile.ZipFile(Path(directory) / filename, "w", compression=zipfile.ZIP_DEFLATED) as wheel:
        for path, data, mode in entries:
            info = zipfile.ZipInfo(path, date_time=ZIP_TIME)
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            wheel.writestr(info, data)
    return filename


# ---- PEP 517 / PEP 660 hooks ------------------------------------------------


def get_requires_for_build_wheel(config_settings: Optional[Mapping[str, Any]] = None) -> List[str]:
    return []


def get_requires_for_build_sdist(config_settings: Optional[Mapping[str, Any]] = None) -> List[str]:
    return []


def get_requires_for_build_editable(config_settings: Optional[Mapping[str, Any]] = None) -> List[str]:
    return []


def build_wheel(
    wheel_directory: str,
    config_settings: Optional[Mapping[str, Any]] = None,
    metadata_directory: Optional[str] = None,
) -> str:
    """A wheel of the package; with ``bundle-library``, one carrying the library too."""
    files = _package_files()
    library = _library_to_bundle(config_settings)
    if library is None:
        if _setting(config_settings, "platform-tag", "FLASHDECODE_PLATFORM_TAG"):
            raise ValueError("platform-tag: a wheel without the library is py3-none-any")
        return _write_wheel(wheel_directory, files, "py3-none-any", purelib=True)
    files.append((f"{PACKAGE}/_lib/{SONAME}", library.read_bytes(), 0o755))
    return _write_wheel(wheel_directory, files, f"py3-none-{_platform_tag(config_settings)}", purelib=False)


def build_editable(
    wheel_directory: str,
    config_settings: Optional[Mapping[str, Any]] = None,
    metadata_directory: Optional[str] = None,
) -> str:
    """An editable install: a .pth file putting this source tree's ``src`` on sys.path."""
    pth = f"{(ROOT / 'src').as_posix()}\n".encode()
    return _write_wheel(wheel_directory, [(f"_{PACKAGE}_editable.pth", pth, 0o644)], "py3-none-any", purelib=True)


def build_sdist(sdist_directory: str, config_settings: Optional[Mapping[str, Any]] = None) -> str:
    """A source distribution: pyproject.toml, this backend, README and license, the package and its tests."""
    project = read_project()
    base = f"{project['name']}-{project['version']}"
    sources = [ROOT / "pyproject.toml", Path(__file__).resolve(), *_license_files(project)]
    if project.get("readme"):
        sources.append(ROOT / project["readme"])
    for folder in ("src", "tests"):
        sources += sorted(p for p in (ROOT / folder).rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    filename = f"{base}.tar.gz"
    with tarfile.open(Path(sdist_directory) / filename, "w:gz", format=tarfile.PAX_FORMAT) as sdist:

        def add(path: str, data: bytes) -> None:
            info = tarfile.TarInfo(f"{base}/{path}")
            info.size = len(data)
            info.mode = 0o644
            sdist.addfile(info, io.BytesIO(data))

        for source in sources:
            add(source.relative_to(ROOT).as_posix(), source.read_bytes())
        add("PKG-INFO", _metadata(project))
    return filename
