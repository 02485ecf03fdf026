# SPDX-License-Identifier: Apache-2.0
"""Shared fixtures. The library comes from $FLASHDECODE_LIBRARY when set (the
CTest suite points it at the staged install), else as the package finds it."""

from __future__ import annotations

from typing import Iterator

import numpy as np
import pytest

import flashdecode


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA device and PyTorch or CuPy (skipped without them)")


@pytest.fixture
def cpu() -> Iterator[flashdecode.Handle]:
    """A CPU-backend handle with two workers (the CI machine has two cores)."""
    with flashdecode.Handle("cpu", num_threads=2) as handle:
        yield handle


@pytest.fixture
def checked() -> Iterator[flashdecode.Handle]:
    """A CPU-backend handle that checks seq_lens and block_table contents (check_contents=True)."""
    with flashdecode.Handle("cpu", num_threads=2, check_contents=True) as handle:
        yield handle


@pytest.fixture
def unchecked(monkeypatch: pytest.MonkeyPatch) -> Iterator[flashdecode.Handle]:
    """A CPU-backend handle that checks no contents, whatever FLASHDECODE_CHECKS says outside the test."""
    monkeypatch.delenv("FLASHDECODE_CHECKS", raising=False)
    with flashdecode.Handle("cpu", num_threads=2) as handle:
        yield handle


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20240611)
