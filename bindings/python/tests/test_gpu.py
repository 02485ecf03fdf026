# SPDX-License-Identifier: Apache-2.0
"""The CUDA backend through PyTorch and CuPy arrays.

Skipped where PyTorch (or CuPy) or a CUDA device is missing; run on a GPU
machine with both installed to exercise them all."""

from __future__ import annotations

import math
from typing import Any, Dict, Tuple

import numpy as np
import pytest

import flashdecode
from reference import alibi_slopes, attention, to_pages, variant_attention

pytestmark = pytest.mark.gpu

# The GPU accumulates in float32 in another order than the reference.
TOLERANCE = {"float32": 1e-4, "float16": 4e-3, "bfloat16": 2e-2}


def cuda_torch() -> Any:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no CUDA device")
    return torch


def cuda_cupy() -> Any:
    cupy = pytest.importorskip("cupy")
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception:  # no driver: CuPy raises its own CUDA error type
        count = 0
    if count == 0:
        pytest.skip("CuPy sees no CUDA device")
    return cupy


def seed_reference(torch: Any, q: Any, k: Any, v: Any, sm_scale: float) -> Any:
    """The Triton split-K reference's flash_decode_reference, verbatim in behaviour."""
    scores = torch.matmul(q.float(), k.transpose(-1, -2).float()) * sm_scale
    probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs.to(v.dtype), v)


def host_nhd(x: Any, layout: str) -> np.ndarray:
    """A 4-D PyTorch tensor as float64 NumPy, in NHD order."""
    array = x.double().cpu().numpy()
    if layout == "HND":
        array = array.transpose(0, 2, 1, 3)
    return array


def test_seed_self_check_with_torch() -> None:
    """The Triton split-K reference kernel's __main__: batch 2, heads 4, head_dim 64,
    kv_len 256, 4 splits, fp16."""
    torch = cuda_torch()
    torch.manual_seed(0)
    batch, heads, dim, num_splits, kv_len = 2, 4, 64, 4, 256
    q = torch.randn((batch, heads, 1, dim), device="cuda", dtype=torch.float16)
    k = torch.randn((batch, heads, kv_len, dim), device="cuda", dtype=torch.float16)
    v = torch.randn((batch, heads, kv_len, dim), device="cuda", dtype=torch.float16)
    sm_scale = 1.0 / math.sqrt(dim)

    out = flashdecode.flash_decode(q, k, v, sm_scale=sm_scale, num_splits=num_splits)
    ref = seed_reference(torch, q, k, v, sm_scale)

    assert isinstance(out, torch.Tensor) and out.shape == q.shape and out.dtype == q.dtype and out.device == q.device
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("heads,kv_heads,dim", [(8, 2, 128), (4, 4, 64), (16, 1, 256)])
def test_torch_dtypes_layouts_and_groups(dtype, layout, heads, kv_heads, dim) -> None:
    torch = cuda_torch()
    generator = torch.Generator(device="cuda").manual_seed(1)
    torch_dtype = getattr(torch, dtype)
    batch, kv_len = 3, 1000

    def make(*shape: int) -> Any:
        return torch.randn(shape, device="cuda", dtype=torch_dtype, generator=generator)

    if layout == "NHD":
        q, k, v = make(batch, 1, heads, dim), make(batch, kv_len, kv_heads, dim), make(batch, kv_len, kv_heads, dim)
    else:
        q, k, v = make(batch, heads, 1, dim), make(batch, kv_heads, kv_len, dim), make(batch, kv_heads, kv_len, dim)

    with flashdecode.Handle("cuda") as handle:
        out, lse = handle.decode(q, k, v, layout=layout, return_lse=True)
        torch.cuda.synchronize()

    assert out.dtype == q.dtype and out.shape == q.shape and lse.dtype == torch.float32
    expected, expected_lse = attention(host_nhd(q, layout)[:, 0], host_nhd(k, layout), host_nhd(v, layout))
    np.testing.assert_allclose(host_nhd(out, layout)[:, 0], expected, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])
    np.testing.assert_allclose(lse.double().cpu().numpy().reshape(batch, heads), expected_lse, rtol=1e-4, atol=1e-4)


def test_torch_agrees_with_the_cpu_backend() -> None:
    torch = cuda_torch()
    q = torch.randn(2, 8, 1, 128, device="cuda", dtype=torch.float16)
    k = torch.randn(2, 2, 3000, 128, device="cuda", dtype=torch.float16)
    v = torch.randn(2, 2, 3000, 128, device="cuda", dtype=torch.float16)
    on_gpu = flashdecode.flash_decode(q, k, v).cpu().numpy()
    on_cpu = flashdecode.flash_decode(*(x.cpu().numpy() for x in (q, k, v)))
    np.testing.assert_allclose(on_gpu.astype(np.float32), on_cpu.astype(np.float32), atol=2e-3, rtol=2e-3)


def paged_problem(torch: Any, layout: str) -> Tuple[Any, ...]:
    batch, heads, kv_heads, dim, page_size, max_pages = 4, 8, 2, 64, 16, 8
    generator = np.random.default_rng(3)
    dense_k = generator.standard_normal((batch, max_pages * page_size, kv_heads, dim)).astype(np.float32)
    dense_v = generator.standard_normal((batch, max_pages * page_size, kv_heads, dim)).astype(np.float32)
    lens = np.array([128, 1, 0, 77], dtype=np.int32)
    pool_k, pool_v, table = to_pages(generator, dense_k, dense_v, page_size, 5)
    q = generator.standard_normal((batch, 1, heads, dim)).astype(np.float32)
    expected, expected_lse = attention(q[:, 0], dense_k, dense_v, seq_lens=lens)
    if layout == "HND":
        pool_k, pool_v, q = (np.ascontiguousarray(x.transpose(0, 2, 1, 3)) for x in (pool_k, pool_v, q))
    device = [torch.from_numpy(x).cuda() for x in (q, pool_k, pool_v, table, lens)]
    return (*device, expected, expected_lse)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_torch_paged_ragged_with_lse(layout) -> None:
    torch = cuda_torch()
    q, pool_k, pool_v, table, lens, expected, expected_lse = paged_problem(torch, layout)
    with flashdecode.Handle("cuda") as handle:
        out, lse = handle.decode(q, pool_k, pool_v, block_table=table, seq_lens=lens, layout=layout, return_lse=True)
        torch.cuda.synchronize()
    got = out.cpu().numpy()
    got = got[:, :, 0] if layout == "HND" else got[:, 0]
    np.testing.assert_allclose(got, expected, atol=TOLERANCE["float32"])
    got_lse = lse.cpu().numpy()
    got_lse = got_lse[:, :, 0] if layout == "HND" else got_lse[:, 0]
    assert np.all(np.isneginf(got_lse[2])) and np.all(got[2] == 0)
    np.testing.assert_allclose(got_lse[[0, 1, 3]], expected_lse[[0, 1, 3]], rtol=1e-5)


def test_torch_streams() -> None:
    """The current PyTorch stream by default; an explicit stream object or pointer when given."""
    torch = cuda_torch()
    q = torch.randn(2, 4, 1, 64, device="cuda", dtype=torch.float16)
    k = torch.randn(2, 4, 4096, 64, device="cuda", dtype=torch.float16)
    v = torch.randn(2, 4, 4096, 64, device="cuda", dtype=torch.float16)
    expected = flashdecode.flash_decode(q, k, v)
    torch.cuda.synchronize()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        on_current = flashdecode.flash_decode(q, k, v)
    explicit = flashdecode.flash_decode(q, k, v, stream=side)
    as_pointer = flashdecode.flash_decode(q, k, v, stream=side.cuda_stream)
    side.synchronize()
    for result in (on_current, explicit, as_pointer):
        torch.testing.assert_close(result, expected, atol=0, rtol=0)
    with pytest.raises(TypeError, match="stream: expected"):
        flashdecode.flash_decode(q, k, v, stream="default")


def test_torch_workspace_and_cuda_graph() -> None:
    """A reserved (or own) workspace makes decode allocation-free, so it can be captured and replayed."""
    torch = cuda_torch()
    q = torch.randn(4, 32, 1, 128, device="cuda", dtype=torch.float16)
    k = torch.randn(4, 8, 2048, 128, device="cuda", dtype=torch.float16)
    v = torch.randn(4, 8, 2048, 128, device="cuda", dtype=torch.float16)
    out = torch.empty_like(q)
    with flashdecode.Handle("cuda") as handle:
        nbytes = handle.workspace_size(q, k, v, layout="HND")
        assert nbytes > 0
        handle.reserve_workspace(nbytes)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the capture, as PyTorch recommends
            handle.decode(q, k, v, out=out, layout="HND")
        torch.cuda.current_stream().wait_stream(side)

        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            handle.decode(q, k, v, out=out, layout="HND")
        q.copy_(torch.randn_like(q))
        graph.replay()
        torch.cuda.synchronize()
        expected = seed_reference(
            torch, q, k.repeat_interleave(4, dim=1), v.repeat_interleave(4, dim=1), 1 / math.sqrt(128)
        )
        torch.testing.assert_close(out.float(), expected.float(), atol=1e-2, rtol=1e-2)

        own = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        handle.set_workspace(own)
        torch.testing.assert_close(handle.decode(q, k, v, layout="HND"), out, atol=0, rtol=0)
        handle.set_workspace(own[: nbytes // 2 // 256 * 256])
        with pytest.raises(flashdecode.WorkspaceTooSmallError):
            handle.decode(q, k, v, layout="HND")
        handle.set_workspace(None)
        torch.cuda.synchronize()


def test_host_memory_refused_by_a_cuda_handle() -> None:
    torch = cuda_torch()
    q = np.zeros((1, 1, 2, 64), np.float32)
    k = torch.zeros(1, 8, 2, 64, device="cuda")
    with flashdecode.Handle("cuda") as handle:
        with pytest.raises(flashdecode.InvalidArgumentError, match="q: is in host memory"):
            handle.decode(q, k, k)
        with pytest.raises(flashdecode.InvalidArgumentError, match="seq_lens: a list is host memory"):
            handle.decode(torch.zeros(1, 1, 2, 64, device="cuda"), k, k, seq_lens=[8])


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_cupy_arrays(dtype) -> None:
    cupy = cuda_cupy()
    generator = np.random.default_rng(5)
    q = generator.standard_normal((2, 8, 1, 64)).astype(dtype)
    k = generator.standard_normal((2, 2, 700, 64)).astype(dtype)
    v = generator.standard_normal((2, 2, 700, 64)).astype(dtype)
    expected, _ = attention(q[:, :, 0], k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3))

    out = flashdecode.flash_decode(cupy.asarray(q), cupy.asarray(k), cupy.asarray(v), num_splits=5)

    assert isinstance(out, cupy.ndarray) and out.dtype == q.dtype and out.shape == q.shape
    np.testing.assert_allclose(
        cupy.asnumpy(out)[:, :, 0].astype(np.float64), expected, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype]
    )


def test_cupy_stream_from_the_array_interface() -> None:
    """CuPy names its current stream in __cuda_array_interface__; the decode runs on it."""
    cupy = cuda_cupy()
    generator = np.random.default_rng(6)
    q, k, v = (
        cupy.asarray(generator.standard_normal(shape).astype(np.float32))
        for shape in ((1, 4, 1, 32), (1, 4, 5000, 32), (1, 4, 5000, 32))
    )
    expected = cupy.asnumpy(flashdecode.flash_decode(q, k, v))
    with cupy.cuda.Stream(non_blocking=True) as stream:
        interface_stream = q.__cuda_array_interface__.get("stream")
        out = flashdecode.flash_decode(q, k, v)
        stream.synchronize()
    assert interface_stream in (None, stream.ptr)
    np.testing.assert_array_equal(cupy.asnumpy(out), expected)
    with flashdecode.Handle("cuda") as handle:
        lens = cupy.asarray(np.array([1234], np.int32))
        result = handle.decode(q, k, v, layout="HND", seq_lens=lens, stream=cupy.cuda.get_current_stream())
        cupy.cuda.get_current_stream().synchronize()
    host_k, host_v = (cupy.asnumpy(x).transpose(0, 2, 1, 3) for x in (k, v))
    reference, _ = attention(cupy.asnumpy(q)[:, :, 0], host_k, host_v, seq_lens=[1234])
    np.testing.assert_allclose(cupy.asnumpy(result)[:, :, 0], reference, atol=TOLERANCE["float32"])


def hnd_problem(torch: Any, batch: int, heads: int, kv_heads: int, kv_len: int, dim: int, seed: int) -> Tuple[Any, ...]:
    generator = torch.Generator(device="cuda").manual_seed(seed)
    return tuple(
        torch.randn(shape, device="cuda", dtype=torch.float16, generator=generator)
        for shape in ((batch, heads, 1, dim), (batch, kv_heads, kv_len, dim), (batch, kv_heads, kv_len, dim))
    )


def expect_hnd(torch: Any, out: Any, q: Any, k: Any, v: Any) -> None:
    group = q.shape[1] // k.shape[1]
    expected = seed_reference(
        torch, q, k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1), 1 / math.sqrt(q.shape[-1])
    )
    torch.testing.assert_close(out.float(), expected.float(), atol=1e-2, rtol=1e-2)


def test_torch_fast_path_alternates_and_follows_the_stream() -> None:
    """Repeated signatures take the fast path: other tensors, other shapes, another current
    stream (used), an explicit stream that is not the current one (the full path: it waits)."""
    torch = cuda_torch()
    problems = [
        hnd_problem(torch, 4, 32, 8, 1024, 128, 1),
        hnd_problem(torch, 4, 32, 8, 1024, 128, 2),
        hnd_problem(torch, 2, 8, 2, 333, 64, 3),
    ]
    with flashdecode.Handle("cuda") as handle:
        for _ in range(3):
            for q, k, v in problems:
                out = handle.decode(q, k, v, layout="HND")
                expect_hnd(torch, out, q, k, v)
                expect_hnd(torch, flashdecode.flash_decode(q, k, v), q, k, v)
        q, k, v = problems[0]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            on_side = handle.decode(q, k, v, layout="HND")
        side.synchronize()
        expect_hnd(torch, on_side, q, k, v)
        doubled = q * 2  # queued on the current stream; the side stream must wait for it
        explicit = handle.decode(doubled, k, v, layout="HND", stream=side)
        side.synchronize()
        expect_hnd(torch, explicit, doubled, k, v)


def test_torch_op_in_a_captured_graph() -> None:
    """torch.ops.flashdecode.decode captured after a warm-up on the capturing stream; a larger
    decode on that stream afterwards runs on a new handle and leaves the graph's workspace alone."""
    torch = cuda_torch()
    op = flashdecode.torch_op()
    q, k, v = hnd_problem(torch, 4, 32, 8, 1024, 128, 4)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        op(q, k, v, None, None, None, None, "HND")
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        out, lse = op(q, k, v, None, None, None, None, "HND")
    larger = hnd_problem(torch, 16, 64, 8, 8192, 128, 5)
    side.wait_stream(torch.cuda.current_stream())  # larger was made on the current stream
    with torch.cuda.stream(side):
        expect_hnd(torch, op(*larger, None, None, None, None, "HND")[0], *larger)
    torch.cuda.synchronize()
    for seed in (6, 7):
        q.copy_(hnd_problem(torch, 4, 32, 8, 1, 128, seed)[0])
        graph.replay()
        torch.cuda.synchronize()
        expect_hnd(torch, out, q, k, v)
        assert lse.shape == (4, 32, 1) and torch.isfinite(lse).all()


@pytest.mark.parametrize("backend,mode", [("aot_eager", None), ("inductor", None), ("inductor", "reduce-overhead")])
def test_torch_compile_on_cuda(backend, mode) -> None:
    """flash_decode inside torch.compile, CUDA graphs (mode='reduce-overhead') included, for two shapes."""
    torch = cuda_torch()
    torch._dynamo.reset()

    def step(q: Any, k: Any, v: Any) -> Any:
        return flashdecode.flash_decode(q * 1.0, k, v) + 0.0

    compiled = torch.compile(step, backend=backend, mode=mode, fullgraph=True, dynamic=False)
    shapes = [(4, 32, 8, 1024, 128), (2, 8, 2, 4096, 64)]
    with torch.no_grad():
        for round_index in range(4):
            for index, shape in enumerate(shapes):
                q, k, v = hnd_problem(torch, *shape, seed=10 * round_index + index)
                if mode == "reduce-overhead":
                    torch.compiler.cudagraph_mark_step_begin()
                out = compiled(q, k, v).clone()
                torch.cuda.synchronize()
                expect_hnd(torch, out, q, k, v)


# ---- 0.3: content checks on the device, batch-invariant splits ---------------------


def test_cuda_content_checks_report_through_check_contents() -> None:
    """A checked CUDA handle checks on the device: the decode is enqueued, and check_contents()
    (after waiting for the stream) raises what it found, once; an unchecked one clamps."""
    torch = cuda_torch()
    generator = torch.Generator(device="cuda").manual_seed(11)
    q = torch.randn((2, 1, 8, 128), device="cuda", dtype=torch.float16, generator=generator)
    k = torch.randn((2, 100, 2, 128), device="cuda", dtype=torch.float16, generator=generator)
    v = torch.randn((2, 100, 2, 128), device="cuda", dtype=torch.float16, generator=generator)
    bad = torch.tensor([100, 101], dtype=torch.int32, device="cuda")
    good = torch.tensor([100, 100], dtype=torch.int32, device="cuda")
    with flashdecode.Handle("cuda", check_contents=True) as checked:
        checked.decode(q, k, v, seq_lens=bad)
        with pytest.raises(flashdecode.InvalidLengthError, match=r"seq_lens\[1\] must be in \[0, 100\]"):
            checked.check_contents()
        checked.check_contents()  # reported once: nothing is left
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            checked.decode(q, k, v, seq_lens=good)
        checked.check_contents(stream=stream)

        pool_k, pool_v = k.reshape(10, 20, 2, 128), v.reshape(10, 20, 2, 128)
        table = torch.tensor([[0, 1, 2, 3, 4], [5, 6, 7, 8, 12]], dtype=torch.int32, device="cuda")
        checked.decode(q, pool_k, pool_v, block_table=table, seq_lens=good)
        with pytest.raises(flashdecode.InvalidBlockTableError, match=r"block_table\[1\]\[4\] must be in \[0, 10\)"):
            checked.check_contents()
    with flashdecode.Handle("cuda") as unchecked:
        clamped = unchecked.decode(q, k, v, seq_lens=bad)
        assert torch.equal(clamped, unchecked.decode(q, k, v, seq_lens=good))
        with pytest.raises(flashdecode.InvalidArgumentError, match="handle: it checks nothing"):
            unchecked.check_contents()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_cuda_split_tokens_is_batch_invariant(dtype) -> None:
    torch = cuda_torch()
    generator = torch.Generator(device="cuda").manual_seed(12)
    kind = getattr(torch, dtype)
    lengths = [4096, 1, 0, 1000, 2500, 333]
    batch, capacity = len(lengths), 4096
    q = torch.randn((batch, 1, 32, 128), device="cuda", dtype=kind, generator=generator)
    k = torch.randn((batch, capacity, 8, 128), device="cuda", dtype=kind, generator=generator)
    v = torch.randn((batch, capacity, 8, 128), device="cuda", dtype=kind, generator=generator)
    lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    with flashdecode.Handle("cuda") as handle:
        out, lse = handle.decode(q, k, v, seq_lens=lens, split_tokens=512, return_lse=True)
        expected, _ = attention(host_nhd(q, "NHD")[:, 0], host_nhd(k, "NHD"), host_nhd(v, "NHD"), seq_lens=lengths)
        tolerance = TOLERANCE[dtype]
        np.testing.assert_allclose(host_nhd(out, "NHD")[:, 0], expected, atol=tolerance, rtol=tolerance)
        for b, length in enumerate(lengths):
            alone, alone_lse = handle.decode(
                q[b : b + 1], k[b : b + 1, :length], v[b : b + 1, :length], split_tokens=512, return_lse=True
            )
            assert torch.equal(alone[0], out[b]), f"sequence {b} alone"
            assert torch.equal(alone_lse[0], lse[b]), f"lse of sequence {b} alone"
        info = handle.describe_plan(q, k, v, seq_lens=lens, split_tokens=512)
        assert info.split_tokens >= 512 and info.num_splits == -(-capacity // info.split_tokens)
        op_out, _ = torch.ops.flashdecode.decode(q, k, v, lens, None, None, None, "NHD", 512)
        assert torch.equal(op_out, out)


# ---- 0.3: merging partial results ---------------------------------------------------


def cuda_parts(handle: Any, q: Any, k: Any, v: Any, lengths: Any, cuts: Any, layout: str) -> Tuple[list, list]:
    """The (out, lse) states of a cache cut along kv_len at ``cuts``, decoded on ``handle``."""
    torch = cuda_torch()
    axis = 1 if layout == "NHD" else 2
    outs, lses = [], []
    for start, stop in zip(cuts[:-1], cuts[1:]):
        part_lens = torch.clamp(lengths - start, 0, stop - start).to(torch.int32)
        out, lse = handle.decode(
            q, k.narrow(axis, start, stop - start), v.narrow(axis, start, stop - start), seq_lens=part_lens,
            layout=layout, return_lse=True,
        )  # fmt: skip
        outs.append(out)
        lses.append(lse)
    return outs, lses


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_cuda_merge_states_of_parts_is_the_whole(dtype, layout) -> None:
    """Context-parallel decode on one GPU: a cache cut in three shards (one empty for some
    sequences), each decoded with its LSE and merged, is the decode of the whole cache."""
    torch = cuda_torch()
    generator = torch.Generator(device="cuda").manual_seed(13)
    kind = getattr(torch, dtype)
    lengths = [3000, 0, 1, 1024, 2049, 700]
    batch, heads, kv_heads, dim, capacity = len(lengths), 32, 8, 128, 3000

    def make(*shape: int) -> Any:
        return torch.randn(shape, device="cuda", dtype=kind, generator=generator)

    if layout == "NHD":
        q, k, v = make(batch, 1, heads, dim), make(batch, capacity, kv_heads, dim), make(batch, capacity, kv_heads, dim)
    else:
        q, k, v = make(batch, heads, 1, dim), make(batch, kv_heads, capacity, dim), make(batch, kv_heads, capacity, dim)
    lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    with flashdecode.Handle("cuda") as handle:
        whole, whole_lse = handle.decode(q, k, v, seq_lens=lens, layout=layout, return_lse=True)
        outs, lses = cuda_parts(handle, q, k, v, lens, [0, 1024, 2048, capacity], layout)
        out, lse = handle.merge_states(outs, lses, layout=layout, return_lse=True)
        again = flashdecode.merge_states(outs, lses, layout=layout)
        # In place, into the first shard's own tensors.
        expected, expected_lse = out.clone(), lse.clone()
        in_place, in_place_lse = handle.merge_states(outs, lses, out=outs[0], lse=lses[0], return_lse=True)
        torch.cuda.synchronize()
    assert out.dtype == kind and out.shape == q.shape and lse.dtype == torch.float32 and lse.shape == whole_lse.shape
    tolerance = TOLERANCE[dtype]
    torch.testing.assert_close(out.float(), whole.float(), atol=tolerance, rtol=tolerance)
    torch.testing.assert_close(lse, whole_lse, atol=1e-4, rtol=1e-5)
    assert torch.equal(again, out)  # the same inputs give the same bits
    assert in_place is outs[0] and in_place_lse is lses[0]
    assert torch.equal(in_place, expected) and torch.equal(in_place_lse, expected_lse)
    empty = out[1] if layout == "NHD" else out[1].transpose(0, 1)
    assert torch.all(empty == 0) and torch.all(torch.isneginf(lse[1]))  # a sequence of no tokens


def test_cuda_merge_states_streams_graphs_and_mixed_dtypes() -> None:
    """float32 states into a float16 output on a side stream, captured in a CUDA graph and
    replayed with new states; the CPU backend agrees; host memory is refused."""
    torch = cuda_torch()
    generator = torch.Generator(device="cuda").manual_seed(14)
    shape, lse_shape = (8, 1, 16, 128), (8, 1, 16)
    outs = [torch.randn(shape, device="cuda", generator=generator) for _ in range(4)]
    lses = [torch.randn(lse_shape, device="cuda", generator=generator) * 4 for _ in range(4)]
    lses[2][3] = -math.inf  # an empty state for sequence 3
    outs[2][3] = math.nan  # ... whose output never enters the result
    out = torch.empty(shape, device="cuda", dtype=torch.float16)
    lse = torch.empty(lse_shape, device="cuda")
    expected, expected_lse = flashdecode.merge_states(
        [x.cpu() for x in outs], [x.cpu() for x in lses], return_lse=True
    )  # the CPU backend, float32
    with flashdecode.Handle("cuda") as handle:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            handle.merge_states(outs, lses, out=out, lse=lse)  # PyTorch's current stream: the side one
        side.synchronize()
        torch.testing.assert_close(out.float().cpu(), expected, atol=2e-3, rtol=2e-3)
        torch.testing.assert_close(lse.cpu(), expected_lse, atol=1e-5, rtol=1e-5)

        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):  # no allocation, no synchronisation: capturable
            handle.merge_states(outs, lses, out=out, lse=lse)
        for x in outs:
            x.mul_(2)
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out.float().cpu(), expected * 2, atol=4e-3, rtol=2e-3)

        with pytest.raises(flashdecode.InvalidArgumentError, match=r"states_out\[1\]: is in host memory"):
            handle.merge_states([outs[0], outs[1].cpu()], lses[:2])
        with pytest.raises(flashdecode.InvalidDTypeError, match=r"states_lse\[0\]: dtype must be f32"):
            handle.merge_states(outs, [x.half() for x in lses])


# ---- 0.3: attention variants ------------------------------------------------------

# The softcap's tanh may be computed with a hardware approximation on the GPU.
SOFTCAP_TOLERANCE = {"float32": 2e-3, "float16": 6e-3, "bfloat16": 2.5e-2}


def variant_tensors(torch: Any, dtype: str, shape: Tuple[int, ...], kv_len: int, seed: int) -> Tuple[Any, Any, Any]:
    """q ``[batch, q_len, heads, head_dim]`` and k, v ``[batch, kv_len, kv_heads, head_dim]`` (NHD)
    on the GPU; ``shape`` is (batch, q_len, heads, kv_heads, head_dim)."""
    batch, q_len, heads, kv_heads, dim = shape
    generator = torch.Generator(device="cuda").manual_seed(seed)
    kind = getattr(torch, dtype)

    def make(*size: int) -> Any:
        return torch.randn(size, device="cuda", dtype=kind, generator=generator)

    return make(batch, q_len, heads, dim), make(batch, kv_len, kv_heads, dim), make(batch, kv_len, kv_heads, dim)


def expect_variant(
    out: Any, lse: Any, q: Any, k: Any, v: Any, tolerance: float, layout: str = "NHD", **options: Any
) -> None:
    """``out`` and ``lse`` (GPU tensors in ``layout``) against the float64 reference of ``options``."""
    torch = cuda_torch()
    torch.cuda.synchronize()
    expected, expected_lse = variant_attention(host_nhd(q, layout), host_nhd(k, layout), host_nhd(v, layout), **options)
    np.testing.assert_allclose(host_nhd(out, layout), expected, atol=tolerance, rtol=tolerance)
    got_lse = lse.double().cpu().numpy()
    if layout == "HND":
        got_lse = got_lse.transpose(0, 2, 1)
    np.testing.assert_array_equal(np.isneginf(got_lse), np.isneginf(expected_lse))
    finite = ~np.isneginf(expected_lse)
    np.testing.assert_allclose(got_lse[finite], expected_lse[finite], atol=max(1e-4, tolerance / 4), rtol=1e-4)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("q_len", [4, 16])
def test_cuda_query_tokens_gqa(dtype, layout, q_len) -> None:
    """Several query tokens over 8 KV heads of 32 query heads, causal and not, with ragged lengths
    (one shorter than q_len: its first tokens see no key under the causal mask, one empty)."""
    torch = cuda_torch()
    q, k, v = variant_tensors(torch, dtype, (4, q_len, 32, 8, 128), 1500, 21)
    lengths = [1500, 2, 0, 777]
    lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    if layout == "HND":
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))  # strided views
    with flashdecode.Handle("cuda") as handle:
        for causal in (True, False):
            out, lse = handle.decode(q, k, v, seq_lens=lens, layout=layout, causal=causal, return_lse=True)
            assert out.shape == q.shape and out.dtype == q.dtype
            expect_variant(out, lse, q, k, v, TOLERANCE[dtype], layout, seq_lens=lengths, causal=causal)
            split, split_lse = handle.decode(
                q, k, v, seq_lens=lens, layout=layout, causal=causal, num_splits=7, return_lse=True
            )
            expect_variant(split, split_lse, q, k, v, TOLERANCE[dtype], layout, seq_lens=lengths, causal=causal)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window_left", [4096, 1500, 64, 1])
def test_cuda_window(causal, window_left) -> None:
    """Windows larger than, equal to and shorter than the cache, and of one key; keys outside the
    window are never read (NaN there changes nothing)."""
    torch = cuda_torch()
    q, k, v = variant_tensors(torch, "float16", (3, 4, 32, 8, 128), 1500, 22)
    lengths = [1500, 900, 3]
    lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    with flashdecode.Handle("cuda") as handle:
        out, lse = handle.decode(q, k, v, seq_lens=lens, causal=causal, window_left=window_left, return_lse=True)
        expect_variant(
            out, lse, q, k, v, TOLERANCE["float16"], seq_lens=lengths, causal=causal, window_left=window_left
        )
        # Token 0 of a sequence of length L (q_len 4) sees keys from L - 4 - window_left + 1 on.
        for b, length in enumerate(lengths):
            first = max(0, length - 4 - window_left + 1)
            k[b, :first] = math.nan
            v[b, :first] = math.nan
        again, again_lse = handle.decode(
            q, k, v, seq_lens=lens, causal=causal, window_left=window_left, return_lse=True
        )
        torch.cuda.synchronize()
        assert torch.equal(again, out) and torch.equal(again_lse, lse)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_cuda_softcap_alibi_sinks(dtype) -> None:
    """The score variants together, with scores large enough for the cap to matter; an empty
    sequence is zeros with LSE sink[h]."""
    torch = cuda_torch()
    q, k, v = variant_tensors(torch, dtype, (3, 4, 16, 4, 64), 700, 23)
    lengths = [700, 0, 2]
    lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    slopes = torch.from_numpy(alibi_slopes(16)).cuda()
    sinks = torch.linspace(-2.0, 2.0, 16, device="cuda")
    options: Dict[str, Any] = dict(softmax_scale=0.5, logit_softcap=5.0)
    with flashdecode.Handle("cuda") as handle:
        out, lse = handle.decode(q, k, v, seq_lens=lens, alibi_slopes=slopes, sinks=sinks, return_lse=True, **options)
        expect_variant(
            out, lse, q, k, v, SOFTCAP_TOLERANCE[dtype], seq_lens=lengths, scale=0.5, logit_softcap=5.0,
            alibi_slopes=slopes.cpu().numpy(), sinks=sinks.cpu().numpy(),
        )  # fmt: skip
        torch.cuda.synchronize()
        assert torch.all(out[1] == 0)
        torch.testing.assert_close(lse[1], sinks.expand(4, 16), atol=1e-6, rtol=0)
        with pytest.raises(flashdecode.InvalidArgumentError, match="sinks: a list is host memory"):
            handle.decode(q, k, v, sinks=[0.0] * 16)
        with pytest.raises(flashdecode.InvalidArgumentError, match="alibi_slopes: is in host memory"):
            handle.decode(q, k, v, alibi_slopes=slopes.cpu())


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_cuda_paged_ragged_variants(layout) -> None:
    """Every variant on a paged cache with ragged lengths, against the dense reference."""
    torch = cuda_torch()
    batch, q_len, heads, kv_heads, dim, page_size, max_pages = 4, 4, 8, 2, 64, 16, 8
    generator = np.random.default_rng(24)
    dense_k = generator.standard_normal((batch, max_pages * page_size, kv_heads, dim)).astype(np.float32)
    dense_v = generator.standard_normal((batch, max_pages * page_size, kv_heads, dim)).astype(np.float32)
    lengths = [128, 1, 0, 77]
    pool_k, pool_v, table = to_pages(generator, dense_k, dense_v, page_size, 5)
    q = generator.standard_normal((batch, q_len, heads, dim)).astype(np.float32)
    slopes, sinks = alibi_slopes(heads), np.linspace(-1.0, 1.0, heads).astype(np.float32)
    options: Dict[str, Any] = dict(causal=True, window_left=40, logit_softcap=10.0)
    expected, expected_lse = variant_attention(
        q, dense_k, dense_v, seq_lens=lengths, alibi_slopes=slopes, sinks=sinks, **options
    )
    if layout == "HND":
        pool_k, pool_v, q = (np.ascontiguousarray(x.transpose(0, 2, 1, 3)) for x in (pool_k, pool_v, q))
    device = [
        torch.from_numpy(x).cuda() for x in (q, pool_k, pool_v, table, np.array(lengths, np.int32), slopes, sinks)
    ]
    q_d, pool_k_d, pool_v_d, table_d, lens_d, slopes_d, sinks_d = device
    with flashdecode.Handle("cuda") as handle:
        for splits in ({}, {"num_splits": 3}, {"split_tokens": 32}):
            out, lse = handle.decode(
                q_d, pool_k_d, pool_v_d, block_table=table_d, seq_lens=lens_d, layout=layout, return_lse=True,
                alibi_slopes=slopes_d, sinks=sinks_d, **options, **splits,
            )  # fmt: skip
            torch.cuda.synchronize()
            got, got_lse = out.cpu().numpy(), lse.cpu().numpy()
            if layout == "HND":
                got, got_lse = got.transpose(0, 2, 1, 3), got_lse.transpose(0, 2, 1)
            np.testing.assert_allclose(got, expected, atol=SOFTCAP_TOLERANCE["float32"])
            np.testing.assert_allclose(got_lse, expected_lse, atol=SOFTCAP_TOLERANCE["float32"], rtol=1e-4)


def test_cuda_variants_in_a_captured_graph() -> None:
    """Slopes and sinks are read on the device when the graph runs: a replay uses their current values."""
    torch = cuda_torch()
    q, k, v = variant_tensors(torch, "float16", (2, 4, 32, 8, 128), 2048, 25)
    slopes = torch.from_numpy(alibi_slopes(32)).cuda()
    sinks = torch.zeros(32, device="cuda")
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:-1], device="cuda")
    options: Dict[str, Any] = dict(window_left=300, causal=False)
    with flashdecode.Handle("cuda") as handle:
        handle.reserve_workspace(handle.workspace_size(q, k, v, alibi_slopes=slopes, sinks=sinks, **options))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the capture
            handle.decode(q, k, v, out=out, lse=lse, alibi_slopes=slopes, sinks=sinks, **options)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            handle.decode(q, k, v, out=out, lse=lse, alibi_slopes=slopes, sinks=sinks, **options)
        slopes.mul_(2)
        sinks.fill_(1.5)
        graph.replay()
        expect_variant(
            out, lse, q, k, v, TOLERANCE["float16"], alibi_slopes=slopes.cpu().numpy(), sinks=sinks.cpu().numpy(),
            **options,
        )  # fmt: skip


def test_cuda_torch_op_with_variants() -> None:
    """torch.ops.flashdecode.decode and flash_decode (HND) on CUDA tensors take the variants."""
    torch = cuda_torch()
    q, k, v = variant_tensors(torch, "bfloat16", (2, 4, 16, 2, 128), 1000, 26)
    slopes = torch.from_numpy(alibi_slopes(16)).cuda()
    sinks = torch.full((16,), 0.5, device="cuda")
    lens = torch.tensor([1000, 333], dtype=torch.int32, device="cuda")
    out, lse = flashdecode.torch_op()(q, k, v, lens, None, None, None, "NHD", None, False, 100, None, slopes, sinks)
    expect_variant(
        out, lse, q, k, v, TOLERANCE["bfloat16"], seq_lens=[1000, 333], causal=False, window_left=100,
        alibi_slopes=slopes.cpu().numpy(), sinks=sinks.cpu().numpy(),
    )  # fmt: skip
    hnd = [x.transpose(1, 2) for x in (q, k, v)]
    out = flashdecode.flash_decode(*hnd, window_left=100, sinks=sinks)
    expected, _ = variant_attention(
        *(host_nhd(x, "NHD") for x in (q, k, v)), window_left=100, sinks=sinks.cpu().numpy()
    )
    torch.cuda.synchronize()
    tolerance = TOLERANCE["bfloat16"]
    np.testing.assert_allclose(host_nhd(out, "HND"), expected, atol=tolerance, rtol=tolerance)


def test_cuda_ragged_query_lengths() -> None:
    """q_lens (since 0.3) in device memory: padding rows of q hold NaN and are never read, and get
    zeros and LSE sink[h]; the counts are read when the decode runs (new contents of the same
    tensor take effect on the fast path); the custom op takes them too."""
    torch = cuda_torch()
    q, k, v = variant_tensors(torch, "float16", (4, 6, 16, 4, 128), 900, 27)
    lengths, counts = [900, 5, 0, 400], [6, 3, 2, 0]
    padded = q.clone()
    for b, count in enumerate(counts):
        padded[b, count:] = math.nan
    lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    q_lens = torch.tensor(counts, dtype=torch.int32, device="cuda")
    sinks = torch.linspace(-1.0, 1.0, 16, device="cuda")
    tolerance = TOLERANCE["float16"]
    with flashdecode.Handle("cuda") as handle:
        for splits in ({}, {"num_splits": 5}):
            out, lse = handle.decode(padded, k, v, seq_lens=lens, q_lens=q_lens, sinks=sinks, return_lse=True, **splits)
            expect_variant(
                out, lse, padded, k, v, tolerance, seq_lens=lengths, q_lens=counts, sinks=sinks.cpu().numpy()
            )
            assert torch.all(out[3] == 0) and torch.all(out[1, 3:] == 0) and torch.all(out[2] == 0)
            torch.testing.assert_close(lse[3], sinks.expand(6, 16), atol=1e-6, rtol=0)
        q_lens.copy_(torch.tensor([1, 6, 0, 4], dtype=torch.int32))  # new contents, the same tensor
        out, lse = handle.decode(q, k, v, seq_lens=lens, q_lens=q_lens, sinks=sinks, return_lse=True, num_splits=5)
        expect_variant(out, lse, q, k, v, tolerance, seq_lens=lengths, q_lens=[1, 6, 0, 4], sinks=sinks.cpu().numpy())
        with pytest.raises(flashdecode.InvalidArgumentError, match="q_lens: a list is host memory"):
            handle.decode(q, k, v, q_lens=counts)
    q_lens.copy_(torch.tensor(counts, dtype=torch.int32))
    out, lse = flashdecode.torch_op()(padded, k, v, lens, q_lens=q_lens)
    expect_variant(out, lse, padded, k, v, tolerance, seq_lens=lengths, q_lens=counts)
