# SPDX-License-Identifier: Apache-2.0
"""The array protocols the CUDA path relies on, exercised without a GPU:
DLPack capsules (NumPy exports them from host memory), the CUDA Array
Interface (described, never dereferenced), and stream objects."""

from __future__ import annotations

import ctypes
from typing import Any, Optional

import numpy as np
import pytest

import flashdecode
from flashdecode import _arrays
from flashdecode._arrays import CUDA, HOST, DType
from reference import attention, from_bf16_bits, to_bf16_bits


class DLPackOnly:
    """Exposes a NumPy array through DLPack alone, as a foreign library would
    (DLPack 1.0 capsules when NumPy makes them, 2.1 and later)."""

    def __init__(self, array: np.ndarray) -> None:
        self._array = array

    def __dlpack__(self, stream: Any = None, **kwargs: Any) -> Any:
        return self._array.__dlpack__(stream=stream, **kwargs)

    def __dlpack_device__(self) -> Any:
        return self._array.__dlpack_device__()


class DLPackUnversioned(DLPackOnly):
    """A producer from before DLPack 1.0: no max_version, no flags."""

    def __dlpack__(self, stream: Any = None) -> Any:  # type: ignore[override]
        return self._array.__dlpack__(stream=stream)


class CudaArrayInterface:
    """Describes device memory at a made-up address: only ever parsed."""

    def __init__(
        self, shape: tuple, typestr: str, strides: Optional[tuple] = None, stream: Optional[int] = None, dtype: str = ""
    ) -> None:
        self.__cuda_array_interface__ = {
            "shape": shape,
            "typestr": typestr,
            "data": (0x7F0000000000, False),
            "strides": strides,
            "version": 3,
            "stream": stream,
        }
        self.dtype = dtype


def test_dlpack_host_arrays_decode(cpu, rng) -> None:
    q = rng.standard_normal((2, 4, 1, 32)).astype(np.float32)
    k = rng.standard_normal((2, 2, 50, 32)).astype(np.float32)
    v = rng.standard_normal((2, 2, 50, 32)).astype(np.float32)
    out = np.empty_like(q)
    cpu.decode(DLPackOnly(q), DLPackOnly(k[:, :, 10:]), DLPackOnly(v[:, :, 10:]), out=out, layout="HND")
    expected, _ = attention(q[:, :, 0], k[:, :, 10:].transpose(0, 2, 1, 3), v[:, :, 10:].transpose(0, 2, 1, 3))
    np.testing.assert_allclose(out[:, :, 0], expected, atol=2e-5)
    with pytest.raises(TypeError, match="out: cannot allocate it like a DLPackOnly; pass out= explicitly"):
        cpu.decode(DLPackOnly(q), DLPackOnly(k), DLPackOnly(v), layout="HND")


def test_dlpack_read_only_outputs_are_refused(cpu, rng) -> None:
    q = rng.standard_normal((1, 2, 1, 16)).astype(np.float32)
    k = rng.standard_normal((1, 2, 20, 16)).astype(np.float32)
    out = np.zeros_like(q)
    cpu.decode(DLPackOnly(q), DLPackOnly(k), DLPackOnly(k), out=DLPackOnly(out), layout="HND")
    old = DLPackUnversioned
    cpu.decode(old(q), old(k), old(k), out=old(out), layout="HND")
    assert np.abs(out).sum() > 0
    frozen = np.zeros_like(q)
    frozen.flags.writeable = False
    try:
        capsule = frozen.__dlpack__(max_version=(1, 0))
    except (TypeError, BufferError):
        pytest.skip("this NumPy exports no DLPack 1.0 capsule of a read-only array")
    del capsule
    with pytest.raises(flashdecode.InvalidArgumentError, match="out: the array is read-only"):
        cpu.decode(DLPackOnly(q), DLPackOnly(k), DLPackOnly(k), out=DLPackOnly(frozen), layout="HND")
    assert not frozen.any()


def test_dlpack_view_of_bfloat16_bits(cpu, rng) -> None:
    values = rng.standard_normal((1, 1, 2, 16)).astype(np.float32)
    view = _arrays.view_array(DLPackOnly(to_bf16_bits(values)), "q", kind="float")
    assert view.dtype is None and view.itemsize == 2 and view.location == HOST
    q = to_bf16_bits(values)
    k = to_bf16_bits(rng.standard_normal((1, 8, 1, 16)).astype(np.float32))
    out = np.zeros_like(q)
    cpu.decode(DLPackOnly(q), DLPackOnly(k), DLPackOnly(k), out=out, dtype="bf16")
    expected, _ = attention(from_bf16_bits(q)[:, 0], from_bf16_bits(k), from_bf16_bits(k))
    np.testing.assert_allclose(from_bf16_bits(out)[:, 0], expected, atol=1.6e-2)


def test_dlpack_strides_and_offsets_match_numpy(rng) -> None:
    base = rng.standard_normal((3, 40, 5, 24)).astype(np.float16)
    sliced = base[1:, 5:30:2, 1:4, 8:]
    view = _arrays.view_array(DLPackOnly(sliced), "k", kind="float")
    assert view.pointer == sliced.__array_interface__["data"][0]
    assert view.shape == sliced.shape and view.strides == tuple(s // 2 for s in sliced.strides)
    assert view.dtype is DType.F16 and view.capsule is not None


def test_cuda_array_interface_is_parsed_not_touched() -> None:
    view = _arrays.view_array(CudaArrayInterface((2, 8, 3, 64), "<f2", strides=(4096, 256, 128, 2)), "k", kind="float")
    assert view.location == CUDA and view.pointer == 0x7F0000000000
    assert view.dtype is DType.F16 and view.strides == (2048, 128, 64, 1)
    contiguous = _arrays.view_array(CudaArrayInterface((2, 3), "<i4"), "seq_lens", kind="int32")
    assert contiguous.strides == (3, 1) and contiguous.dtype is DType.I32
    # Producers without a bfloat16 typestr describe it as "<f2"; the array's own dtype tells.
    labelled = _arrays.view_array(CudaArrayInterface((4,), "<f2", dtype="torch.bfloat16"), "q", kind="float")
    assert labelled.dtype is DType.BF16
    with pytest.raises(flashdecode.InvalidDTypeError, match="q: dtype float64 is not supported"):
        _arrays.view_array(CudaArrayInterface((4,), "<f8"), "q", kind="float")
    with pytest.raises(flashdecode.InvalidStrideError, match="byte stride 3"):
        _arrays.view_array(CudaArrayInterface((4, 2), "<f2", strides=(3, 2)), "q", kind="float")


def test_empty_arrays_without_an_address_get_a_placeholder() -> None:
    # PyTorch and CuPy give empty arrays the address 0; the library refuses
    # NULL even where it reads nothing, so an aligned placeholder stands in.
    from flashdecode._describe import _fill
    from flashdecode._library import FdTensor

    def described(shape: tuple) -> FdTensor:
        view = _arrays.ArrayView(
            pointer=0, dtype=DType.F32, itemsize=4, shape=shape, strides=(128, 128, 32, 1), location=CUDA,
            device=0, readonly=False, array=None, capsule=None,
        )
        tensor = FdTensor()
        _fill(tensor, view, (shape, view.strides))
        return tensor

    empty = described((0, 1, 4, 32))
    assert empty.data and empty.data % 8 == 0 and empty.shape[0] == 0
    assert not described((2, 1, 4, 32)).data  # a real array at 0 stays NULL, for the library to refuse


def test_locations_and_default_streams() -> None:
    assert _arrays.locate(np.zeros(3)) == (HOST, None)
    assert _arrays.locate(DLPackOnly(np.zeros(3))) == (HOST, None)
    assert _arrays.locate(CudaArrayInterface((3,), "<f4")) == (CUDA, None)
    assert _arrays.default_stream(CudaArrayInterface((3,), "<f4", stream=1)) == 0  # legacy default is NULL
    assert _arrays.default_stream(CudaArrayInterface((3,), "<f4", stream=2)) == 2  # per-thread default as is
    assert _arrays.default_stream(CudaArrayInterface((3,), "<f4", stream=0xABC0)) == 0xABC0
    assert _arrays.default_stream(CudaArrayInterface((3,), "<f4")) == 0


class _TorchLikeStream:
    cuda_stream = 0x1230


class _CupyLikeStream:
    ptr = 0x4560


class _NumbaLikeStream:
    handle = ctypes.c_void_p(0x7890)


class _ProtocolStream:
    def __cuda_stream__(self) -> tuple:
        return (0, 0xABC0)


@pytest.mark.parametrize(
    "stream,expected",
    [
        (0x10, 0x10),
        (_TorchLikeStream(), 0x1230),
        (_CupyLikeStream(), 0x4560),
        (_NumbaLikeStream(), 0x7890),
        (_ProtocolStream(), 0xABC0),
    ],
)
def test_stream_objects(stream: Any, expected: int) -> None:
    assert _arrays.stream_pointer(stream) == expected


def test_stream_rejects_other_objects() -> None:
    with pytest.raises(TypeError, match="stream: expected an int"):
        _arrays.stream_pointer("default")
    with pytest.raises(TypeError, match="got a bool"):
        _arrays.stream_pointer(True)


def test_dtype_names() -> None:
    assert _arrays.as_dtype("bf16") is DType.BF16 and _arrays.as_dtype("BFloat16") is DType.BF16
    assert _arrays.as_dtype(np.float16) is DType.F16 and _arrays.as_dtype(np.dtype("float32")) is DType.F32
    assert _arrays.as_dtype("torch.bfloat16") is DType.BF16 and _arrays.as_dtype(DType.I32) is DType.I32
