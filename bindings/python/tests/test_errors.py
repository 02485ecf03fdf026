# SPDX-License-Identifier: Apache-2.0
"""Every way a call can fail: the exception class, its status, the message
naming the argument, and an output left untouched."""

from __future__ import annotations

import ctypes
from typing import Any, Callable, Dict, Type

import numpy as np
import pytest

import flashdecode
from flashdecode import Status
from flashdecode import _library
from reference import attention

SENTINEL = 7.0


def problem(rng: np.random.Generator) -> Dict[str, Any]:
    """A valid NHD problem (batch 2, 8 query heads over 2 KV heads) with a sentinel-filled output."""
    return {
        "q": rng.standard_normal((2, 1, 8, 64)).astype(np.float32),
        "k": rng.standard_normal((2, 100, 2, 64)).astype(np.float32),
        "v": rng.standard_normal((2, 100, 2, 64)).astype(np.float32),
        "out": np.full((2, 1, 8, 64), SENTINEL, np.float32),
    }


def expect_refused(
    handle: flashdecode.Handle, call: Dict[str, Any], error: Type[flashdecode.FlashDecodeError], needle: str
) -> None:
    out = call["out"]
    with pytest.raises(error, match=needle) as caught:
        handle.decode(**call)
    assert isinstance(caught.value, flashdecode.FlashDecodeError)
    assert caught.value.status == error.status and caught.value.message == str(caught.value)
    assert str(caught.value).startswith(Status(error.status).summary + ": ")
    np.testing.assert_array_equal(out, SENTINEL)


# (how to break a valid problem, expected error, text the message must contain)
LIBRARY_REJECTS: Dict[str, tuple] = {
    "dtypes differ": (
        lambda p: p.update(k=p["k"].astype(np.float16)),
        flashdecode.InvalidDTypeError,
        r"k: dtype must be f32 \(that of q\) or an 8-bit cache dtype \(e4m3, e5m2, i8\), got f16",
    ),
    "out dtype": (
        lambda p: p.update(out=np.full((2, 1, 8, 64), SENTINEL, np.int32)),
        flashdecode.InvalidDTypeError,
        "out: dtype must be f32",
    ),
    "lse dtype": (
        lambda p: p.update(lse=np.zeros((2, 1, 8), np.float16)),
        flashdecode.InvalidDTypeError,
        "lse: dtype must be f32",
    ),
    "seq_lens dtype": (
        lambda p: p.update(seq_lens=np.zeros(2, np.float32)),
        flashdecode.InvalidDTypeError,
        "seq_lens: dtype must be i32",
    ),
    "head_dim": (
        lambda p: p.update(
            q=np.zeros((2, 1, 8, 300), np.float32),
            k=np.zeros((2, 4, 2, 300), np.float32),
            v=np.zeros((2, 4, 2, 300), np.float32),
            out=np.full((2, 1, 8, 300), SENTINEL, np.float32),
        ),
        flashdecode.InvalidHeadDimError,
        r"head_dim must be in \[1, 256\], got 300",
    ),
    "heads": (
        lambda p: p.update(k=p["k"][:, :, :1].repeat(3, axis=2), v=p["v"][:, :, :1].repeat(3, axis=2)),
        flashdecode.InvalidHeadCountError,
        r"q_heads \(8\) must be a multiple of kv_heads \(3\)",
    ),
    "batch": (lambda p: p.update(k=p["k"][:1], v=p["v"][:1]), flashdecode.InvalidShapeError, "k: batch must be 2"),
    "v shape": (lambda p: p.update(v=p["v"][:, :50]), flashdecode.InvalidShapeError, "v: kv_capacity must be 100"),
    "out shape": (
        lambda p: p.update(out=np.full((2, 1, 4, 64), SENTINEL, np.float32)),
        flashdecode.InvalidShapeError,
        "out: q_heads must be 8",
    ),
    "head_dim stride": (
        lambda p: p.update(k=np.zeros((2, 100, 2, 128), np.float32)[..., ::2]),
        flashdecode.InvalidStrideError,
        "k: stride of head_dim must be 1, got 2",
    ),
    "negative stride": (
        lambda p: p.update(v=p["v"][:, ::-1]),
        flashdecode.InvalidStrideError,
        "v: stride of kv_capacity must not be negative",
    ),
    "too many splits": (
        lambda p: p.update(num_splits=2000),
        flashdecode.InvalidSplitsError,
        r"num_splits must be in \[0, 1024\]",
    ),
    "negative splits": (lambda p: p.update(num_splits=-1), flashdecode.InvalidSplitsError, "got -1"),
    "negative split_tokens": (
        lambda p: p.update(split_tokens=-16),
        flashdecode.InvalidSplitsError,
        r"split_tokens must be in \[0, 2147483647\] \(0 = not fixed\), got -16",
    ),
    "split_tokens and num_splits": (
        lambda p: p.update(split_tokens=32, num_splits=2),
        flashdecode.InvalidSplitsError,
        r"split_tokens \(32\) and num_splits \(2\) are both set",
    ),
    "scale": (
        lambda p: p.update(softmax_scale=float("inf")),
        flashdecode.InvalidArgumentError,
        "softmax_scale must be finite",
    ),
    "too many query tokens": (
        lambda p: p.update(q=np.zeros((2, 65, 8, 64), np.float32), out=np.full((2, 65, 8, 64), SENTINEL, np.float32)),
        flashdecode.InvalidShapeError,
        r"q: q_len must be in \[1, 64\], got 65",
    ),
    "out query tokens": (
        lambda p: p.update(q=np.zeros((2, 2, 8, 64), np.float32)),
        flashdecode.InvalidShapeError,
        r"out: q_len must be 2 \(from q\), got 1",
    ),
    "lse query tokens": (
        lambda p: p.update(
            q=np.zeros((2, 4, 8, 64), np.float32),
            out=np.full((2, 4, 8, 64), SENTINEL, np.float32),
            lse=np.zeros((2, 1, 8), np.float32),
        ),
        flashdecode.InvalidShapeError,
        r"lse: q_len must be 4 \(from q\), got 1",
    ),
    "alibi_slopes heads": (
        lambda p: p.update(alibi_slopes=np.zeros(4, np.float32)),
        flashdecode.InvalidShapeError,
        r"alibi_slopes: q_heads must be 8 \(from q\), got 4",
    ),
    "alibi_slopes rank": (
        lambda p: p.update(alibi_slopes=np.zeros((2, 8), np.float32)),
        flashdecode.InvalidShapeError,
        "alibi_slopes: ndim must be 1, got 2",
    ),
    "sinks dtype": (
        lambda p: p.update(sinks=np.zeros(8, np.float16)),
        flashdecode.InvalidDTypeError,
        "sinks: dtype must be f32, got f16",
    ),
    "sinks stride": (
        lambda p: p.update(sinks=np.zeros(8, np.float32)[::-1]),
        flashdecode.InvalidStrideError,
        "sinks: stride of q_heads must not be negative",
    ),
    "sinks inside out": (
        lambda p: p.update(sinks=p["out"][0, 0, :, 0]),
        flashdecode.InvalidArgumentError,
        "overlap those of input sinks",
    ),
    "q_lens batch": (
        lambda p: p.update(q_lens=np.ones(3, np.int32)),
        flashdecode.InvalidShapeError,
        r"q_lens: batch must be 2 \(from q\), got 3",
    ),
    "q_lens rank": (
        lambda p: p.update(q_lens=np.ones((2, 1), np.int32)),
        flashdecode.InvalidShapeError,
        "q_lens: ndim must be 1, got 2",
    ),
    "q_lens dtype": (
        lambda p: p.update(q_lens=np.ones(2, np.float32)),
        flashdecode.InvalidDTypeError,
        "q_lens: dtype must be i32, got f32",
    ),
}


@pytest.mark.parametrize("case", sorted(LIBRARY_REJECTS))
def test_library_rejects_with_its_message(cpu, rng, case) -> None:
    break_it, error, needle = LIBRARY_REJECTS[case]
    call = problem(rng)
    break_it(call)
    expect_refused(cpu, call, error, needle)


# Contents of seq_lens, q_lens and block_table: refused only by a handle made with
# check_contents=True; (how to break it, expected error, message, the call
# an unchecked handle computes instead: lengths and used pages clamped).
CONTENT_REJECTS: Dict[str, tuple] = {
    "length": (
        lambda p: p.update(seq_lens=np.array([100, 101], np.int32)),
        flashdecode.InvalidLengthError,
        r"seq_lens\[1\] must be in \[0, 100\]",
        lambda p: p.update(seq_lens=np.array([100, 100], np.int32)),
    ),
    "negative length": (
        lambda p: p.update(seq_lens=np.array([-5, 30], np.int32)),
        flashdecode.InvalidLengthError,
        r"seq_lens\[0\] must be in \[0, 100\]",
        lambda p: p.update(seq_lens=np.array([0, 30], np.int32)),
    ),
    "block table": (
        lambda p: p.update(
            block_table=np.array([[0, 1], [9, 2]], np.int32),
            seq_lens=np.array([20, 40], np.int32),
            k=p["k"][:1].reshape(5, 20, 2, 64),
            v=p["v"][:1].reshape(5, 20, 2, 64),
        ),
        flashdecode.InvalidBlockTableError,
        r"block_table\[1\]\[0\] must be in \[0, 5\)",
        lambda p: p.update(block_table=np.array([[0, 1], [4, 2]], np.int32)),
    ),
    "negative page": (
        lambda p: p.update(
            block_table=np.array([[0, -1], [3, 2]], np.int32),
            seq_lens=np.array([21, 40], np.int32),
            k=p["k"][:1].reshape(5, 20, 2, 64),
            v=p["v"][:1].reshape(5, 20, 2, 64),
        ),
        flashdecode.InvalidBlockTableError,
        r"block_table\[0\]\[1\] must be in \[0, 5\)",
        lambda p: p.update(block_table=np.array([[0, 0], [3, 2]], np.int32)),
    ),
    "query count": (
        lambda p: p.update(q_lens=np.array([1, 2], np.int32)),
        flashdecode.InvalidLengthError,
        r"q_lens\[1\] must be in \[0, 1\] \(q's q_len\), got 2",
        lambda p: p.update(q_lens=np.array([1, 1], np.int32)),
    ),
    "negative query count": (
        lambda p: p.update(q_lens=np.array([-3, 1], np.int32)),
        flashdecode.InvalidLengthError,
        r"q_lens\[0\] must be in \[0, 1\] \(q's q_len\), got -3",
        lambda p: p.update(q_lens=np.array([0, 1], np.int32)),
    ),
}


@pytest.mark.parametrize("case", sorted(CONTENT_REJECTS))
def test_checked_handle_rejects_bad_contents(checked, rng, case) -> None:
    break_it, error, needle, _ = CONTENT_REJECTS[case]
    call = problem(rng)
    break_it(call)
    expect_refused(checked, call, error, needle)
    checked.check_contents()  # the CPU backend reported it from decode: nothing is left


@pytest.mark.parametrize("case", sorted(CONTENT_REJECTS))
def test_unchecked_handle_clamps_bad_contents(unchecked, rng, case) -> None:
    """By default (0.3) the contents are not validated: lengths are clamped to [0, kv_capacity] and
    used page indices into the pool, giving bitwise what the clamped values give."""
    break_it, _, _, clamp = CONTENT_REJECTS[case]
    call = problem(rng)
    break_it(call)
    got = unchecked.decode(**call)
    clamp(call)
    call["out"] = np.full_like(call["out"], SENTINEL)
    expected = unchecked.decode(**call)
    np.testing.assert_array_equal(got, expected)
    assert np.all(np.isfinite(got))


def test_unchecked_handle_has_nothing_to_check(unchecked) -> None:
    with pytest.raises(flashdecode.InvalidArgumentError, match="handle: it checks nothing"):
        unchecked.check_contents()


def test_checks_from_the_environment(rng, monkeypatch) -> None:
    """FLASHDECODE_CHECKS=contents checks every handle, whatever its options say."""
    monkeypatch.setenv("FLASHDECODE_CHECKS", "contents")
    call = problem(rng)
    CONTENT_REJECTS["length"][0](call)
    with flashdecode.Handle("cpu", num_threads=2) as handle:
        expect_refused(handle, call, flashdecode.InvalidLengthError, r"seq_lens\[1\] must be in \[0, 100\]")
        handle.check_contents()
    monkeypatch.setenv("FLASHDECODE_CHECKS", "everything")
    with pytest.raises(
        flashdecode.InvalidArgumentError, match='FLASHDECODE_CHECKS=everything: unknown check "everything"'
    ):
        flashdecode.Handle("cpu")


def test_check_contents_option_is_a_bool() -> None:
    with pytest.raises(flashdecode.InvalidArgumentError, match="check_contents: expected a bool, got int"):
        flashdecode.Handle("cpu", check_contents=1)  # type: ignore[arg-type]
    with flashdecode.Handle("cpu", num_threads=1, check_contents=np.bool_(True)) as handle:
        handle.check_contents(stream=12345)  # the CPU backend ignores the stream
    handle = flashdecode.Handle("cpu", num_threads=1, check_contents=True)
    handle.close()
    with pytest.raises(flashdecode.InvalidHandleError, match="this Handle was closed"):
        handle.check_contents()


class FakeCudaArray:
    """Claims device memory at an address nobody may touch: must be refused before any call."""

    def __init__(self, shape: tuple) -> None:
        self.__cuda_array_interface__ = {"shape": shape, "typestr": "<f4", "data": (0xDEAD0000, False), "version": 3}


BINDING_REJECTS: Dict[str, tuple] = {
    "float64": (
        lambda p: p.update(q=p["q"].astype(np.float64)),
        flashdecode.InvalidDTypeError,
        "q: dtype float64 is not supported",
    ),
    "int64 lengths": (
        lambda p: p.update(seq_lens=np.array([1, 2])),
        flashdecode.InvalidDTypeError,
        "seq_lens: dtype int64 .* must be int32",
    ),
    "int64 query counts": (
        lambda p: p.update(q_lens=np.array([1, 1], np.int64)),
        flashdecode.InvalidDTypeError,
        "q_lens: dtype int64 is not supported; it must be int32",
    ),
    "query counts in device memory": (
        lambda p: p.update(q_lens=FakeCudaArray((2,))),
        flashdecode.InvalidArgumentError,
        "q_lens: is in CUDA memory, but this handle runs on the CPU",
    ),
    "16-bit without dtype": (
        lambda p: p.update(q=p["q"].astype(np.uint16)),
        flashdecode.InvalidDTypeError,
        "q: 16-bit integer storage needs dtype=",
    ),
    "explicit dtype disagrees": (
        lambda p: p.update(dtype="bfloat16"),
        flashdecode.InvalidDTypeError,
        "q: holds f32, but dtype=bf16",
    ),
    "unknown dtype": (
        lambda p: p.update(dtype="float8"),
        flashdecode.InvalidDTypeError,
        "unknown element type 'float8'",
    ),
    "byte order": (
        lambda p: p.update(k=p["k"].astype(">f4")),
        flashdecode.InvalidDTypeError,
        "k: >f4 is not in native byte order",
    ),
    "q rank": (
        lambda p: p.update(q=p["q"][0, 0]),
        flashdecode.InvalidShapeError,
        r"q: expected \[batch, q_len, heads, head_dim\]",
    ),
    "k rank": (
        lambda p: p.update(k=p["k"][0]),
        flashdecode.InvalidShapeError,
        r"k: expected \[batch, kv_len, kv_heads, head_dim\]",
    ),
    "paged k rank": (
        lambda p: p.update(k=p["k"][0], block_table=np.zeros((2, 1), np.int32)),
        flashdecode.InvalidShapeError,
        r"k: expected \[num_pages, page_size",
    ),
    "lse rank": (
        lambda p: p.update(lse=np.zeros((2, 8), np.float32)),
        flashdecode.InvalidShapeError,
        r"lse: expected \[batch, q_len, heads\]",
    ),
    "byte stride": (
        lambda p: p.update(
            k=np.lib.stride_tricks.as_strided(p["k"], strides=(p["k"].strides[0] - 2,) + p["k"].strides[1:])
        ),
        flashdecode.InvalidStrideError,
        "not a multiple of the element size 4",
    ),
    "read-only out": (
        lambda p: p["out"].setflags(write=False),
        flashdecode.InvalidArgumentError,
        "out: the array is read-only",
    ),
    "layout": (lambda p: p.update(layout="BSHD"), flashdecode.InvalidArgumentError, "layout: expected 'NHD' or 'HND'"),
    "splits type": (
        lambda p: p.update(num_splits=1.5),
        flashdecode.InvalidArgumentError,
        "num_splits: expected an int",
    ),
    "splits range": (lambda p: p.update(num_splits=2**40), flashdecode.InvalidSplitsError, "does not fit in 32 bits"),
    "split_tokens type": (
        lambda p: p.update(split_tokens=64.0),
        flashdecode.InvalidArgumentError,
        "split_tokens: expected an int, got float",
    ),
    "split_tokens bool": (
        lambda p: p.update(split_tokens=True),
        flashdecode.InvalidArgumentError,
        "split_tokens: expected an int, got bool",
    ),
    "split_tokens range": (
        lambda p: p.update(split_tokens=2**64),
        flashdecode.InvalidSplitsError,
        "does not fit in 64 bits",
    ),
    "zero scale": (lambda p: p.update(softmax_scale=0), flashdecode.InvalidArgumentError, "None selects 1/sqrt"),
    "scale type": (
        lambda p: p.update(softmax_scale="big"),
        flashdecode.InvalidArgumentError,
        "softmax_scale: expected a float",
    ),
    "device memory": (
        lambda p: p.update(k=FakeCudaArray((2, 100, 2, 64))),
        flashdecode.InvalidArgumentError,
        "k: is in CUDA memory, but this handle runs on the CPU",
    ),
    # The attention variants (0.3): None, not 0, means "none" in Python, so 0 is refused.
    "causal type": (lambda p: p.update(causal=1), flashdecode.InvalidArgumentError, "causal: expected a bool, got int"),
    "causal None": (
        lambda p: p.update(causal=None),
        flashdecode.InvalidArgumentError,
        "causal: expected a bool, got NoneType",
    ),
    "window 0": (
        lambda p: p.update(window_left=0),
        flashdecode.InvalidArgumentError,
        "window_left: must be a positive number of keys, got 0; None means no window",
    ),
    "negative window": (
        lambda p: p.update(window_left=-3),
        flashdecode.InvalidArgumentError,
        "window_left: must be a positive number of keys, got -3",
    ),
    "window type": (
        lambda p: p.update(window_left=2.5),
        flashdecode.InvalidArgumentError,
        "window_left: expected an int, got float",
    ),
    "window bool": (
        lambda p: p.update(window_left=True),
        flashdecode.InvalidArgumentError,
        "window_left: expected an int, got bool",
    ),
    "softcap 0": (
        lambda p: p.update(logit_softcap=0.0),
        flashdecode.InvalidArgumentError,
        "logit_softcap: must be finite and positive in float32, got 0; None means no cap",
    ),
    "negative softcap": (
        lambda p: p.update(logit_softcap=-2),
        flashdecode.InvalidArgumentError,
        "logit_softcap: must be finite and positive in float32, got -2",
    ),
    "softcap NaN": (
        lambda p: p.update(logit_softcap=float("nan")),
        flashdecode.InvalidArgumentError,
        "logit_softcap: must be finite and positive in float32, got nan",
    ),
    "softcap inf": (
        lambda p: p.update(logit_softcap=float("inf")),
        flashdecode.InvalidArgumentError,
        "logit_softcap: must be finite and positive in float32, got inf",
    ),
    "softcap beyond float32": (
        lambda p: p.update(logit_softcap=1e39),
        flashdecode.InvalidArgumentError,
        "logit_softcap: must be finite and positive in float32, got 1e[+]39",
    ),
    "softcap 0 in float32": (
        lambda p: p.update(logit_softcap=1e-50),
        flashdecode.InvalidArgumentError,
        "logit_softcap: must be finite and positive in float32, got 1e-50",
    ),
    "softcap type": (
        lambda p: p.update(logit_softcap="big"),
        flashdecode.InvalidArgumentError,
        "logit_softcap: expected a float, got str",
    ),
    "sinks 16-bit storage": (
        lambda p: p.update(sinks=np.zeros(8, np.uint16)),
        flashdecode.InvalidDTypeError,
        "sinks: dtype uint16 is not supported; it must be float32",
    ),
    "alibi_slopes float64": (
        lambda p: p.update(alibi_slopes=np.zeros(8)),
        flashdecode.InvalidDTypeError,
        "alibi_slopes: dtype float64 is not supported; it must be float32",
    ),
    "alibi_slopes in device memory": (
        lambda p: p.update(alibi_slopes=FakeCudaArray((8,))),
        flashdecode.InvalidArgumentError,
        "alibi_slopes: is in CUDA memory, but this handle runs on the CPU",
    ),
}


@pytest.mark.parametrize("case", sorted(BINDING_REJECTS))
def test_binding_rejects_before_calling(cpu, rng, case) -> None:
    break_it, error, needle = BINDING_REJECTS[case]
    call = problem(rng)
    break_it(call)
    expect_refused(cpu, call, error, needle)


def test_not_an_array(cpu, rng) -> None:
    call = problem(rng)
    with pytest.raises(TypeError, match="q: expected an array, got object"):
        cpu.decode(**{**call, "q": object()})
    with pytest.raises(TypeError, match="out: a list cannot be written in place"):
        cpu.decode(**{**call, "out": [0.0] * 8})


def test_workspace_errors(cpu, rng) -> None:
    call = problem(rng)
    with pytest.raises(flashdecode.InvalidArgumentError, match="nbytes: expected a byte count"):
        cpu.reserve_workspace(-1)
    with pytest.raises(flashdecode.OutOfMemoryError):
        cpu.reserve_workspace(2**62)
    misaligned = flashdecode.host_workspace(4096 + 1)[1:]
    with pytest.raises(flashdecode.InvalidArgumentError, match="not aligned to 256 bytes"):
        cpu.set_workspace(misaligned)
    with pytest.raises(flashdecode.InvalidArgumentError, match="must be contiguous"):
        cpu.set_workspace(flashdecode.host_workspace(4096)[::2])
    cpu.set_workspace(flashdecode.host_workspace(256))
    expect_refused(cpu, call, flashdecode.WorkspaceTooSmallError, "bytes needed, the caller's workspace has 256")
    # Empty, yet a workspace of its own: too small, not refused; NumPy gives empty arrays strides of 0.
    zero_strides = np.lib.stride_tricks.as_strided(flashdecode.host_workspace(256), (0,), (0,))
    for empty in (flashdecode.host_workspace(0), zero_strides):
        cpu.set_workspace(empty)
        expect_refused(cpu, call, flashdecode.WorkspaceTooSmallError, "bytes needed, the caller's workspace has 0")


def test_handle_options_rejected() -> None:
    with pytest.raises(flashdecode.InvalidArgumentError, match="backend: expected 'auto', 'cpu' or 'cuda'"):
        flashdecode.Handle("tpu")
    with pytest.raises(flashdecode.InvalidArgumentError, match="num_threads must be >= 0"):
        flashdecode.Handle("cpu", num_threads=-1)
    with pytest.raises(flashdecode.InvalidArgumentError, match="device must be >= 0"):
        flashdecode.Handle("cuda", device=-1)
    with pytest.raises(flashdecode.NoDeviceError, match="CUDA device 4096"):
        flashdecode.Handle("cuda", device=4096)


def test_cuda_handle_without_a_usable_gpu() -> None:
    """Says there is no usable GPU (or no CUDA in this build), not the CUDA runtime's
    "driver version is insufficient" alone, which is what it reports without a driver."""
    try:
        handle = flashdecode.Handle("cuda")
    except flashdecode.NoDeviceError as error:
        message = str(error)
        assert message.startswith("no device: options: CUDA device 0 ")
        assert "built without CUDA; use Handle('cpu')" in message or "no usable GPU: " in message, message
    else:
        handle.close()
        pytest.skip("a CUDA device is usable here: see test_gpu.py")


@pytest.mark.parametrize(
    "absence,library_message,expected",
    [
        (
            "no NVIDIA driver is installed (libcuda.so.1 cannot be loaded)",
            "options: CUDA device 0 is not available: no CUDA device is usable "
            "(CUDA driver version is insufficient for CUDA runtime version)",
            "options: CUDA device 0 is not available: this machine has no usable GPU: no NVIDIA driver is installed "
            "(libcuda.so.1 cannot be loaded) (the CUDA runtime says: CUDA driver version is insufficient for CUDA "
            "runtime version)",
        ),
        (  # a driver that sees GPUs: the runtime's own reason stands
            None,
            "options: CUDA device 0 is not available: no CUDA device is usable (CUDA driver version is insufficient "
            "for CUDA runtime version)",
            "options: CUDA device 0 is not available: no CUDA device is usable (CUDA driver version is insufficient "
            "for CUDA runtime version)",
        ),
        ("unused", "options: CUDA device 9 is not available: 2 CUDA device(s) found", None),
        (
            "unused",
            "options: CUDA device 0 requested, but this libflashdecode was built without CUDA",
            "options: CUDA device 0 requested, but this libflashdecode was built without CUDA; use Handle('cpu'), "
            "or a libflashdecode built with CUDA (-DFLASHDECODE_CUDA=ON)",
        ),
    ],
)
def test_no_gpu_messages(monkeypatch, absence, library_message, expected) -> None:
    from flashdecode import _handle

    monkeypatch.setattr(_handle, "_gpu_absence", lambda: absence)
    assert _handle._no_gpu_message(library_message) == (expected or library_message)


def test_layout_mistakes_say_which_layout_fits(cpu, rng) -> None:
    """The issue's trap: HND arrays with Handle.decode's default NHD, and NHD ones with flash_decode's HND."""
    q = rng.standard_normal((4, 32, 1, 64)).astype(np.float32)  # HND
    k = rng.standard_normal((4, 8, 512, 64)).astype(np.float32)
    hint_hnd = r"; these shapes fit layout='HND' \(q \[batch, heads, q_len, head_dim\], .*\): did you mean it\?$"
    with pytest.raises(
        flashdecode.InvalidHeadCountError, match=r"q_heads \(1\) must be a multiple of kv_heads \(512\)" + hint_hnd
    ):
        cpu.decode(q, k, k)
    with pytest.raises(flashdecode.InvalidHeadCountError, match=hint_hnd):  # q_lens fits either layout
        cpu.decode(q, k, k, seq_lens=np.full(4, 512, np.int32), q_lens=np.ones(4, np.int32))
    q_nhd, k_nhd = (np.ascontiguousarray(x.transpose(0, 2, 1, 3)) for x in (q, k))
    with pytest.raises(
        flashdecode.FlashDecodeError, match=r"these shapes fit layout='NHD' \(q \[batch, q_len, heads, head_dim\]"
    ):
        flashdecode.flash_decode(q_nhd, k_nhd, k_nhd)
    with pytest.raises(flashdecode.FlashDecodeError, match="these shapes fit layout='NHD'"):
        cpu.decode(q_nhd, k_nhd, k_nhd, layout="HND")
    # Shapes that fit neither layout: the error alone.
    with pytest.raises(flashdecode.InvalidHeadCountError) as caught:
        cpu.decode(q, k[:, :3], k[:, :3])
    assert "did you mean" not in str(caught.value)
    with pytest.raises(flashdecode.InvalidShapeError) as caught:
        cpu.decode(q_nhd, k_nhd[..., :32], k_nhd[..., :32])
    assert "did you mean" not in str(caught.value) and str(caught.value).startswith("invalid shape: ")
    # The right layout still works, and the hint did not disturb the handle.
    expected, _ = attention(q[:, :, 0], k_nhd, k_nhd)
    np.testing.assert_allclose(cpu.decode(q, k, k, layout="HND")[:, :, 0], expected, atol=2e-5)


def test_flash_decode_scale_names(rng) -> None:
    """softmax_scale as in Handle.decode; sm_scale, the reference kernel's name, as an alias; positional as before."""
    q = rng.standard_normal((2, 4, 1, 32)).astype(np.float32)
    k = rng.standard_normal((2, 2, 30, 32)).astype(np.float32)
    expected, _ = attention(q[:, :, 0], k.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), scale=0.3)
    for result in (
        flashdecode.flash_decode(q, k, k, softmax_scale=0.3),
        flashdecode.flash_decode(q, k, k, sm_scale=0.3),
        flashdecode.flash_decode(q, k, k, 0.3),
        flashdecode.flash_decode(
            q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), 0.3, layout="NHD"
        ).transpose(0, 2, 1, 3),
    ):
        np.testing.assert_allclose(result[:, :, 0], expected, atol=2e-5)
    with pytest.raises(flashdecode.InvalidArgumentError, match="sm_scale: is softmax_scale's other name"):
        flashdecode.flash_decode(q, k, k, softmax_scale=0.3, sm_scale=0.3)


def test_flash_decode_splitk_is_the_reference_kernels_entry_point(rng) -> None:
    """flash_decode_splitk: the reference kernel's name and signature (block_n accepted, not used), and
    inputs of any layout, copied row-major as the reference kernel's .contiguous() did; flash_decode
    takes block_n as its sixth argument too, and keeps refusing a head_dim that is not contiguous."""
    q = rng.standard_normal((2, 4, 1, 32)).astype(np.float32)
    k = rng.standard_normal((2, 2, 30, 32)).astype(np.float32)
    expected, _ = attention(q[:, :, 0], k.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), scale=0.3)
    k_transposed = np.ascontiguousarray(k.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)  # head_dim not contiguous
    q_sliced = np.repeat(q, 2, axis=3)[..., ::2]
    assert q_sliced.strides[3] != q_sliced.itemsize and np.array_equal(q_sliced, q)
    for result in (
        flashdecode.flash_decode_splitk(q, k, k, 0.3, 4, 64),
        flashdecode.flash_decode_splitk(q, k, k, sm_scale=0.3, num_splits=None, block_n=32),
        flashdecode.flash_decode_splitk(q_sliced, k_transposed, k_transposed, 0.3),
        flashdecode.flash_decode(q, k, k, 0.3, 4, 64),
        flashdecode.flash_decode(q, k, k, 0.3, block_n=16),
    ):
        assert result.shape == q.shape and result.dtype == q.dtype
        np.testing.assert_allclose(result[:, :, 0], expected, atol=2e-5)
    for block_n in (0, -64, 64.0, True):
        with pytest.raises(flashdecode.InvalidArgumentError, match="block_n: must be a positive int"):
            flashdecode.flash_decode_splitk(q, k, k, block_n=block_n)
    with pytest.raises(flashdecode.InvalidStrideError, match="k: stride of head_dim must be 1"):
        flashdecode.flash_decode(q, k_transposed, k_transposed)


def test_out_of_range_splits_and_lse_dtypes(rng) -> None:
    """A num_splits or split_tokens beyond its C type is a splits error, as the library's own range check
    is; an lse of another float type is told it must be float32."""
    with flashdecode.Handle("cpu") as handle:
        expect_refused(handle, {**problem(rng), "num_splits": 2**40}, flashdecode.InvalidSplitsError,
                       "num_splits: 1099511627776 does not fit in 32 bits")  # fmt: skip
        expect_refused(handle, {**problem(rng), "split_tokens": 2**70}, flashdecode.InvalidSplitsError,
                       "split_tokens: .* does not fit in 64 bits")  # fmt: skip
        expect_refused(handle, {**problem(rng), "lse": np.zeros((2, 1, 8), np.float64)},
                       flashdecode.InvalidDTypeError, "lse: dtype float64 is not supported; it must be float32")  # fmt: skip


def test_closed_handle(rng) -> None:
    handle = flashdecode.Handle("cpu")
    handle.close()
    for use in (
        lambda: handle.decode(**problem(rng)),
        lambda: handle.reserve_workspace(0),
        lambda: handle.set_workspace(None),
    ):
        with pytest.raises(flashdecode.InvalidHandleError, match="this Handle was closed"):
            use()


def test_raw_library_errors_carry_its_message() -> None:
    """Statuses the high-level API cannot provoke, through the declared C functions."""
    lib = _library.library()
    with pytest.raises(flashdecode.NullPointerError, match="handle: the output pointer is NULL"):
        _library.check(lib.fd_create(None, None))
    pointer = ctypes.c_void_p()
    _library.check(lib.fd_create(ctypes.byref(pointer), None))
    with pytest.raises(flashdecode.NullPointerError, match="args is NULL"):
        _library.check(lib.fd_decode(pointer, None, None))
    _library.check(lib.fd_destroy(pointer))
    with pytest.raises(flashdecode.InvalidHandleError, match="not a live handle"):
        _library.check(lib.fd_destroy(pointer))


def test_status_summaries_match_the_library() -> None:
    lib = _library.library()
    for status in Status:
        assert lib.fd_status_string(int(status)).decode() == status.summary


@pytest.mark.parametrize("status", [s for s in Status if s is not Status.SUCCESS])
def test_every_status_has_its_class(status: Status) -> None:
    error = flashdecode._errors.error_from_status(int(status), f"{status.summary}: detail")
    assert type(error) is not flashdecode.FlashDecodeError and error.status is status
    assert isinstance(error, flashdecode.FlashDecodeError) and str(error) == f"{status.summary}: detail"
    assert getattr(flashdecode, type(error).__name__) is type(error)


def test_unknown_status_still_raises() -> None:
    error = flashdecode._errors.error_from_status(99, "")
    assert type(error) is flashdecode.FlashDecodeError and error.status == 99 and "99" in str(error)


def test_builtin_bases_for_callers_of_the_seed() -> None:
    checks: Dict[type, Callable[[type], bool]] = {
        flashdecode.InvalidShapeError: lambda c: issubclass(c, ValueError),
        flashdecode.InvalidDTypeError: lambda c: issubclass(c, TypeError),
        flashdecode.OutOfMemoryError: lambda c: issubclass(c, MemoryError),
        flashdecode.UnsupportedError: lambda c: issubclass(c, NotImplementedError),
        flashdecode.CudaError: lambda c: issubclass(c, RuntimeError),
        flashdecode.LibraryError: lambda c: issubclass(c, ImportError),
    }
    for error_class, check in checks.items():
        assert check(error_class), error_class
