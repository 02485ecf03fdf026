#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Times flashdecode's CUDA backend against PyTorch SDPA and the Triton split-K reference kernel.

    python3 tests/bench/compare_sdpa.py --lib build-h200/src/libflashdecode.so.0 \
        [--dtypes float16,bfloat16] [--shapes 1,2,...] [--json out.json] [--plot out.png]

Loads libflashdecode with ctypes (no binding needed) and, in the same process
on the same inputs, runs for each of the benchmark shapes (batch x
q_heads/kv_heads x kv_len x head_dim) and dtype: flashdecode, SDPA with the
cuDNN backend, SDPA with the FlashAttention backend (enable_gqa=True, so neither
expands K/V) and the Triton split-K reference kernel, labelled `seed` in the
tables, JSON and plot (../shared/seed/, copied to .seed/ for the device; it has
no GQA, so it gets K/V expanded to every query head: more bytes read, the same
useful bytes counted). Shape 9 is ragged: flashdecode gets the real
lengths, the anchors the dense max-length cache, and bandwidth counts the real
tokens only. Shape 10 is shape 2 through a paged cache (token-major pages
[page, slot, kv_head, dim] of 16 tokens, or --page-size; shuffled block table) for
flashdecode; shape 11 the same with head-major pages [page, kv_head, slot,
dim]; the anchors run the dense cache. Shape 12 (beyond shapes 1-11) is shape
9's lengths through shape 10's pages: a serving engine's decode batch.

Every output is checked against a float64 reference before timing (relative
L2 error; bound 2e-3 for fp16, 1e-2 for bf16). Method
(../shared/device/README.md): every implementation runs under CUDA graph
replay (one graph calls it once per KV set), KV sets rotated so their total is
well above the 60 MiB L2, CUDA events, the median over many replays divided by
the calls per replay, in --rounds rounds of every implementation, the order
reversed on odd rounds (the median of the rounds is reported: without them,
whichever ran first after the previous shape could be slowed, e.g. shape 8
by 10% after shape 7's reference kernel). Effective bandwidth counts the K and V bytes that must be
read once plus q and out; the percentages are of the streaming-read rate
measured in the same run.
"""
import argparse
import ctypes
import json
import math
import os
import statistics
import sys
import time

try:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
except ImportError:  # --from-json (tables and plot of an earlier run) needs no torch
    torch = None

# The C ABI as the Python binding declares it (one mirror of the header for
# the whole project); this script loads a given build itself, so that
# ab_variants.py can hold several builds in one process.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bindings", "python", "src"))
from flashdecode._library import FdDecodeArgs, FdOptions, FdPlanInfo, FdTensor, declare  # noqa: E402

FD_SUCCESS = 0
FD_BACKEND_CUDA = 2
FD_DTYPE_CODES = {"float32": 0, "float16": 1, "bfloat16": 2, "int32": 3}


class FlashDecode:
    """One build of libflashdecode, loaded from `path` with the binding's declarations."""

    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        declare(self.lib, path, require_all=False)  # builds before 0.2 have no fd_describe_plan
        self.version = self.lib.fd_version_string().decode()

    def plan(self, handle, args):
        """What fd_decode runs for args, e.g. "tensor-core-wide-128 16x2048 fused" ("" before 0.2)."""
        if not hasattr(self.lib, "fd_describe_plan"):
            return ""
        info = FdPlanInfo(struct_size=ctypes.sizeof(FdPlanInfo))
        self.check(self.lib.fd_describe_plan(handle, ctypes.byref(args), ctypes.byref(info)), "fd_describe_plan")
        merge = {0: "direct", 1: "separate", 2: "fused", 3: "cluster"}.get(info.merge, str(info.merge))
        return f"{info.kernel.decode()} {info.num_splits}x{info.split_tokens} {merge}"

    def check(self, status, what):
        if status != FD_SUCCESS:
            buffer = ctypes.create_string_buffer(512)
            self.lib.fd_last_error_message(buffer, 512)
            raise RuntimeError(f"{what} failed ({status}): {buffer.value.decode()}")

    def create_cuda_handle(self, device):
        options = FdOptions()
        self.lib.fd_options_init(ctypes.byref(options), ctypes.sizeof(options))
        options.backend = FD_BACKEND_CUDA
        options.device = device
        handle = ctypes.c_void_p()
        self.check(self.lib.fd_create(ctypes.byref(handle), ctypes.byref(options)), "fd_create")
        return handle


def base_libraries(specs):
    """--base-lib NAME=PATH (or PATH, named base) of the A/B scripts: a list of
    (row name "fd-NAME", FlashDecode) for other builds timed in the same process."""
    bases = []
    for spec in specs:
        name, _, path = spec.rpartition("=")
        bases.append(("fd-" + (name or "base"), FlashDecode(path)))
    return bases


def fd_tensor(t, order):
    """An fd_tensor over torch tensor t, its dimensions taken in `order`."""
    desc = FdTensor()
    desc.data = t.data_ptr()
    desc.dtype = FD_DTYPE_CODES[str(t.dtype).replace("torch.", "")]
    desc.ndim = len(order)
    for i, dim in enumerate(order):
        desc.shape[i] = t.shape[dim]
        desc.strides[i] = t.stride(dim)
    return desc


def make_paged(randn, gen, batch, kv_heads, kv_len, head_dim, sets, head_major):
    """Page pools of PAGE_SIZE tokens for `sets` KV sets, one block table
    (shuffled, or in order with --page-order in-order), and the dense
    [B, Hkv, N, D] caches they hold (for the anchors and the reference).
    Pools are token-major [pages, PAGE_SIZE, Hkv, D] (NHD, vLLM's layout) or
    head-major [pages, Hkv, PAGE_SIZE, D] (HND)."""
    pages = batch * kv_len // PAGE_SIZE
    pool_pages = pages * PAGE_POOL_FACTOR  # the table uses `pages` of them (all, by default)
    size = (pool_pages, kv_heads, PAGE_SIZE, head_dim) if head_major else (pool_pages, PAGE_SIZE, kv_heads, head_dim)
    pools_k = [randn(*size) for _ in range(sets)]
    pools_v = [randn(*size) for _ in range(sets)]
    perm = (torch.randperm(pool_pages, device="cuda", generator=gen)[:pages] if PAGE_ORDER == "shuffled"
            else torch.arange(pages, device="cuda")).to(torch.int32)
    table = perm.reshape(batch, kv_len // PAGE_SIZE).contiguous()

    def dense(pool):  # [B, Hkv, N, D] gathered through the block table
        paged = pool[table.long()]  # [B, pages of a sequence, ...]
        if head_major:
            return paged.permute(0, 2, 1, 3, 4).reshape(batch, kv_heads, kv_len, head_dim).contiguous()
        return paged.reshape(batch, kv_len, kv_heads, head_dim).permute(0, 2, 1, 3).contiguous()

    return pools_k, pools_v, table, [dense(p) for p in pools_k], [dense(p) for p in pools_v]


def decode_args(fd, q, k, v, out, seq_lens=None, block_table=None, head_major_pages=False):
    """q/out [B, Hq, 1, D] and dense k/v [B, Hkv, N, D] (SDPA's layout) as the
    API's [B, 1, Hq, D] and [B, N, Hkv, D]: the same memory, other strides.
    With block_table, k/v are page pools [pages, page_size, Hkv, D], or
    [pages, Hkv, page_size, D] with head_major_pages (HND)."""
    args = FdDecodeArgs()
    fd.lib.fd_decode_args_init(ctypes.byref(args), ctypes.sizeof(args))
    args.q = fd_tensor(q, (0, 2, 1, 3))
    args.out = fd_tensor(out, (0, 2, 1, 3))
    if block_table is None:
        args.k = fd_tensor(k, (0, 2, 1, 3))
        args.v = fd_tensor(v, (0, 2, 1, 3))
    else:
        order = (0, 2, 1, 3) if head_major_pages else (0, 1, 2, 3)
        args.k = fd_tensor(k, order)
        args.v = fd_tensor(v, order)
        args.block_table = fd_tensor(block_table, (0, 1))
    if seq_lens is not None:
        args.seq_lens = fd_tensor(seq_lens, (0,))
    return args


def time_graph(calls, replays):
    """Median seconds per call of calls() (which runs len(KV sets) calls)
    captured once in a CUDA graph and replayed."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            count = calls()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        count = calls()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(replays):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3 / count)
    del graph
    return statistics.median(times), min(times), max(times)


def bandwidth_ceilings():
    """Streaming read (a sum over 4 GiB) and device-to-device copy (bytes read
    + written) rates, timed eagerly: one launch each, long enough that launch
    cost does not matter. Each is run 10 times untimed first (an idle GPU
    starts at a low clock), then timed 15 times: the median. main() measures
    at the start and at the end of a run and keeps the higher rate."""
    x = torch.empty(1 << 30, dtype=torch.float32, device="cuda")
    x.fill_(1.0)
    y = torch.empty_like(x)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def median_seconds(op):
        for _ in range(10):
            op()
        times = []
        for _ in range(15):
            start.record()
            op()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e-3)
        return statistics.median(times)

    read = x.numel() * 4 / median_seconds(lambda: x.sum())
    copy = 2 * x.numel() * 4 / median_seconds(lambda: y.copy_(x))
    del x, y
    torch.cuda.empty_cache()
    return read, copy


# The benchmark shapes: (id, batch, q_heads, kv_heads, kv_len, head_dim, kind).
SHAPES = [
    (1, 1, 32, 8, 32768, 128, "dense"),
    (2, 32, 32, 8, 2048, 128, "dense"),
    (3, 8, 64, 8, 16384, 128, "dense"),
    (4, 256, 32, 32, 512, 128, "dense"),
    (5, 1, 32, 32, 2048, 128, "dense"),
    (6, 4, 16, 16, 65536, 64, "dense"),
    (7, 2, 8, 1, 262144, 128, "dense"),
    (8, 4, 8, 4, 16384, 256, "dense"),
    (9, 16, 32, 8, 16384, 128, "ragged"),
    (10, 32, 32, 8, 2048, 128, "paged"),
    (11, 32, 32, 8, 2048, 128, "paged-hnd"),
    # Beyond shapes 1-11: shape 9's lengths through shape 10's shuffled pages
    # (a serving engine's decode batch); the anchors read the dense cache.
    (12, 16, 32, 8, 16384, 128, "ragged-paged"),
]
PAGE_SIZE = 16  # tokens a page of shapes 10, 11 and 12; --page-size sets another
# How the block table orders the pages: "shuffled" (shapes 10-12) or "in-order"
# (the pool is then the dense cache, token-major: what the lookups alone cost).
PAGE_ORDER = "shuffled"
PAGE_ORDERS = ("shuffled", "in-order")
# Page pools this many times larger than the table uses (--page-pool): the
# shuffled table's pages are then scattered over more memory, as in a serving
# engine's pool shared by sequences of any length.
PAGE_POOL_FACTOR = 1


def set_page_size(tokens, parser):
    """--page-size: every paged shape's pages hold `tokens` tokens (it must
    divide the shapes' KV length)."""
    global PAGE_SIZE
    if tokens < 1 or 2048 % tokens != 0:
        parser.error(f"--page-size {tokens}: it must divide the paged shapes' 2048 tokens")  # and 12's 16384
    PAGE_SIZE = tokens


def set_page_order(order, pool_factor=1):
    """--page-order and --page-pool: shuffled or in-order block tables for the
    paged shapes, over pools pool_factor times the pages they use."""
    global PAGE_ORDER, PAGE_POOL_FACTOR
    PAGE_ORDER = order
    PAGE_POOL_FACTOR = max(1, pool_factor)


BOUNDS = {"float16": 2e-3, "bfloat16": 1e-2}


SHAPE_KINDS = ("dense", "ragged", "paged", "paged-hnd", "ragged-paged")


def parse_extra_shapes(spec, parser):
    """--extra's 'BxHq/HkvxNxD[:kind]' list (kind one of SHAPE_KINDS, dense
    by default) as shapes numbered from 101."""
    shapes = []
    for i, text in enumerate(x for x in spec.split(",") if x):
        sizes, _, kind = text.partition(":")
        kind = kind or "dense"
        try:
            batch, heads, kv_len, head_dim = sizes.split("x")
            q_heads, kv_heads = heads.split("/")
            shape = (101 + i, int(batch), int(q_heads), int(kv_heads), int(kv_len), int(head_dim), kind)
        except ValueError:
            parser.error(f"--extra: '{text}' is not BxHq/HkvxNxD[:kind]")
        if kind not in SHAPE_KINDS:
            parser.error(f"--extra: '{text}': kind must be one of {', '.join(SHAPE_KINDS)}")
        if min(shape[1:6]) < 1 or shape[2] % shape[3] != 0:
            parser.error(f"--extra: '{text}' needs positive sizes and Hq a multiple of Hkv")
        if "paged" in kind and shape[4] % PAGE_SIZE != 0:
            parser.error(f"--extra: '{text}': the KV length must be a multiple of the page size {PAGE_SIZE}")
        shapes.append(shape)
    return shapes


def shape_label(shape):
    sid, b, hq, hkv, n, d, kind = shape
    order = ("" if PAGE_ORDER == "shuffled" else f" {PAGE_ORDER}") + (
        f" pool x{PAGE_POOL_FACTOR}" if PAGE_POOL_FACTOR > 1 else "")
    extra = {"ragged": " ragged", "paged": f" paged{PAGE_SIZE}{order}",
             "paged-hnd": f" paged{PAGE_SIZE} HND{order}", "ragged-paged": f" ragged paged{PAGE_SIZE}{order}"}.get(kind, "")
    return f"{sid}: {b}x{hq}/{hkv}x{n}x{d}{extra}"


def reference(q, k, v, lens=None):
    """float64 attention; q [B, Hq, 1, D], k/v [B, Hkv, N, D]; lens masks."""
    b, hq, _, d = q.shape
    hkv, n = k.shape[1], k.shape[2]
    g = hq // hkv
    q64 = q.double().reshape(b, hkv, g, d)
    scores = torch.matmul(q64, k.double().transpose(-1, -2)) / math.sqrt(d)
    if lens is not None:
        mask = torch.arange(n, device=q.device)[None, :] >= lens.long()[:, None]
        scores.masked_fill_(mask[:, None, None, :], float("-inf"))
    out = torch.matmul(torch.softmax(scores, dim=-1), v.double())
    return out.reshape(b, hq, 1, d)


def rel_error(out, ref):
    diff = out.double() - ref
    return (diff.norm() / ref.norm()).item(), diff.abs().max().item()


def load_seed(path):
    if not path:
        return None
    sys.path.insert(0, path)
    try:
        from flash_decode_splitk import flash_decode_splitk  # noqa: E402
    except Exception as error:  # no Triton, or no reference kernel there
        print(f"Triton split-K reference kernel not loaded from {path}: {error}")
        return None
    return flash_decode_splitk


def make_inputs(shape, dtype, min_rotation_bytes, keep_dense=True, kv_row=None):
    """The inputs of one shape, seeded by its id, as a dict: "qs", and K/V in
    "sets" sets whose total is at least min_rotation_bytes (consecutive calls
    read different memory); "fd_ks"/"fd_vs", what flashdecode reads (the page
    pools when paged, sharing one shuffled "table"), "ks"/"vs", the dense
    caches the anchors read (dropped for a paged shape unless keep_dense),
    "lens" (ragged: per-sequence lengths, else None), "outs", and the float64
    references of set 0: "ref" for flashdecode (lengths applied), "ref_dense"
    for the anchors (None unless keep_dense). kv_row (dense shapes): K/V rows
    of that many elements, of which the first head_dim are used (a padded
    cache: other row addresses, the same bytes read)."""
    sid, batch, q_heads, kv_heads, kv_len, head_dim, kind = shape
    elem = torch.finfo(dtype).bits // 8
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1000 + sid)
    kv_set_bytes = 2 * batch * kv_heads * kv_len * head_dim * elem
    sets = max(2, math.ceil(min_rotation_bytes / kv_set_bytes))

    def randn(*size):
        return torch.randn(*size, device="cuda", dtype=dtype, generator=gen)

    data = {"sets": sets, "kv_set_bytes": kv_set_bytes, "lens": None, "table": None}
    data["qs"] = [randn(batch, q_heads, 1, head_dim) for _ in range(sets)]
    paged = "paged" in kind
    if paged:
        data["fd_ks"], data["fd_vs"], data["table"], data["ks"], data["vs"] = make_paged(
            randn, gen, batch, kv_heads, kv_len, head_dim, sets, kind == "paged-hnd")
    else:
        row = kv_row or head_dim
        data["ks"] = data["fd_ks"] = [randn(batch, kv_heads, kv_len, row)[..., :head_dim] for _ in range(sets)]
        data["vs"] = data["fd_vs"] = [randn(batch, kv_heads, kv_len, row)[..., :head_dim] for _ in range(sets)]
    if kind.startswith("ragged"):
        data["lens"] = torch.randint(1, kv_len + 1, (batch,), device="cuda", generator=gen, dtype=torch.int32)
    q0, k0, v0 = data["qs"][0], data["ks"][0], data["vs"][0]
    data["ref"] = reference(q0, k0, v0, data["lens"])
    data["ref_dense"] = None
    if keep_dense:
        data["ref_dense"] = reference(q0, k0, v0) if data["lens"] is not None else data["ref"]
    elif paged:
        data["ks"] = data["vs"] = None  # a second copy of every set: only the anchors read it
    data["outs"] = [torch.empty_like(q) for q in data["qs"]]
    return data


def decode_args_per_set(fd, data, shape):
    """One fd_decode_args per K/V set of make_inputs(), for library fd."""
    return [decode_args(fd, data["qs"][i], data["fd_ks"][i], data["fd_vs"][i], data["outs"][i],
                        seq_lens=data["lens"], block_table=data["table"], head_major_pages=shape[6] == "paged-hnd")
            for i in range(data["sets"])]


def flashdecode_calls(fd, handle, fd_args):
    """Reserves the handle's workspace for fd_args now (before any graph
    capture; a reservation only grows, so a handle shared by several
    argument lists keeps the largest) and returns a function that decodes
    every set on the current stream and returns how many it did."""
    workspace = ctypes.c_size_t()
    fd.check(fd.lib.fd_workspace_size(handle, ctypes.byref(fd_args[0]), ctypes.byref(workspace)), "fd_workspace_size")
    fd.check(fd.lib.fd_reserve_workspace(handle, workspace.value), "fd_reserve_workspace")

    def calls():
        stream = torch.cuda.current_stream().cuda_stream
        for a in fd_args:
            fd.check(fd.lib.fd_decode(handle, ctypes.byref(a), ctypes.c_void_p(stream)), "fd_decode")
        return len(fd_args)

    return calls


def first_set_error(calls, data):
    """Poisons every output of make_inputs() data, runs `calls` once and
    returns the relative error of set 0's output against data["ref"] (NaN
    when an element was not written)."""
    for out in data["outs"]:
        out.fill_(float("nan"))
    calls()
    torch.cuda.synchronize()
    return rel_error(data["outs"][0], data["ref"])[0]


def run_shape(fd, handle, shape, dtype, min_rotation_bytes, replays, rounds, seed):
    sid, batch, q_heads, kv_heads, kv_len, head_dim, kind = shape
    group = q_heads // kv_heads
    elem = torch.finfo(dtype).bits // 8
    data = make_inputs(shape, dtype, min_rotation_bytes)
    sets, kv_set_bytes = data["sets"], data["kv_set_bytes"]
    qs, ks, vs, outs, lens = data["qs"], data["ks"], data["vs"], data["outs"], data["lens"]

    real_tokens = int(lens.sum().item()) if lens is not None else batch * kv_len
    moved = 2 * kv_heads * head_dim * elem * real_tokens + 2 * batch * q_heads * head_dim * elem
    ref_dense, ref_fd = data["ref_dense"], data["ref"]
    fd_args = decode_args_per_set(fd, data, shape)
    fd_plan = fd.plan(handle, fd_args[0])
    implementations = [("flashdecode", flashdecode_calls(fd, handle, fd_args), lambda: outs[0], ref_fd)]
    for name, backend in (("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa-flash", SDPBackend.FLASH_ATTENTION)):
        holder = {}

        def sdpa_calls(backend=backend, holder=holder):
            with sdpa_kernel(backend):
                for i in range(sets):
                    o = F.scaled_dot_product_attention(qs[i], ks[i], vs[i], enable_gqa=True)
                    if i == 0:
                        holder["out"] = o
            return sets

        implementations.append((name, sdpa_calls, lambda holder=holder: holder["out"], ref_dense))
    seed_kv = None
    if seed is not None:
        holder = {}
        if head_dim in (16, 32, 64, 128):  # the reference kernel's head dims
            seed_kv = [(k.repeat_interleave(group, dim=1).contiguous() if group > 1 else k,
                        v.repeat_interleave(group, dim=1).contiguous() if group > 1 else v) for k, v in zip(ks, vs)]

        def seed_calls(holder=holder):
            if seed_kv is None:
                raise RuntimeError(f"head_dim {head_dim} unsupported by the Triton split-K reference kernel")
            for i in range(sets):
                o = seed(qs[i], seed_kv[i][0], seed_kv[i][1])
                if i == 0:
                    holder["out"] = o
            return sets

        implementations.append(("seed", seed_calls, lambda holder=holder: holder["out"], ref_dense))

    # Every output is checked first; then `rounds` rounds time every
    # implementation that passed, the order reversed on odd rounds, so that
    # no implementation always runs first after the inputs (or the previous
    # shape's slowest kernel) were made. A row's time is the median of its
    # round medians.
    results = []
    bound = BOUNDS[str(dtype).replace("torch.", "")]
    timed = []
    for name, calls, first_out, ref in implementations:
        row = {"impl": name, "shape_id": sid, "shape": [batch, q_heads, kv_heads, kv_len, head_dim], "kind": kind,
               "label": shape_label(shape), "dtype": str(dtype).replace("torch.", ""), "kv_sets": sets,
               "kv_mib": kv_set_bytes / 2**20, "real_tokens": real_tokens, "bytes": moved}
        if name == "seed" and group > 1:
            row["kv_expanded"] = group  # the reference kernel has no GQA: it reads K/V repeated per query head
        if name == "flashdecode" and fd_plan:
            row["plan"] = fd_plan
        try:
            calls()  # once, eagerly: the output is checked before timing
            torch.cuda.synchronize()
            rel, max_abs = rel_error(first_out(), ref)
            row.update(rel_err=rel, max_abs_err=max_abs, ok=bool(rel <= bound))
            timed.append((row, calls))
        except Exception as error:  # an SDPA backend may refuse a shape
            row["error"] = str(error).splitlines()[0][:120] if str(error) else type(error).__name__
        results.append(row)
    for r in range(rounds):
        for row, calls in (timed if r % 2 == 0 else timed[::-1]):
            median, fastest, slowest = time_graph(calls, replays)
            torch.cuda.synchronize()
            row.setdefault("us_rounds", []).append(median * 1e6)
            row["us_min"] = min(row.get("us_min", math.inf), fastest * 1e6)
            row["us_max"] = max(row.get("us_max", 0.0), slowest * 1e6)
    for row, _ in timed:
        row["us"] = statistics.median(row["us_rounds"])
        row["gbps"] = moved / row["us"] * 1e-3
    del data, qs, ks, vs, outs, seed_kv, implementations
    torch.cuda.empty_cache()
    return results


def summarise(rows, shapes, dtypes):
    """Per shape and dtype: flashdecode vs the best anchor that passed its check."""
    table = []
    for dtype in dtypes:
        ratios = []
        for shape in shapes:
            here = [r for r in rows if r["shape_id"] == shape[0] and r["dtype"] == dtype and "us" in r]
            fd = next((r for r in here if r["impl"] == "flashdecode"), None)
            anchors = [r for r in here if r["impl"] != "flashdecode" and r.get("ok")]
            if fd is None or not anchors:
                continue
            best = min(anchors, key=lambda r: r["us"])
            ratio = best["us"] / fd["us"]
            fd["best_anchor"] = best["impl"]
            fd["speedup_vs_best_anchor"] = ratio
            if shape[0] <= 8:
                ratios.append(ratio)
            table.append((dtype, shape, fd, best, ratio))
        if ratios:
            geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
            table.append((dtype, None, None, None, geo))
    return table


def plot(path, rows, shapes, dtypes, impls):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(dtypes), 1, figsize=(14, 4.2 * len(dtypes)), squeeze=False)
    width = 0.8 / len(impls)
    for ax, dtype in zip(axes[:, 0], dtypes):
        top = 100.0
        for j, impl in enumerate(impls):
            xs, ys = [], []
            for i, shape in enumerate(shapes):
                r = next((r for r in rows if r["shape_id"] == shape[0] and r["dtype"] == dtype and r["impl"] == impl
                          and "pct_of_read" in r), None)
                if r is not None:
                    xs.append(i + (j - (len(impls) - 1) / 2) * width)
                    ys.append(r["pct_of_read"])
            label = "seed (Triton split-K reference, K/V expanded for GQA)" if impl == "seed" else impl
            ax.bar(xs, ys, width, label=label)
            top = max([top] + ys)
        ax.axhline(90, color="gray", linestyle="--", linewidth=0.8)
        ax.set_xticks(range(len(shapes)))
        ax.set_xticklabels([shape_label(s) for s in shapes], rotation=20, ha="right", fontsize=8)
        ax.set_ylabel("% of streaming-read ceiling")
        ax.grid(axis="y", linewidth=0.3)
        ax.set_title(f"decode attention on the H200, {dtype} (median under CUDA graph replay, KV rotated)")
        ax.set_ylim(0, top * 1.08)
        ax.legend(fontsize=8, ncol=len(impls))
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def report(all_rows, shapes, dtypes, plot_path):
    """The results table, flashdecode against the best anchor, and the plot."""
    print("=== results (median under CUDA graph replay, KV rotated; GB/s over the bytes that must move)")
    print(f"{'shape B x Hq/Hkv x N x D':<34} {'dtype':<8} {'KV MiB':>7} {'impl':<13} {'us':>9} {'GB/s':>6} {'%read':>6} "
          f"{'rel err':>8}")
    for r in all_rows:
        head = f"{r['label']:<34} {r['dtype']:<8} {r['kv_mib']:>7.0f} {r['impl']:<13}"
        if "error" in r:
            print(f"{head} n/a: {r['error']}")
        else:
            flag = "" if r["ok"] else " CHECK FAILED"
            plan = f"  [{r['plan']}]" if "plan" in r else ""
            print(f"{head} {r['us']:>9.1f} {r['gbps']:>6.0f} {r['pct_of_read']:>6.1f} {r['rel_err']:>8.1e}{flag}{plan}")
    summary = summarise(all_rows, shapes, dtypes)
    print("=== flashdecode vs the best anchor (best anchor time / flashdecode time; > 1: flashdecode faster)")
    for dtype, shape, fd_row, best, ratio in summary:
        if shape is None:
            print(f"{dtype:<8} geometric mean over shapes 1-8: {ratio:.2f}")
        else:
            print(f"{dtype:<8} {shape_label(shape):<34} flashdecode {fd_row['us']:>8.1f} us {fd_row['pct_of_read']:>5.1f}%  "
                  f"best {best['impl']:<13} {best['us']:>8.1f} us  ratio {ratio:.2f}")
    if plot_path:
        impls = []
        for r in all_rows:
            if r["impl"] not in impls:
                impls.append(r["impl"])
        try:
            plot(plot_path, all_rows, shapes, dtypes, impls)
        except Exception as error:
            print(f"plot failed: {error}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lib", required=True, help="path of libflashdecode.so.0")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--plot", help="write a PNG of %% of the read ceiling per shape and implementation here")
    parser.add_argument("--dtypes", default="float16,bfloat16", help="comma-separated: float16, bfloat16")
    parser.add_argument("--shapes", default="1,2,3,4,5,6,7,8,9,10,11,12",
                        help="comma-separated shape ids: the benchmark shapes 1..11, and 12 (ragged and paged)")
    parser.add_argument("--extra", default="",
                        help="more shapes, 'BxHq/HkvxNxD[:kind]' comma-separated, kind dense (default), ragged, "
                             "paged, paged-hnd or ragged-paged (ids 101, 102, ...; "
                             "'--shapes \"\"' runs only these)")
    parser.add_argument("--page-size", type=int, default=PAGE_SIZE, help="tokens a page of the paged shapes 10, 11, 12")
    parser.add_argument("--page-order", choices=PAGE_ORDERS, default=PAGE_ORDER,
                        help="block table of the paged shapes: shuffled pages, or in order")
    parser.add_argument("--page-pool", type=int, default=1,
                        help="page pools this many times the pages the table uses (shuffled: scattered over all)")
    parser.add_argument("--replays", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3, help="timing rounds, order alternating (median of rounds)")
    parser.add_argument("--rotation-mib", type=int, default=1024, help="KV bytes rotated through, at least")
    default_seed = os.path.join(os.path.dirname(__file__), "..", "..", ".seed")
    parser.add_argument("--seed-dir", default=default_seed,
                        help="folder of flash_decode_splitk.py, the Triton split-K reference kernel "
                             "(labelled `seed` in the results; '' to skip)")
    parser.add_argument("--from-json", help="print the tables and draw the plot of an earlier run's JSON; run nothing")
    args = parser.parse_args()
    dtypes = [d for d in args.dtypes.split(",") if d]
    set_page_size(args.page_size, parser)
    set_page_order(args.page_order, args.page_pool)
    wanted = {int(x) for x in args.shapes.split(",") if x}
    shapes = [s for s in SHAPES if s[0] in wanted] + parse_extra_shapes(args.extra, parser)
    if args.from_json:
        with open(args.from_json) as f:
            saved = json.load(f)
        rows = saved["results"]
        for r in rows:  # older runs named the reference kernel with expanded K/V apart
            if r["impl"].startswith("seed"):
                r["impl"] = "seed"
        dtypes = [d for d in dtypes if any(r["dtype"] == d for r in rows)]
        known = {shape[0] for shape in shapes}
        for r in rows:  # --extra shapes of that run: their sizes are in the rows
            if r["shape_id"] > 100 and r["shape_id"] not in known:
                known.add(r["shape_id"])
                shapes.append((r["shape_id"], *r["shape"], r["kind"]))
        print(f"ceilings: streaming read {saved['read_ceiling_gbps']:.0f} GB/s, device-to-device copy "
              f"{saved['copy_gbps']:.0f} GB/s (read + written)")
        report(rows, shapes, dtypes, args.plot)
        return 0
    if torch is None:
        parser.error("PyTorch is needed to run the comparison")

    fd = FlashDecode(args.lib)
    handle = fd.create_cuda_handle(torch.cuda.current_device())
    props = torch.cuda.get_device_properties(0)
    seed = load_seed(args.seed_dir)
    ceilings = [bandwidth_ceilings()]
    print(f"flashdecode {fd.version}, torch {torch.__version__}, {props.name}, {props.multi_processor_count} SMs")
    print(f"ceilings at the start: streaming read {ceilings[0][0] * 1e-9:.0f} GB/s, device-to-device copy "
          f"{ceilings[0][1] * 1e-9:.0f} GB/s (read + written)")
    all_rows = []
    started = time.monotonic()
    for dtype_name in dtypes:
        for shape in shapes:
            rows = run_shape(fd, handle, shape, getattr(torch, dtype_name), args.rotation_mib << 20, args.replays,
                             args.rounds, seed)
            all_rows.extend(rows)
            # Progress as it goes: a run cut short by a time limit still shows its shapes.
            times = ", ".join(f"{r['impl']} {r['us']:.1f}" if "us" in r else f"{r['impl']} n/a" for r in rows)
            print(f"[{time.monotonic() - started:5.0f} s] {shape_label(shape)} {dtype_name}: {times} us", flush=True)
    fd.lib.fd_destroy(handle)
    # The ceilings again, with the GPU as warm as the timings had it; the
    # higher of the two measurements is the ceiling every % is taken of.
    ceilings.append(bandwidth_ceilings())
    ceiling = max(read for read, _ in ceilings)
    copy = max(c for _, c in ceilings)
    print(f"ceilings at the end: streaming read {ceilings[1][0] * 1e-9:.0f} GB/s, device-to-device copy "
          f"{ceilings[1][1] * 1e-9:.0f} GB/s; used: {ceiling * 1e-9:.0f} and {copy * 1e-9:.0f} GB/s")
    for row in all_rows:
        if "gbps" in row:
            row["pct_of_read"] = 100 * row["gbps"] * 1e9 / ceiling

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"read_ceiling_gbps": ceiling * 1e-9, "copy_gbps": copy * 1e-9,
                       "read_ceiling_runs_gbps": [read * 1e-9 for read, _ in ceilings],
                       "copy_runs_gbps": [c * 1e-9 for _, c in ceilings], "device": props.name,
                       "torch": torch.__version__, "flashdecode": fd.version, "results": all_rows}, f, indent=1)
    report(all_rows, shapes, dtypes, args.plot)
    failed = [r for r in all_rows if r["impl"] == "flashdecode" and not r.get("ok")]
    if failed:
        print(f"flashdecode failed its check on {len(failed)} case(s)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
