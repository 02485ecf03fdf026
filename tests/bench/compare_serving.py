#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Times flashdecode against FlashInfer 0.7.2 on paged ragged serving batches.

    eval "$(bash .anchors/flashinfer/setup.sh)"   # optional: FlashInfer rows (n/a with the reason without it)
    python3 tests/bench/compare_serving.py --lib build-h200/src/libflashdecode.so.0 \
        --json $OUT/s.json --plot $OUT/s.png [--dtypes float16,bfloat16] [--shapes 1,...,8]

Shapes (batch x q_heads/kv_heads x lengths x head_dim, one query token, pages
of 16 unless said): lengths drawn uniformly in the range with --seed (shapes
7 and 8 take shape 1's lengths), the pages of an NHD pool [num_pages,
page_size, kv_heads, head_dim] holding exactly the real tokens' pages,
handed to the sequences in a random permutation (a shuffled block table, as
after a serving engine's allocations and frees):
1. 48 x 32/8 x 1..12288 x 128
2. 24 x 64/8 x 1..24576 x 128
3. 384 x 32/8 x 1..1536 x 128
4. 32 x 16/16 x 1..3000 x 64 (MHA)
5. 6 x 32/8 x 24576..98304 x 128, pages of 32
6. 128 x 32/8 x 128: 90% of the lengths in 1..1024, 10% in 16384..32768
   (which sequences are long: random)
7. shape 1 with pages of one token
8. shape 1 on a dense cache [batch, 12288, kv_heads, head_dim] with lengths
   on the device (no block table); FlashInfer reads the same memory seen as
   pages of 16, each sequence's real pages only (as the anchor bundle's
   fi_adapter.make does)
--page-size N gives every paged shape (1-7) pages of N tokens instead.
--shape SPEC (repeatable) adds a shape of your own, numbered 101, 102, ...:
BATCHxQ_HEADS/KV_HEADSxLO..HIxHEAD_DIM, then pN for pages of N tokens
(default 16) or "dense", then optionally cN for a capacity of N tokens a
sequence (the block table's width, or the dense cache's length; default the
largest length), e.g. 64x32/4x1..8192x256p8 or 4x32/8x1..2048x128p16c131072
(--shapes "" runs only those). FlashInfer's bundle holds head_dim 64/128/256
and groups up to 16.
--length-order drawn,descending,ascending times each shape's batch in the
order drawn and sorted by length (the same lengths), one line each: what
the order of a batch costs a schedule. The targets use the first order.

Rows, for each shape and dtype (fp16, bf16):
- fd: flashdecode through ctypes, automatic plan (fd_describe_plan's kernel,
  splits and merge are printed and saved), seq_lens [batch] and the block
  table [batch, ceil(largest length the shape allows / page_size)] as int32
  on the device, the NHD page pool;
- fi-cc, fi-tc: FlashInfer's BatchDecodeWithPagedKVCacheWrapper (kv_layout
  NHD) with use_tensor_cores=False (its CUDA-core decode kernel) and True
  (its prefill kernel with the query heads of a group as rows), on the same
  pools, q and lengths; its page list is the block table's used entries.
  FlashInfer plans on the host from host-side lengths (plan() before the
  capture, as an engine does once per step); flashdecode plans from the
  shapes alone, and its graph stays valid when the lengths and the table
  change in place: after the timings each shape checks that by one captured
  decode replayed with the batch reversed and every length halved.

Method (the same as compare_sdpa.py and compare_quantized.py, whose helpers
this imports): inputs random normal; every implementation runs in the same
process on the same inputs under CUDA graph replay, one graph calling it once
per KV set, the sets (distinct pools, one table) rotated so that a replay
reads at least --rotation-mib of real tokens (at least 2 sets, far above the
60 MiB L2); CUDA events, the median over --replays replays divided by the
calls per replay, --rounds rounds with the order reversed on odd rounds, the
median of the round medians reported. Before timing, each output of the first
set is checked against float64 attention over each sequence's real tokens
(torch on the GPU, a sequence at a time): relative L2 error at most 2e-3 for
fp16, 1e-2 for bf16; a failure marks the row and the script exits non-zero.

Bytes: the real tokens' K and V (sum of lengths x kv_heads x head_dim x 2 x
element bytes) plus q and out. "%" is of the streaming-read ceiling, measured
in the same run at the start and at the end (the higher is used): the best of
compare_sdpa.py's torch read (a sum over 4 GiB) and a sweep of streaming-read
kernels compiled here with NVRTC (16-byte vector loads, 1 or 4 loads in
flight per thread, 128-1024 threads a block, grids of 1-4 full waves and one
load per thread; 4 GiB read each); without NVRTC the torch read alone, said
so. Targets summarised per dtype: fd at most the best FlashInfer time on every
shape; at least 92% of the ceiling on shapes of 256 MiB of real tokens or
more; shape 6's per-byte rate within 5% of shape 3's.

Missing FlashInfer (or a module of it that does not load) makes its rows
"n/a" with the reason; the rest still runs. --from-json re-prints a saved run
(and draws its plot) without torch or a GPU.
"""

import argparse
import ctypes
import json
import math
import os
import re
import statistics
import sys
import time

try:
    import torch
except ImportError:  # --from-json needs no torch
    torch = None

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, HERE)
from compare_quantized import measure  # noqa: E402
from compare_sdpa import (  # noqa: E402
    FlashDecode,
    bandwidth_ceilings,
    base_libraries,
    decode_args,
    flashdecode_calls,
    rel_error,
)
from flashdecode._library import FdPlanInfo  # noqa: E402
from nvrtc_module import NvrtcModule  # noqa: E402

DEVICE = "cuda"
IMPLS = ("fd", "fi-cc", "fi-tc")
BOUNDS = {"float16": 2e-3, "bfloat16": 1e-2}
FI_DENSE_PAGE = 16  # FlashInfer's view of the dense cache of shape 8: pages of 16 tokens
FI_WORKSPACE = 128 << 20  # bytes of a FlashInfer wrapper's float workspace (its recommended size)
MERGES = {0: "direct", 1: "separate", 2: "fused", 3: "cluster"}
TARGET_PCT = 92.0  # % of the read ceiling for shapes of TARGET_MIB of real tokens or more
TARGET_MIB = 256
TARGET_MIXED = 0.05  # shape 6's bytes per second at most this much below shape 3's

# id, batch, q_heads, kv_heads, head_dim, page_size (0: dense cache), length
# ranges ((fraction of the batch, lo, hi), inclusive), the shape whose
# lengths it takes (the lengths' seed), note.
SHAPES = [
    (1, 48, 32, 8, 128, 16, ((1.0, 1, 12288),), 1, ""),
    (2, 24, 64, 8, 128, 16, ((1.0, 1, 24576),), 2, ""),
    (3, 384, 32, 8, 128, 16, ((1.0, 1, 1536),), 3, ""),
    (4, 32, 16, 16, 64, 16, ((1.0, 1, 3000),), 4, "MHA"),
    (5, 6, 32, 8, 128, 32, ((1.0, 24576, 98304),), 5, "pages of 32"),
    (6, 128, 32, 8, 128, 16, ((0.9, 1, 1024), (0.1, 16384, 32768)), 6, "mixed: 10% long"),
    (7, 48, 32, 8, 128, 1, ((1.0, 1, 12288),), 1, "shape 1, pages of 1 token"),
    (8, 48, 32, 8, 128, 0, ((1.0, 1, 12288),), 1, "shape 1, dense cache; FlashInfer: pages of 16 over it"),
]

STARTED = time.monotonic()


CUSTOM_SHAPE = re.compile(r"^(\d+)x(\d+)/(\d+)x(\d+)\.\.(\d+)x(\d+)(?:p(\d+)|(dense))?(?:c(\d+))?$")
CUSTOM_FIRST_ID = 101


def custom_shape(spec, sid):
    """A --shape SPEC as a SHAPES entry numbered sid, or None if SPEC does not parse."""
    match = CUSTOM_SHAPE.match(spec.replace(" ", ""))
    if match is None:
        return None
    batch, q_heads, kv_heads, lo, hi, head_dim = (int(match.group(i)) for i in range(1, 7))
    if min(batch, q_heads, kv_heads, lo, head_dim) < 1 or hi < lo or q_heads % kv_heads:
        return None
    page = 0 if match.group(8) else int(match.group(7) or 16)
    if not match.group(8) and page < 1:
        return None
    cap = int(match.group(9)) if match.group(9) else hi
    if cap < hi:
        return None
    return (sid, batch, q_heads, kv_heads, head_dim, page, ((1.0, lo, hi),), sid, f"--shape {spec}", cap)


def log(message):
    """Progress on stderr, with the time of day and the seconds since the start."""
    print(f"[{time.strftime('%H:%M:%S')} {time.monotonic() - STARTED:6.1f} s] {message}", file=sys.stderr, flush=True)


def shape_label(shape):
    sid, batch, q_heads, kv_heads, head_dim, page, ranges = shape[:7]
    if len(ranges) == 1:
        lengths = f"{ranges[0][1]}..{ranges[0][2]}"
    else:
        lengths = "(" + "|".join(f"{round(f * 100)}% {lo}..{hi}" for f, lo, hi in ranges) + ")"
    cache = f"p{page}" if page else "dense"
    if capacity(shape) > max(hi for _, _, hi in ranges):
        cache += f" c{capacity(shape)}"
    return f"{sid}: {batch}x{q_heads}/{kv_heads}x{lengths}x{head_dim} {cache}"


def capacity(shape):
    """Tokens a sequence may hold: the shape's capacity (custom shapes'
    cN), else the largest length it allows."""
    if len(shape) > 9:
        return shape[9]
    return max(hi for _, _, hi in shape[6])


LENGTH_ORDERS = ("drawn", "descending", "ascending")


def draw_lengths(shape, seed, order="drawn"):
    """The lengths (a CPU int64 tensor) and the generator that drew them
    (seeded by --seed and the shape whose lengths these are), which then
    shuffles the pages. Several ranges: round(fraction x batch) sequences
    each (the first range takes the rest), which ones drawn at random.
    order "descending"/"ascending" sorts the batch by length (--length-order)."""
    batch, ranges, base = shape[1], shape[6], shape[7]
    gen = torch.Generator()
    gen.manual_seed(seed * 1000 + base)
    counts = [round(f * batch) for f, _, _ in ranges[1:]]
    counts.insert(0, batch - sum(counts))
    members = torch.randperm(batch, generator=gen) if len(ranges) > 1 else torch.arange(batch)
    lens = torch.empty(batch, dtype=torch.int64)
    start = 0
    for count, (_, lo, hi) in zip(counts, ranges):
        lens[members[start : start + count]] = torch.randint(lo, hi + 1, (count,), generator=gen)
        start += count
    if order not in LENGTH_ORDERS:
        raise ValueError(f"length order {order!r}")
    if order != "drawn":
        lens = lens.sort(descending=order == "descending").values
    return lens, gen


def make_inputs(shape, dtype, rotation_bytes, seed, length_order="drawn"):
    """One shape's inputs as a dict: "lens" (host list) and "lens_dev"
    (int32 on the device); for a paged shape the shuffled "table" [batch,
    max_pages] (int32 on the device) and FlashInfer's "fi_indptr",
    "fi_indices" and "fi_last" (its page list: the table's used entries in
    order); "ks"/"vs", one pool (paged) or dense cache per set; "qs", "outs"
    [batch, 1, q_heads, head_dim]; "sets", "real_tokens", "kv_bytes" (the real
    tokens' K and V)."""
    sid, batch, q_heads, kv_heads, head_dim, page = shape[:6]
    elem = torch.finfo(dtype).bits // 8
    lens, gen = draw_lengths(shape, seed, length_order)
    cap = capacity(shape)
    real_tokens = int(lens.sum())
    kv_bytes = 2 * real_tokens * kv_heads * head_dim * elem
    sets = max(2, math.ceil(rotation_bytes / kv_bytes))
    if not page:  # a dense cache holds its capacity: at most 24 GiB of sets beyond two
        sets = max(2, min(sets, (24 << 30) // (2 * batch * cap * kv_heads * head_dim * elem)))
    data = {"lens": lens.tolist(), "lens_dev": lens.to(torch.int32).to(DEVICE), "sets": sets, "capacity": cap}
    data.update(real_tokens=real_tokens, kv_bytes=kv_bytes, table=None)
    if page:
        npages = (lens + page - 1) // page
        width = -(-cap // page)
        used = torch.arange(width)[None, :] < npages[:, None]
        perm = torch.randperm(int(npages.sum()), generator=gen).to(torch.int32)
        table = torch.zeros(batch, width, dtype=torch.int32)  # unused entries: page 0 (never read)
        table[used] = perm  # row-major: sequence 0's pages, then sequence 1's, ...
        data["table"] = table.to(DEVICE)
        data["fi_indices"] = perm.to(DEVICE)
        data["fi_indptr"] = torch.cat([torch.zeros(1, dtype=torch.int64), npages.cumsum(0)]).to(torch.int32).to(DEVICE)
        data["fi_last"] = (lens - (npages - 1) * page).to(torch.int32).to(DEVICE)
        size = (int(npages.sum()), page, kv_heads, head_dim)
        data["pool_pages"] = size[0]
    else:
        size = (batch, cap, kv_heads, head_dim)
    dgen = torch.Generator(device=DEVICE)
    dgen.manual_seed(seed * 1000 + 500 + sid)

    def randn(*size):
        return torch.randn(*size, device=DEVICE, dtype=dtype, generator=dgen)

    data["qs"] = [randn(batch, 1, q_heads, head_dim) for _ in range(sets)]
    data["ks"] = [randn(*size) for _ in range(sets)]
    data["vs"] = [randn(*size) for _ in range(sets)]
    data["outs"] = [torch.empty_like(q) for q in data["qs"]]
    return data


def reference(q, k, v, lens, table, page):
    """float64 attention of q [B, 1, Hq, D] over each sequence's first
    lens[b] tokens: k/v a page pool [pages, page, Hkv, D] read through
    `table` (on the device), or dense [B, N, Hkv, D] (table None); a
    sequence at a time on q's device, its heads batched."""
    batch, _, q_heads, head_dim = q.shape
    kv_heads = k.shape[-2]
    group = q_heads // kv_heads
    out = torch.empty(batch, 1, q_heads, head_dim, dtype=torch.float64, device=q.device)
    rows = table.long() if table is not None else None
    for b, length in enumerate(lens):
        if rows is not None:
            pages = rows[b, : -(-length // page)]
            kb = k[pages].reshape(-1, kv_heads, head_dim)[:length]
            vb = v[pages].reshape(-1, kv_heads, head_dim)[:length]
        else:
            kb, vb = k[b, :length], v[b, :length]
        kb = kb.double().permute(1, 2, 0)  # [Hkv, D, L]
        vb = vb.double().permute(1, 0, 2)  # [Hkv, L, D]
        qb = q[b, 0].double().reshape(kv_heads, group, head_dim)
        weights = torch.softmax(torch.matmul(qb, kb) / math.sqrt(head_dim), dim=-1)
        out[b, 0] = torch.matmul(weights, vb).reshape(q_heads, head_dim)
    return out


def fd_args_per_set(fd, data):
    """fd_decode_args per set through compare_sdpa.decode_args, which takes
    q/out as [B, Hq, 1, D] and a dense cache as [B, Hkv, N, D]: our
    [B, 1, Hq, D] and [B, N, Hkv, D] tensors go in transposed (the same
    memory; it transposes them back). A page pool goes in as it is (NHD)."""
    args = []
    for q, k, v, out in zip(data["qs"], data["ks"], data["vs"], data["outs"]):
        if data["table"] is None:
            k, v = k.transpose(1, 2), v.transpose(1, 2)
        args.append(
            decode_args(
                fd, q.transpose(1, 2), k, v, out.transpose(1, 2), seq_lens=data["lens_dev"], block_table=data["table"]
            )
        )
    return args


def plan_info(fd, handle, args):
    """fd_describe_plan() of args as a dict ({} for a library without it)."""
    if not hasattr(fd.lib, "fd_describe_plan"):
        return {}
    info = FdPlanInfo(struct_size=ctypes.sizeof(FdPlanInfo))
    fd.check(fd.lib.fd_describe_plan(handle, ctypes.byref(args), ctypes.byref(info)), "fd_describe_plan")
    return {
        "kernel": info.kernel.decode() if info.kernel else "",
        "num_splits": info.num_splits,
        "split_tokens": info.split_tokens,
        "merge": MERGES.get(info.merge, str(info.merge)),
        "launches": info.launches,
        "blocks": info.blocks,
        "workspace_bytes": info.workspace_bytes,
    }


# ---------------------------------------------------------------------------------------------------------------
# FlashInfer


def fi_pages(shape, data):
    """What FlashInfer reads: (page_size, indptr, indices, last_page_len,
    [(k, v) NHD pool of each set]). A paged shape: its pools, the table's
    used entries. The dense shape: the [B, N, Hkv, D] caches seen as NHD
    pools of pages of 16 (page j of sequence b is b * N / 16 + j; no copy),
    each sequence's real pages only."""
    _, batch, _, kv_heads, head_dim, page = shape[:6]
    if page:
        return page, data["fi_indptr"], data["fi_indices"], data["fi_last"], list(zip(data["ks"], data["vs"]))
    page, cap = FI_DENSE_PAGE, data["capacity"]
    if cap % page:
        raise RuntimeError(f"the dense capacity {cap} is not a multiple of {page}")
    per_row = cap // page
    lens = torch.tensor(data["lens"], dtype=torch.int64, device=DEVICE)
    npages = (lens + page - 1) // page
    slots = torch.arange(per_row, device=DEVICE)[None, :]
    indices = (torch.arange(batch, device=DEVICE)[:, None] * per_row + slots)[slots < npages[:, None]]
    indptr = torch.cat([torch.zeros(1, dtype=torch.int64, device=DEVICE), npages.cumsum(0)])
    last = lens - (npages - 1) * page
    views = [
        (k.view(batch * per_row, page, kv_heads, head_dim), v.view(batch * per_row, page, kv_heads, head_dim))
        for k, v in zip(data["ks"], data["vs"])
    ]
    return page, indptr.to(torch.int32), indices.to(torch.int32), last.to(torch.int32), views


class FlashInfer:
    """FlashInfer from the anchor bundle (fi_adapter.py beside setup.sh), or an installed one, or the reason it is not
    there."""

    def __init__(self, fi_dir):
        self.fi, self.reason, self.ready = None, None, {}
        try:
            if os.path.isfile(os.path.join(fi_dir, "fi_adapter.py")):
                sys.path.insert(0, fi_dir)
                import fi_adapter  # noqa: E402

                self.fi = fi_adapter._ensure_flashinfer()
            else:
                import flashinfer

                self.fi = flashinfer
            log(f"FlashInfer {self.fi.__version__} from {os.path.dirname(self.fi.__file__)}")
        except Exception as error:
            self.reason = f"FlashInfer not loaded ({fi_dir}): {str(error).splitlines()[0][:100] if str(error) else ''}"

    def build(self, shape, data, tensor_cores):
        """The calls of one row: BatchDecodeWithPagedKVCacheWrapper planned
        once (on the host, from the lengths) and run on every set."""
        fi = self.fi
        _, batch, q_heads, kv_heads, head_dim = shape[:5]
        dtype = data["qs"][0].dtype
        page, indptr, indices, last, views = fi_pages(shape, data)
        workspace = torch.zeros(FI_WORKSPACE, dtype=torch.uint8, device=DEVICE)
        wrapper = fi.BatchDecodeWithPagedKVCacheWrapper(workspace, kv_layout="NHD", use_tensor_cores=tensor_cores)
        key = (str(dtype), head_dim, tensor_cores)
        started = time.monotonic()
        wrapper.plan(
            indptr,
            indices,
            last,
            q_heads,
            kv_heads,
            head_dim,
            page,
            q_data_type=dtype,
            kv_data_type=dtype,
            sm_scale=1.0 / math.sqrt(head_dim),
        )
        qs = [q.view(batch, q_heads, head_dim) for q in data["qs"]]
        outs = [o.view(batch, q_heads, head_dim) for o in data["outs"]]
        if key not in self.ready:  # the first run loads (or, without a prebuilt module, compiles) the module
            wrapper.run(qs[0], views[0], out=outs[0])
            torch.cuda.synchronize()
            self.ready[key] = time.monotonic() - started
            log(
                f"  FlashInfer {str(dtype)[6:]} D={head_dim} tensor_cores={tensor_cores}: module ready in "
                f"{self.ready[key]:.1f} s" + (" (compiled on this machine)" if self.ready[key] > 5 else "")
            )

        def calls():
            for i in range(len(qs)):
                wrapper.run(qs[i], views[i], out=outs[i])
            return len(qs)

        calls.keep = (wrapper, workspace, indptr, indices, last, views)
        try:
            calls.backend = str(wrapper.resolved_backend)
        except Exception:  # a FlashInfer without the property
            calls.backend = ""
        return calls


# ---------------------------------------------------------------------------------------------------------------
# the read ceiling: a sweep of streaming-read kernels

READ_KERNELS = r"""
// Streaming reads of n 16-byte vectors, grid-stride; the xor of everything
// read decides a store that never happens, so no load can be dropped.
extern "C" __global__ void __launch_bounds__(1024) read_u1(const uint4 *__restrict__ p, unsigned long long n,
                                                           unsigned int *sink) {
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  unsigned int acc = 0;
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    const uint4 a = __ldg(p + i);
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  if (acc == 0x9e3779b9u) atomicAdd(sink, 1u);
}

// The same with 4 loads in flight per thread.
extern "C" __global__ void __launch_bounds__(1024) read_u4(const uint4 *__restrict__ p, unsigned long long n,
                                                           unsigned int *sink) {
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
  unsigned int acc = 0;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = __ldg(p + i), b = __ldg(p + i + stride), c = __ldg(p + i + 2 * stride);
    const uint4 d = __ldg(p + i + 3 * stride);
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
  }
  for (; i < n; i += stride) {
    const uint4 a = __ldg(p + i);
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  if (acc == 0x9e3779b9u) atomicAdd(sink, 1u);
}
"""


class ReadSweep(NvrtcModule):
    """READ_KERNELS compiled with NVRTC for this GPU (nvrtc_module.py)."""

    def __init__(self):
        super().__init__(READ_KERNELS, ("read_u1", "read_u4"), "read.cu")

    def measure(self, gib=4):
        """GB/s of every configuration, each the median of 7 timed launches
        (after 3 untimed; 20 more first, so that the GPU's clocks are up),
        as (rate, description) sorted best first."""
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        sms = props.multi_processor_count
        per_sm = getattr(props, "max_threads_per_multi_processor", 2048)
        data = torch.ones((gib << 30) // 4, dtype=torch.int32, device=DEVICE)
        sink = torch.zeros(1, dtype=torch.int32, device=DEVICE)
        n = data.numel() * 4 // 16
        pointer, count, sink_pointer = (
            ctypes.c_void_p(data.data_ptr()),
            ctypes.c_ulonglong(n),
            ctypes.c_void_p(sink.data_ptr()),
        )
        params = self.arguments((pointer, count, sink_pointer))
        configs = []
        for kernel in ("read_u1", "read_u4"):
            for threads in (128, 256, 512, 1024):
                resident = max(1, per_sm // threads)
                for waves in (1, 2, 4):
                    configs.append((kernel, threads, sms * resident * waves, f"{waves} wave{'s' if waves > 1 else ''}"))
        for threads in (256, 1024):
            configs.append(("read_u1", threads, -(-n // threads), "one load a thread"))
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

        def launch(kernel, threads, grid):
            self.launch(kernel, grid, threads, params)

        for _ in range(20):
            launch(*configs[-1][:3])
        results = []
        for kernel, threads, grid, what in configs:
            for _ in range(3):
                launch(kernel, threads, grid)
            times = []
            for _ in range(7):
                start.record()
                launch(kernel, threads, grid)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) * 1e-3)
            rate = n * 16 / statistics.median(times)
            loads = 4 if kernel == "read_u4" else 1
            results.append((rate, f"{loads} x 16 B in flight, {threads} threads, {grid} blocks ({what})"))
        del data, sink
        torch.cuda.empty_cache()
        return sorted(results, reverse=True)


def ceilings(sweep, no_sweep=None):
    """compare_sdpa's torch read and copy rates, and the best of the kernel sweep (no_sweep: why there is none),
    in B/s."""
    read, copy = bandwidth_ceilings()
    found = {"torch_read": read, "copy": copy, "read": read, "read_by": "torch sum over 4 GiB"}
    if sweep is None:
        found["sweep_error"] = no_sweep or "no kernel sweep"
    else:
        try:
            results = sweep.measure()
            found["sweep"] = [(rate * 1e-9, what) for rate, what in results]
            if results[0][0] > read:
                found["read"], found["read_by"] = results[0][0], results[0][1]
        except Exception as error:
            found["sweep_error"] = str(error)[:200]
    return found


# ---------------------------------------------------------------------------------------------------------------
# one shape


def run_shape(fd, handle, anchor, shape, dtype, args, bases=None, length_order="drawn"):
    sid, batch, q_heads, kv_heads, head_dim, page = shape[:6]
    dtype_name = str(dtype).replace("torch.", "")
    data = make_inputs(shape, dtype, args.rotation_mib << 20, args.seed, length_order)
    # Several orders of one shape in a run: each its own line of the tables.
    label = shape_label(shape) + (f" [{length_order}]" if len(args.length_orders) > 1 else "")
    elem = torch.finfo(dtype).bits // 8
    moved = data["kv_bytes"] + 2 * batch * q_heads * head_dim * elem
    log(
        f"{label} {dtype_name}: {data['real_tokens']} tokens, {data['kv_bytes'] / 2**20:.0f} MiB of real "
        f"K/V, {data['sets']} sets; reference"
    )
    ref = reference(data["qs"][0], data["ks"][0], data["vs"][0], data["lens"], data["table"], page)
    bound = BOUNDS[dtype_name]
    fd_args = []

    def build_fd():
        fd_args.extend(fd_args_per_set(fd, data))
        calls = flashdecode_calls(fd, handle, fd_args)
        calls.info = plan_info(fd, handle, fd_args[0])
        return calls

    builds = [("fd", build_fd)]
    for name, base_fd, base_handle in bases or []:  # --base-lib: other builds, for an A/B in this process

        def build_base(base_fd=base_fd, base_handle=base_handle):
            base_args = fd_args_per_set(base_fd, data)
            calls = flashdecode_calls(base_fd, base_handle, base_args)
            calls.info = plan_info(base_fd, base_handle, base_args[0])
            calls.args = base_args  # the calls point into these structs: keep them alive
            return calls

        builds.append((name, build_base))
    for impl, tensor_cores in (("fi-cc", False), ("fi-tc", True)):
        if anchor is None or anchor.fi is None:
            builds.append((impl, anchor.reason if anchor is not None else "FlashInfer not asked for (--no-fi)"))
        else:
            builds.append((impl, lambda tensor_cores=tensor_cores: anchor.build(shape, data, tensor_cores)))
    results, timed = [], []
    fd_calls = None
    for impl, build in builds:
        row = {
            "impl": impl,
            "shape_id": sid,
            "label": label,
            "length_order": length_order,
            "note": shape[8],
            "dtype": dtype_name,
            "batch": batch,
            "q_heads": q_heads,
            "kv_heads": kv_heads,
            "head_dim": head_dim,
            "page_size": page,
            "cache": "paged" if page else "dense",
            "capacity": data["capacity"],
            "lengths": {"min": min(data["lens"]), "max": max(data["lens"]), "mean": data["real_tokens"] / batch},
            "kv_sets": data["sets"],
            "kv_mib": data["kv_bytes"] / 2**20,
            "real_tokens": data["real_tokens"],
            "bytes": moved,
            "bound": bound,
        }
        if page:
            row["pool_pages"] = data["pool_pages"]
            row["table_width"] = data["table"].shape[1]
        results.append(row)
        if isinstance(build, str):
            row["error"] = build
            continue
        try:
            calls = build()
            if impl.startswith("fd"):
                if impl == "fd":
                    fd_calls = calls
                row["fd_plan_info"] = calls.info
                if calls.info:
                    info = calls.info
                    row["plan"] = f"{info['kernel']} {info['num_splits']}x{info['split_tokens']} {info['merge']}"
            elif getattr(calls, "backend", ""):
                row["backend"] = calls.backend
            for out in data["outs"]:
                out.fill_(float("nan"))
            calls()  # once, eagerly: set 0's output is checked before timing
            torch.cuda.synchronize()
            rel, max_abs = rel_error(data["outs"][0], ref)
            row.update(rel_err=rel, max_abs_err=max_abs, ok=bool(rel <= bound))
            if row["ok"]:
                timed.append((row, calls))
            else:
                row["error"] = f"check failed: rel err {rel:.1e} > {bound:.0e}"
        except Exception as error:  # a FlashInfer module that does not load, a library that refuses the shape, ...
            row["error"] = str(error).splitlines()[0][:160] if str(error) else type(error).__name__
            if impl == "fd":
                row["ok"] = False
    log(f"{label} {dtype_name}: timing {', '.join(r['impl'] for r, _ in timed) or 'nothing'}")
    measure(timed, args.rounds, args.replays)
    for row, _ in timed:
        row["gbps"] = row["bytes"] / row["us"] * 1e-3
    fd_row = results[0]
    if fd_calls is not None and fd_row.get("ok"):
        try:
            fd_row.update(graph_update_check(fd, handle, fd_args[0], data, page, bound))
        except Exception as error:
            fd_row.update(graph_update_ok=False, graph_update_error=str(error).splitlines()[0][:160])
    times = ", ".join(f"{r['impl']} {r['us']:.1f} us" if "us" in r else f"{r['impl']} n/a" for r in results)
    log(f"{label} {dtype_name}: {times}")
    return results


def graph_update_check(fd, handle, args0, data, page, bound):
    """Captures one flashdecode decode of set 0, then reverses the batch's
    order (the table's rows with it) and halves every length in place and
    replays the graph: the output must match the reference of the new
    lengths and table (the plan is not redone: it depends on the shapes
    only). The lengths and table are restored after."""
    calls = flashdecode_calls(fd, handle, [args0])
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        calls()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        calls()
    lens_dev, table = data["lens_dev"], data["table"]
    saved_lens = lens_dev.clone()
    saved_table = table.clone() if table is not None else None
    new_lens = [(n + 1) // 2 for n in reversed(data["lens"])]
    try:
        lens_dev.copy_(torch.tensor(new_lens, dtype=torch.int32))
        if table is not None:
            table.copy_(saved_table.flip(0))
        data["outs"][0].fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = reference(data["qs"][0], data["ks"][0], data["vs"][0], new_lens, table, page)
        rel, _ = rel_error(data["outs"][0], ref)
    finally:
        lens_dev.copy_(saved_lens)
        if table is not None:
            table.copy_(saved_table)
        torch.cuda.synchronize()
        del graph
    return {"graph_update_rel_err": rel, "graph_update_ok": bool(rel <= bound)}


# ---------------------------------------------------------------------------------------------------------------
# report


def line_key(row):
    """A line of the tables and the plot: a shape in one length order (--length-order)."""
    return row["shape_id"], row.get("length_order", "drawn")


def targets(rows, dtype):
    """The issue's targets for one dtype's rows, as a dict (the first length order's rows)."""
    first_order = line_key(rows[0])[1] if rows else "drawn"
    by = {}
    for r in rows:
        if line_key(r)[1] != first_order:
            continue
        if r["dtype"] == dtype:
            by.setdefault(r["shape_id"], {})[r["impl"]] = r
    out = {"fd_vs_best_fi": {}, "fd_pct": {}, "misses_fi": [], "misses_pct": []}
    for sid, impls in sorted(by.items()):
        fd = impls.get("fd")
        if fd is None or "us" not in fd:
            continue
        anchors = [impls[i] for i in ("fi-cc", "fi-tc") if i in impls and "us" in impls[i]]
        if anchors:
            ratio = fd["us"] / min(a["us"] for a in anchors)
            out["fd_vs_best_fi"][sid] = ratio
            if ratio > 1.0:
                out["misses_fi"].append(sid)
        if fd["kv_mib"] >= TARGET_MIB and "pct_of_read" in fd:
            out["fd_pct"][sid] = fd["pct_of_read"]
            if fd["pct_of_read"] < TARGET_PCT:
                out["misses_pct"].append(sid)
    fd3, fd6 = by.get(3, {}).get("fd"), by.get(6, {}).get("fd")
    if fd3 and fd6 and "gbps" in fd3 and "gbps" in fd6:
        out["shape6_rate_vs_shape3"] = fd6["gbps"] / fd3["gbps"]
        out["shape6_within"] = out["shape6_rate_vs_shape3"] >= 1.0 - TARGET_MIXED
    return out


def report(rows, dtypes, ceiling_gbps, plot_path):
    """The rows one by one, a table per dtype, the targets and the plot."""
    print(
        f"=== rows (median under CUDA graph replay, KV sets rotated; GB/s over the real tokens' K/V + q + out; "
        f"% of the {ceiling_gbps:.0f} GB/s read ceiling)"
    )
    print(f"{'shape':<52} {'dtype':<8} {'impl':<6} {'us':>9} {'GB/s':>6} {'%read':>6} {'rel err':>8}  notes")
    for r in rows:
        head = f"{r['label']:<52} {r['dtype']:<8} {r['impl']:<6}"
        if "us" not in r:
            print(f"{head} n/a: {r.get('error', 'not timed')}")
            continue
        notes = [r[key] for key in ("plan", "backend") if r.get(key)]
        if "graph_update_rel_err" in r:
            notes.append(
                f"graph replayed after in-place lengths/table change: rel err {r['graph_update_rel_err']:.1e}"
                + ("" if r.get("graph_update_ok") else " FAILED")
            )
        elif "graph_update_error" in r:
            notes.append(f"graph update check FAILED: {r['graph_update_error']}")
        print(
            f"{head} {r['us']:>9.1f} {r['gbps']:>6.0f} {r.get('pct_of_read', 0):>6.1f} {r['rel_err']:>8.1e}  "
            + "; ".join(notes)
        )
    summary = {}
    for dtype in dtypes:
        here = [r for r in rows if r["dtype"] == dtype]
        if not here:
            continue
        print(f"=== {dtype}: us per call, % of the read ceiling, fd time / best FlashInfer time")
        print(
            f"{'shape':<52} {'KV MiB':>7} | {'fd':>8} {'fi-cc':>8} {'fi-tc':>8} | {'fd%':>5} {'cc%':>5} {'tc%':>5} | "
            f"{'fd/FI':>6} | notes"
        )
        keys = []
        for r in here:
            if line_key(r) not in keys:
                keys.append(line_key(r))
        for key in keys:
            impls = {r["impl"]: r for r in here if line_key(r) == key}
            first = next(iter(impls.values()))
            us = " ".join(f"{impls[i]['us']:>8.1f}" if "us" in impls.get(i, {}) else f"{'n/a':>8}" for i in IMPLS)
            pct = " ".join(
                f"{impls[i]['pct_of_read']:>5.1f}" if "pct_of_read" in impls.get(i, {}) else f"{'-':>5}" for i in IMPLS
            )
            anchors = [impls[i]["us"] for i in ("fi-cc", "fi-tc") if "us" in impls.get(i, {})]
            fd = impls.get("fd", {})
            ratio = f"{fd['us'] / min(anchors):>6.2f}" if anchors and "us" in fd else f"{'-':>6}"
            notes = [first["note"]] if first.get("note") else []
            if fd.get("plan"):
                notes.append(f"fd: {fd['plan']}")
            for other, r in impls.items():
                if other.startswith("fd-") and "us" in fd and "us" in r:
                    notes.append(f"fd / {other} {fd['us'] / r['us']:.3f}")
            failed = [i for i, r in impls.items() if r.get("ok") is False or r.get("graph_update_ok") is False]
            if failed:
                notes.append("FAILED: " + ", ".join(failed))
            print(f"{first['label']:<52} {first['kv_mib']:>7.0f} | {us} | {pct} | {ratio} | {'; '.join(notes)}")
        t = summary[dtype] = targets(rows, dtype)
        worst = {}
        for r in here:
            if "rel_err" in r:
                error = r["rel_err"] if r["rel_err"] == r["rel_err"] else math.inf  # NaN: an element not written
                worst[r["impl"]] = max(worst.get(r["impl"], 0.0), error)
        print(
            f"{dtype} worst relative error (bound {BOUNDS.get(dtype, float('nan')):.0e}): "
            + ", ".join(f"{i} {e:.1e}" for i, e in worst.items())
        )
        line = [f"targets {dtype}:"]
        if t["fd_vs_best_fi"]:
            misses = ", ".join(f"{sid} ({t['fd_vs_best_fi'][sid]:.2f}x)" for sid in t["misses_fi"])
            line.append(
                f"fd <= best FlashInfer on {len(t['fd_vs_best_fi']) - len(t['misses_fi'])}/{len(t['fd_vs_best_fi'])} "
                f"shapes" + (f" (slower on {misses})" if misses else "") + ";"
            )
        else:
            line.append("fd vs FlashInfer: no FlashInfer rows;")
        misses = ", ".join(f"{sid} ({t['fd_pct'][sid]:.1f}%)" for sid in t["misses_pct"])
        line.append(
            f">= {TARGET_PCT:.0f}% of the ceiling on {len(t['fd_pct']) - len(t['misses_pct'])}/{len(t['fd_pct'])} "
            f"shapes of >= {TARGET_MIB} MiB" + (f" (below on {misses})" if misses else "") + ";"
        )
        if "shape6_rate_vs_shape3" in t:
            line.append(
                f"shape 6's GB/s / shape 3's {t['shape6_rate_vs_shape3']:.3f} "
                f"({'within' if t['shape6_within'] else 'NOT within'} {TARGET_MIXED * 100:.0f}%)"
            )
        else:
            line.append("shape 6 vs 3: not both run")
        print(" ".join(line))
    if plot_path:
        try:
            plot(plot_path, rows, dtypes)
        except Exception as error:
            print(f"plot failed: {error}")
    return summary


def plot(path, rows, dtypes):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dtypes = [d for d in dtypes if any(r["dtype"] == d for r in rows)]
    fig, axes = plt.subplots(len(dtypes), 1, figsize=(14, 4.6 * len(dtypes)), squeeze=False)
    width = 0.8 / len(IMPLS)
    labels = {"fd": "flashdecode", "fi-cc": "FlashInfer CUDA cores", "fi-tc": "FlashInfer tensor cores"}
    for ax, dtype in zip(axes[:, 0], dtypes):
        here = [r for r in rows if r["dtype"] == dtype]
        keys = []
        for r in here:
            if line_key(r) not in keys:
                keys.append(line_key(r))
        top = 100.0
        for j, impl in enumerate(IMPLS):
            xs, ys = [], []
            for i, key in enumerate(keys):
                r = next((r for r in here if line_key(r) == key and r["impl"] == impl and "pct_of_read" in r), None)
                if r is not None:
                    xs.append(i + (j - (len(IMPLS) - 1) / 2) * width)
                    ys.append(r["pct_of_read"])
            ax.bar(xs, ys, width, label=labels[impl])
            top = max([top] + ys)
        ax.axhline(TARGET_PCT, color="gray", linestyle="--", linewidth=0.8, label=f"{TARGET_PCT:.0f}% (target)")
        ax.set_xticks(range(len(keys)))
        names = [next(r["label"] for r in here if line_key(r) == key) for key in keys]
        ax.set_xticklabels(names, rotation=15, ha="right", fontsize=8)
        ax.set_ylabel("% of streaming-read ceiling")
        ax.grid(axis="y", linewidth=0.3)
        ax.set_title(f"paged ragged decode batches, {dtype} (median under CUDA graph replay, real tokens' bytes)")
        ax.set_ylim(0, top * 1.08)
        ax.legend(fontsize=8, ncol=len(IMPLS) + 1)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def print_ceilings(when, found):
    sweep = (
        f"; kernel sweep best {found['sweep'][0][0]:.0f} GB/s ({found['sweep'][0][1]})" if found.get("sweep") else ""
    )
    if "sweep_error" in found:
        sweep = f"; kernel sweep unavailable: {found['sweep_error']}"
    print(
        f"ceilings {when}: streaming read {found['read'] * 1e-9:.0f} GB/s (torch sum {found['torch_read'] * 1e-9:.0f}"
        f"{sweep}), device-to-device copy {found['copy'] * 1e-9:.0f} GB/s (read + written)",
        flush=True,
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lib", help="path of libflashdecode.so.0 (required unless --from-json)")
    parser.add_argument("--json", help="write every row (with flashdecode's plan) here")
    parser.add_argument("--plot", help="write a PNG of %% of the read ceiling per shape and implementation here")
    parser.add_argument("--dtypes", default="float16,bfloat16", help="comma-separated: float16, bfloat16")
    parser.add_argument("--shapes", default="1,2,3,4,5,6,7,8", help="comma-separated shape ids, 1..8")
    parser.add_argument(
        "--shape",
        action="append",
        default=[],
        help="a shape of your own, BATCHxQ_HEADS/KV_HEADSxLO..HIxHEAD_DIM[pPAGE|dense][cCAPACITY] "
        "(repeatable; ids 101, ...)",
    )
    parser.add_argument("--replays", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3, help="timing rounds, order alternating (median of rounds)")
    parser.add_argument(
        "--rotation-mib", type=int, default=1024, help="real K/V bytes a replay reads, at least (2 sets at least)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the lengths, tables and data")
    parser.add_argument(
        "--length-order",
        default="drawn",
        help="comma-separated: drawn, descending, ascending: the batch's sequences in the order drawn, or sorted by "
        "length (the same lengths); several time each shape once per order, in this process, to see what the "
        "order of a batch costs a schedule (the targets use the first)",
    )
    parser.add_argument(
        "--page-size",
        type=int,
        default=0,
        help="tokens a page of every paged shape (shape 8 stays dense), e.g. to A/B a page-size rule; "
        "default: each shape's own",
    )
    parser.add_argument(
        "--fi-dir",
        default=os.path.join(ROOT, ".anchors", "flashinfer"),
        help="the FlashInfer anchor bundle (fi_adapter.py, setup.sh); else an installed flashinfer",
    )
    parser.add_argument("--no-fi", action="store_true", help="skip the FlashInfer rows")
    parser.add_argument(
        "--base-lib",
        action="append",
        default=[],
        help="NAME=PATH (or PATH: NAME base) of another build of libflashdecode.so.0, timed as row fd-NAME (A/B); "
        "repeatable",
    )
    parser.add_argument("--from-json", help="print the tables and draw the plot of an earlier run's JSON; run nothing")
    args = parser.parse_args()
    args.length_orders = [o for o in args.length_order.split(",") if o]
    for order in args.length_orders:
        if order not in LENGTH_ORDERS:
            parser.error(f"--length-order: {order} is not one of {', '.join(LENGTH_ORDERS)}")
    if not args.length_orders or len(set(args.length_orders)) != len(args.length_orders):
        parser.error("--length-order: one or more orders, each once")
    dtypes = [d for d in args.dtypes.split(",") if d]
    for d in dtypes:
        if d not in BOUNDS:
            parser.error(f"--dtypes: {d} is not float16 or bfloat16")
    try:
        wanted = [int(x) for x in args.shapes.split(",") if x]
    except ValueError:
        parser.error("--shapes: comma-separated shape ids")
    known = {s[0]: s for s in SHAPES}
    for sid in wanted:
        if sid not in known:
            parser.error(f"--shapes: no shape {sid} (1..{len(SHAPES)})")
    shapes = [known[sid] for sid in wanted]
    for i, spec in enumerate(args.shape):
        shape = custom_shape(spec, CUSTOM_FIRST_ID + i)
        if shape is None:
            parser.error(
                f"--shape {spec}: expected BATCHxQ_HEADS/KV_HEADSxLO..HIxHEAD_DIM[pPAGE|dense][cCAPACITY], "
                "e.g. 64x32/4x1..8192x256p8 or 4x32/8x1..2048x128p16c131072"
            )
        shapes.append(shape)
        wanted.append(shape[0])
    if args.page_size < 0:
        parser.error("--page-size: a positive number of tokens")
    if args.page_size > 0:  # the notes' own page sizes no longer hold
        notes = [re.sub(r"(^|, )pages of \d+( tokens?)?", "", s[8]) for s in shapes]
        shapes = [
            s[:5] + (args.page_size,) + s[6:8] + ((note + "; " if note else "") + f"--page-size {args.page_size}",)
            if s[5] > 0
            else s
            for s, note in zip(shapes, notes)
        ]
    if args.from_json:
        with open(args.from_json) as f:
            saved = json.load(f)
        rows = saved["results"]
        dtypes = [d for d in dtypes if any(r["dtype"] == d for r in rows)] or sorted({r["dtype"] for r in rows})
        # Shapes of your own (--shape, ids from CUSTOM_FIRST_ID) are kept: their specs are in the file.
        rows = [
            r
            for r in rows
            if r["dtype"] in dtypes and (r["shape_id"] in wanted or r["shape_id"] >= CUSTOM_FIRST_ID)
        ]
        for when, found in zip(("at the start", "at the end"), saved.get("ceilings", [])):
            print_ceilings(when, found)
        report(rows, dtypes, saved["read_ceiling_gbps"], args.plot)
        return 0
    if torch is None:
        parser.error("PyTorch is needed to run the comparison")
    if not args.lib:
        parser.error("--lib is needed")
    if args.replays < 1 or args.rounds < 1 or args.rotation_mib < 0:
        parser.error("--replays and --rounds must be positive, --rotation-mib not negative")

    fd = FlashDecode(args.lib)
    handle = fd.create_cuda_handle(torch.cuda.current_device())
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    print(f"flashdecode {fd.version}, torch {torch.__version__}, {props.name}, {props.multi_processor_count} SMs")
    bases = [
        (name, base_fd, base_fd.create_cuda_handle(torch.cuda.current_device()))
        for name, base_fd in base_libraries(args.base_lib)
    ]
    anchor = None if args.no_fi else FlashInfer(args.fi_dir)
    if anchor is not None and anchor.reason:
        print(f"FlashInfer rows n/a: {anchor.reason}")
    sweep, no_sweep = None, None
    try:
        sweep = ReadSweep()
        log(f"streaming-read kernels compiled with {sweep.nvrtc_path}")
    except Exception as error:
        no_sweep = str(error)[:200]
        log(f"no streaming-read kernel sweep (the ceiling is the torch read alone): {no_sweep}")
    log("read ceiling at the start")
    found = [ceilings(sweep, no_sweep)]
    print_ceilings("at the start", found[0])
    rows = []
    for dtype_name in dtypes:
        for shape in shapes:
            for order in args.length_orders:
                rows.extend(run_shape(fd, handle, anchor, shape, getattr(torch, dtype_name), args, bases, order))
            torch.cuda.empty_cache()  # the shape's pools, now unreferenced
    fd.lib.fd_destroy(handle)
    log("read ceiling at the end")
    found.append(ceilings(sweep, no_sweep))
    print_ceilings("at the end", found[1])
    ceiling = max(f["read"] for f in found)
    print(f"read ceiling used: {ceiling * 1e-9:.0f} GB/s (the higher of the two)")
    for row in rows:
        if "gbps" in row:
            row["pct_of_read"] = 100 * row["gbps"] * 1e9 / ceiling
    summary = report(rows, dtypes, ceiling * 1e-9, args.plot)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "read_ceiling_gbps": ceiling * 1e-9,
                    "copy_gbps": max(f["copy"] for f in found) * 1e-9,
                    "ceilings": found,
                    "device": props.name,
                    "torch": torch.__version__,
                    "flashdecode": fd.version,
                    "flashinfer": getattr(getattr(anchor, "fi", None), "__version__", None),
                    "flashinfer_reason": getattr(anchor, "reason", None) if anchor else "--no-fi",
                    "flashinfer_module_seconds": {str(k): v for k, v in (anchor.ready if anchor else {}).items()},
                    "args": vars(args),
                    "shapes": [
                        {"id": s[0], "label": shape_label(s), "ranges": s[6], "lengths_of": s[7], "note": s[8]}
                        for s in shapes
                    ],
                    "targets": summary,
                    "results": rows,
                },
                f,
                indent=1,
            )
    failed = [r for r in rows if r.get("ok") is False or r.get("graph_update_ok") is False]
    if failed:
        print(f"{len(failed)} row(s) failed their check: " + ", ".join(f"{r['label']} {r['impl']}" for r in failed))
        return 1
    log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
