# SPDX-License-Identifier: Apache-2.0
"""A library older than this binding's header: a real 0.2.0 build, named by
$FLASHDECODE_OLD_LIBRARY (the CTest test python_old_library builds it from
the git history with bindings/tools/old_library.sh). It is loaded and used
as it is; the 0.3 features raise UnsupportedError naming the version they
need. Each case runs in a fresh interpreter, which loads that library."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import flashdecode

OLD_LIBRARY = os.environ.get("FLASHDECODE_OLD_LIBRARY")
pytestmark = pytest.mark.skipif(not OLD_LIBRARY, reason="FLASHDECODE_OLD_LIBRARY names no 0.2 library")
PACKAGE_ROOT = Path(flashdecode.__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent

PRELUDE = """
import numpy as np
import pytest
import flashdecode
from reference import attention

rng = np.random.default_rng(3)
q = rng.standard_normal((2, 1, 8, 64)).astype(np.float32)
k = rng.standard_normal((2, 100, 2, 64)).astype(np.float32)
v = rng.standard_normal((2, 100, 2, 64)).astype(np.float32)
lens = np.array([100, 37], np.int32)
"""


def run_with_old_library(code: str) -> str:
    assert OLD_LIBRARY is not None
    env = {name: value for name, value in os.environ.items() if name not in ("LD_LIBRARY_PATH", "FLASHDECODE_CHECKS")}
    env["FLASHDECODE_LIBRARY"] = OLD_LIBRARY
    env["PYTHONPATH"] = os.pathsep.join((str(PACKAGE_ROOT), str(TESTS)))
    result = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_it_loads_and_decodes() -> None:
    code = """
        info = flashdecode.load_library()
        assert info.version.startswith("0.2.") and info.minor == 2, info
        with flashdecode.Handle("cpu", num_threads=2) as handle:
            out, lse = handle.decode(q, k, v, seq_lens=lens, return_lse=True, split_tokens=0)
            expected, expected_lse = attention(q[:, 0], k, v, seq_lens=lens)
            np.testing.assert_allclose(out[:, 0], expected, atol=2e-5, rtol=2e-5)
            np.testing.assert_allclose(lse[:, 0], expected_lse, atol=1e-4)
            again = handle.decode(q, k, v, seq_lens=lens)  # the fast path
            np.testing.assert_allclose(again[:, 0], expected, atol=2e-5, rtol=2e-5)
            info = handle.describe_plan(q, k, v, num_splits=3)
            assert info.num_splits == 3 and info.workspace_bytes == handle.workspace_size(q, k, v, num_splits=3)
            # The size queries describe a stand-in output apart from a broadcast q: 0.2 accepts it too.
            wide = np.broadcast_to(q[:1], q.shape)
            assert handle.workspace_size(wide, k, v) == handle.workspace_size(q, k, v)
        np.testing.assert_allclose(flashdecode.flash_decode(q, k, v, layout="NHD")[:, 0],
                                   attention(q[:, 0], k, v)[0], atol=2e-5, rtol=2e-5)
        print(info.kernel)
        """
    assert run_with_old_library(code).strip() == "cpu"


def test_new_features_name_the_version_they_need() -> None:
    code = """
        needs = r"needs libflashdecode 0\\.3 or later \\({}\\); .* is version 0\\.2\\.0"
        with pytest.raises(flashdecode.UnsupportedError, match="check_contents=True " + needs.format("fd_options.checks")):
            flashdecode.Handle("cpu", check_contents=True)
        with flashdecode.Handle("cpu", num_threads=2) as handle:
            with pytest.raises(flashdecode.UnsupportedError, match=needs.format("fd_check_contents")):
                handle.check_contents()
            for split_tokens in (64, -1):
                with pytest.raises(
                    flashdecode.UnsupportedError, match="split_tokens " + needs.format("fd_decode_args.split_tokens")
                ):
                    handle.decode(q, k, v, split_tokens=split_tokens)
                with pytest.raises(flashdecode.UnsupportedError, match="split_tokens"):
                    handle.describe_plan(q, k, v, split_tokens=split_tokens)
            with pytest.raises(flashdecode.UnsupportedError, match="split_tokens"):
                flashdecode.flash_decode(q, k, v, layout="NHD", split_tokens=64)
            # The attention variants, by the name the caller used and the field that carries it.
            variants = [
                ({"causal": False}, "causal=False", "fd_decode_args.mask"),
                ({"window_left": 16}, "window_left", "fd_decode_args.window_left"),
                ({"logit_softcap": 30.0}, "logit_softcap", "fd_decode_args.logit_softcap"),
                ({"alibi_slopes": np.ones(8, np.float32)}, "alibi_slopes", "fd_decode_args.alibi_slopes"),
                ({"sinks": [0.0] * 8}, "sinks", "fd_decode_args.sinks"),
                ({"q_lens": np.ones(2, np.int32)}, "q_lens", "fd_decode_args.q_lens"),
            ]
            for options, what, field in variants:
                with pytest.raises(flashdecode.UnsupportedError, match=what + " " + needs.format(field)):
                    handle.decode(q, k, v, **options)
                with pytest.raises(flashdecode.UnsupportedError, match=what):
                    handle.workspace_size(q, k, v, **options)
                with pytest.raises(flashdecode.UnsupportedError, match=what):
                    flashdecode.flash_decode(q, k, v, layout="NHD", **options)
            # The defaults ask nothing of it; several query tokens are 0.2's own refusal.
            handle.decode(
                q, k, v, causal=True, window_left=None, logit_softcap=None, alibi_slopes=None, sinks=None, q_lens=None
            )
            q4 = np.repeat(q, 4, axis=1)
            with pytest.raises(flashdecode.UnsupportedError, match="q_len must be 1"):
                handle.decode(q4, k, v)
            out, lse = handle.decode(q, k, v, return_lse=True)
            merge = "merge_states " + needs.format("fd_merge_states")
            with pytest.raises(flashdecode.UnsupportedError, match=merge):
                handle.merge_states([out, out], [lse, lse])
            with pytest.raises(flashdecode.UnsupportedError, match=merge):  # before any argument is read
                handle.merge_states([], [], out=out, return_lse=True)
            with pytest.raises(flashdecode.UnsupportedError, match=merge):
                flashdecode.merge_states([out], [lse])
            handle.decode(q, k, v)  # the handle still works
        """
    run_with_old_library(code)


def test_quantized_caches_name_the_version_they_need() -> None:
    # 8-bit caches, their scales and fd_append_kv are 0.3's: refused by name before the library sees them.
    code = """
        needs = r"needs libflashdecode 0\\.3 or later \\({}\\); .* is version 0\\.2\\.0"
        cache = np.zeros((2, 100, 2, 64), np.int8)
        bits = cache.view(np.uint8)
        with flashdecode.Handle("cpu", num_threads=2) as handle:
            with pytest.raises(flashdecode.UnsupportedError, match="an i8 cache " + needs.format("fd_dtype.i8")):
                handle.decode(q, cache, cache)
            with pytest.raises(flashdecode.UnsupportedError, match=needs.format("fd_dtype.e5m2")):
                handle.workspace_size(q, bits, bits, dtype="float8_e5m2")
            with pytest.raises(flashdecode.UnsupportedError, match="k_scale " + needs.format("fd_decode_args.k_scale")):
                handle.decode(q, k, v, k_scale=0.5)
            with pytest.raises(flashdecode.UnsupportedError, match="v_scale " + needs.format("fd_decode_args.v_scale")):
                flashdecode.flash_decode(q, k, v, layout="NHD", v_scale=np.ones(2, np.float32))
            with pytest.raises(flashdecode.UnsupportedError, match="append_kv " + needs.format("fd_append_kv")):
                handle.append_kv(q[:, :, :2], q[:, :, :2], k, v)
            with pytest.raises(flashdecode.UnsupportedError, match="append_kv"):
                flashdecode.append_kv(q[:, :, :2], q[:, :, :2], k, v)
            handle.decode(q, k, v, k_scale=None, v_scale=None)  # absent scales ask nothing of it
        """
    run_with_old_library(code)


def test_it_validates_contents_as_0_2_did() -> None:
    # 0.2's CPU backend checks seq_lens and block_table on every decode; 0.3 clamps unless asked to check.
    code = """
        with flashdecode.Handle("cpu", num_threads=2) as handle:
            with pytest.raises(flashdecode.InvalidLengthError, match=r"seq_lens\\[1\\] must be in \\[0, 100\\]"):
                handle.decode(q, k, v, seq_lens=np.array([100, 101], np.int32))
        """
    run_with_old_library(code)
