# SPDX-License-Identifier: Apache-2.0
"""Checks a flashdecode installed by pip, as a user would meet it.

    python_installed.py <venv> <README.md to run the quickstart of> [--built-without-cuda]

Run with the venv's interpreter, outside the source tree, with no library
path set: the library loaded must be the copy inside the package; the
distribution's metadata must be complete (license per PEP 639, project URL,
README as the description); a small GQA decode, ragged with the log-sum-exp,
must match a float64 reference; the README's first ``python`` block must
run. With --built-without-cuda, CUDA handles must be refused as the CPU-only
library refuses them.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import math
import re
from pathlib import Path

import numpy as np

import flashdecode


def check_metadata() -> None:
    distribution = importlib.metadata.distribution("flashdecode")
    metadata = distribution.metadata
    assert metadata["Version"] == flashdecode.__version__, metadata["Version"]
    assert metadata["Metadata-Version"] == "2.4", metadata["Metadata-Version"]
    assert metadata["License-Expression"] == "Apache-2.0", metadata["License-Expression"]
    license_files = metadata.get_all("License-File") or []
    assert license_files == ["LICENSE"], license_files
    license_text = distribution.read_text("licenses/LICENSE") or ""
    assert "Apache License" in license_text and "Version 2.0" in license_text, "no license text in .dist-info/licenses"
    urls = metadata.get_all("Project-URL") or []
    assert any(url.startswith("Repository, https://") for url in urls), urls
    assert metadata["Requires-Python"] and metadata.get_all("Classifier"), "no Requires-Python or classifiers"
    assert metadata["Description-Content-Type"].startswith("text/markdown"), metadata["Description-Content-Type"]
    assert "flash_decode" in (metadata.get_payload() or ""), "the README is not the long description"


def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, lengths: np.ndarray):
    """out [B, H, D] and lse [B, H] in float64; q [B, H, D], k/v [B, Hkv, N, D]."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    out = np.zeros(q.shape)
    lse = np.zeros(q.shape[:2])
    for b, length in enumerate(lengths):
        keys = np.repeat(k[b, :, :length], group, axis=0)  # [H, length, D]
        values = np.repeat(v[b, :, :length], group, axis=0)
        scores = np.einsum("hd,hnd->hn", q[b], keys) / math.sqrt(q.shape[2])
        peak = scores.max(axis=1, keepdims=True)
        weights = np.exp(scores - peak)
        total = weights.sum(axis=1, keepdims=True)
        out[b] = np.einsum("hn,hnd->hd", weights / total, values)
        lse[b] = (peak + np.log(total))[:, 0]
    return out, lse


def check_decode() -> None:
    rng = np.random.default_rng(7)
    batch, heads, kv_heads, kv_len, dim = 3, 8, 2, 300, 64
    q = rng.standard_normal((batch, heads, 1, dim), dtype=np.float32)
    k = rng.standard_normal((batch, kv_heads, kv_len, dim), dtype=np.float32)
    v = rng.standard_normal((batch, kv_heads, kv_len, dim), dtype=np.float32)
    full = np.full(batch, kv_len, np.int32)
    expected, _ = reference(q[:, :, 0], k, v, full)
    error = np.abs(flashdecode.flash_decode(q, k, v)[:, :, 0] - expected).max()
    assert error < 1e-5, f"flash_decode: max error {error} against float64"
    lengths = np.array([300, 17, 1], np.int32)
    expected, expected_lse = reference(q[:, :, 0], k, v, lengths)
    with flashdecode.Handle("cpu", num_threads=2) as handle:
        out, lse = handle.decode(q, k, v, layout="HND", seq_lens=lengths, return_lse=True)
    error = max(np.abs(out[:, :, 0] - expected).max(), np.abs(np.reshape(lse, expected_lse.shape) - expected_lse).max())
    assert error < 1e-5, f"Handle.decode, ragged: max error {error} against float64"


def run_quickstart(readme: Path) -> None:
    block = re.search(r"^```python\n(.*?)^```$", readme.read_text(encoding="utf-8"), re.MULTILINE | re.DOTALL)
    assert block, f"{readme}: no python block"
    exec(compile(block.group(1), f"{readme} (quickstart)", "exec"), {"__name__": "__quickstart__"})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("venv", type=Path)
    parser.add_argument("readme", type=Path)
    parser.add_argument("--built-without-cuda", action="store_true")
    args = parser.parse_args()

    info = flashdecode.load_library()
    print(f"loaded {info.path} ({info.source}), version {info.version}")
    venv = args.venv.resolve()
    assert info.source == "bundled" and venv in Path(info.path).resolve().parents, info
    check_metadata()
    check_decode()
    run_quickstart(args.readme)
    if args.built_without_cuda:
        try:
            flashdecode.Handle("cuda")
        except flashdecode.NoDeviceError as error:
            assert "built without CUDA" in str(error), error
        else:
            raise AssertionError("a CUDA handle from a library built with FLASHDECODE_CUDA=OFF")
    print("the installed package: bundled library, metadata, decode against float64 and the README quickstart: ok")


if __name__ == "__main__":
    main()
