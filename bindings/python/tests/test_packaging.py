# SPDX-License-Identifier: Apache-2.0
"""The in-tree build backend: metadata, wheel contents, sdist and editable installs.

(The CTest suite also builds a wheel with pip, installs it into a venv and
runs the README quickstart from it.)"""

from __future__ import annotations

import base64
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


@pytest.fixture(scope="module")
def backend() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "flashdecode_build", BINDING_ROOT / "build_backend" / "flashdecode_build.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_project_table_without_tomllib(backend, monkeypatch) -> None:
    parsed = backend.read_project()
    monkeypatch.setitem(sys.modules, "tomllib", None)  # as on Python < 3.11
    assert backend.read_project() == parsed
    assert parsed["name"] == "flashdecode" and parsed["version"] == flashdecode.__version__
    assert parsed["dependencies"] == ["numpy>=1.21"]


def wheel_entries(path: Path) -> dict:
    with zipfile.ZipFile(path) as wheel:
        entries = {info.filename: (wheel.read(info), info.external_attr >> 16) for info in wheel.infolist()}
    record = entries[f"flashdecode-{flashdecode.__version__}.dist-info/RECORD"][0].decode().splitlines()
    for line in record:
        name, digest, size = line.rsplit(",", 2)
        if name.endswith("RECORD"):
            continue
        data = entries[name][0]
        expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        assert digest == f"sha256={expected}" and int(size) == len(data), name
    assert len(record) == len(entries)
    return entries


def test_pure_wheel(backend, tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("FLASHDECODE_BUNDLE_LIBRARY", raising=False)
    name = backend.build_wheel(str(tmp_path))
    assert name == f"flashdecode-{flashdecode.__version__}-py3-none-any.whl"
    entries = wheel_entries(tmp_path / name)
    assert "flashdecode/__init__.py" in entries and "flashdecode/py.typed" in entries
    assert not any(entry.startswith("flashdecode/_lib/") or "__pycache__" in entry for entry in entries)
    wheel_info = entries[f"flashdecode-{flashdecode.__version__}.dist-info/WHEEL"][0].decode()
    assert "Root-Is-Purelib: true" in wheel_info and "Tag: py3-none-any" in wheel_info
    metadata = entries[f"flashdecode-{flashdecode.__version__}.dist-info/METADATA"][0].decode()
    assert "Requires-Dist: numpy>=1.21" in metadata and 'Requires-Dist: ml_dtypes; extra == "bf16"' in metadata


def test_wheel_bundling_the_library(backend, tmp_path) -> None:
    library = os.environ.get("FLASHDECODE_LIBRARY")
    if not library:
        pytest.skip("FLASHDECODE_LIBRARY names no library to bundle")
    name = backend.build_wheel(str(tmp_path), {"bundle-library": library})
    assert name.startswith(f"flashdecode-{flashdecode.__version__}-py3-none-linux_")
    entries = wheel_entries(tmp_path / name)
    data, mode = entries["flashdecode/_lib/libflashdecode.so.0"]
    assert data == Path(library).read_bytes() and mode & 0o777 == 0o755
    assert "Root-Is-Purelib: false" in entries[f"flashdecode-{flashdecode.__version__}.dist-info/WHEEL"][0].decode()
    with pytest.raises(FileNotFoundError, match="bundle-library"):
        backend.build_wheel(str(tmp_path), {"bundle-library": str(tmp_path / "missing.so")})
    # A relative path is read from the backend's working folder, which pip chooses: the message says so.
    with pytest.raises(FileNotFoundError, match="relative path, read from"):
        backend.build_wheel(str(tmp_path), {"bundle-library": "build/stage/lib/missing.so"})


def test_sdist_and_editable(backend, tmp_path) -> None:
    sdist = backend.build_sdist(str(tmp_path))
    with tarfile.open(tmp_path / sdist) as archive:
        names = set(archive.getnames())
    base = f"flashdecode-{flashdecode.__version__}"
    for member in (
        "pyproject.toml",
        "PKG-INFO",
        "build_backend/flashdecode_build.py",
        "src/flashdecode/_library.py",
        "tests/conftest.py",
    ):
        assert f"{base}/{member}" in names
    editable = wheel_entries(tmp_path / backend.build_editable(str(tmp_path)))
    assert editable["_flashdecode_editable.pth"][0].decode().strip() == (BINDING_ROOT / "src").as_posix()
    assert backend.get_requires_for_build_wheel() == []
