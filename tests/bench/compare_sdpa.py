#!/usr/bin/env python3
"""Times flashdecode's CUDA backend against PyTorch's SDPA on decode shapes.

    python3 tests/bench/compare_sdpa.py --lib build-h200/src/libflashdecode.so.0 [--json out.json]

Loads libflashdecode with ctypes (no binding needed) and, for each shape
(batch x q_heads/kv_heads x kv_len x head_dim, fp16 by default), times:
flashdecode, SDPA with the cuDNN backend and SDPA with the FlashAttention
backend (enable_gqa=True, so neither expands K/V).

Method (tests/../shared/device/README.md): every implementation runs under
CUDA graph replay (one graph calls it once per KV set), KV sets rotated so
their total is well above the 60 MiB L2, CUDA events, the median over many
replays divided by the calls per replay. Effective bandwidth counts K and V
once plus q and out; the percentages are of the streaming-read rate measured
in the same run (the device-to-device copy rate is printed beside it).
"""
import argparse
import ctypes
import json
import math
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# ---- ctypes mirror of include/flashdecode.h (ABI major 0) ---------------------
FD_SUCCESS = 0
FD_BACKEND_CUDA = 2
FD_DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, torch.int32: 3}


class FdTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int),
        ("ndim", ctypes.c_int32),
        ("shape", ctypes.c_int64 * 4),
        ("strides", ctypes.c_int64 * 4),
    ]


class FdOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("backend", ctypes.c_int),
        ("device", ctypes.c_int32),
        ("num_threads", ctypes.c_int32),
    ]


class FdDecodeArgs(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("q", FdTensor),
        ("k", FdTensor),
        ("v", FdTensor),
        ("out", FdTensor),
        ("lse", FdTensor),
        ("seq_lens", FdTensor),
        ("block_table", FdTensor),
        ("softmax_scale", ctypes.c_double),
        ("num_splits", ctypes.c_int32),
    ]


class FlashDecode:
    """The few entry points this script needs, with argtypes and restypes."""

    def __init__(self, path):
        lib = ctypes.CDLL(path)
        lib.fd_version_string.restype = ctypes.c_char_p
        lib.fd_options_init.argtypes = [ctypes.POINTER(FdOptions)]
        lib.fd_create.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(FdOptions)]
        lib.fd_destroy.argtypes = [ctypes.c_void_p]
        lib.fd_decode_args_init.argtypes = [ctypes.POINTER(FdDecodeArgs)]
        lib.fd_decode.argtypes = [ctypes.c_void_p, ctypes.POINTER(FdDecodeArgs), ctypes.c_void_p]
        lib.fd_workspace_size.argtypes = [ctypes.c_void_p, ctypes.POINTER(FdDecodeArgs), ctypes.POINTER(ctypes.c_size_t)]
        lib.fd_reserve_workspace.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        lib.fd_last_error_message.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        lib.fd_last_error_message.restype = ctypes.c_size_t
        for name in ("fd_create", "fd_destroy", "fd_decode", "fd_workspace_size", "fd_reserve_workspace"):
            getattr(lib, name).restype = ctypes.c_int
        self.lib = lib
        self.version = lib.fd_version_string().decode()

    def check(self, status, what):
        if status != FD_SUCCESS:
            buffer = ctypes.create_string_buffer(512)
            self.lib.fd_last_error_message(buffer, 512)
            raise RuntimeError(f"{what} failed ({status}): {buffer.value.decode()}")

    def create_cuda_handle(self, device):
        options = FdOptions()
        self.lib.fd_options_init(ctypes.byref(options))
        options.backend = FD_BACKEND_CUDA
        options.device = device
        handle = ctypes.c_void_p()
        self.check(self.lib.fd_create(ctypes.byref(handle), ctypes.byref(options)), "fd_create")
        return handle


def fd_tensor(t, order):
    """An fd_tensor over torch tensor t, its dimensions taken in `order`."""
    desc = FdTensor()
    desc.data = t.data_ptr()
    desc.dtype = FD_DTYPES[t.dtype]
    desc.ndim = len(order)
    for i, dim in enumerate(order):
        desc.shape[i] = t.shape[dim]
        desc.strides[i] = t.stride(dim)
    return desc


def decode_args(fd, q, k, v, out):
    """q/out [B, Hq, 1, D] and k/v [B, Hkv, N, D] (SDPA's layout) as the API's
    [B, 1, Hq, D] and [B, N, Hkv, D]: the same memory, other strides."""
    args = FdDecodeArgs()
    fd.lib.fd_decode_args_init(ctypes.byref(args))
    args.q = fd_tensor(q, (0, 2, 1, 3))
    args.out = fd_tensor(out, (0, 2, 1, 3))
    args.k = fd_tensor(k, (0, 2, 1, 3))
    args.v = fd_tensor(v, (0, 2, 1, 3))
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
    return statistics.median(times)


def bandwidth_ceilings():
    """Streaming read (a sum over 4 GiB) and device-to-device copy (bytes read
    + written) rates, timed eagerly: one launch each, long enough that launch
    cost does not matter."""
    x = torch.empty(1 << 30, dtype=torch.float32, device="cuda")
    x.fill_(1.0)
    y = torch.empty_like(x)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def median_seconds(op):
        op()
        times = []
        for _ in range(9):
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


def run_shape(fd, handle, shape, dtype, min_rotation_bytes, replays):
    batch, q_heads, kv_heads, kv_len, head_dim = shape
    torch.manual_seed(0)
    kv_set_bytes = 2 * batch * kv_heads * kv_len * head_dim * torch.finfo(dtype).bits // 8
    sets = max(2, math.ceil(min_rotation_bytes / kv_set_bytes))
    qs = [torch.randn(batch, q_heads, 1, head_dim, device="cuda", dtype=dtype) for _ in range(sets)]
    ks = [torch.randn(batch, kv_heads, kv_len, head_dim, device="cuda", dtype=dtype) for _ in range(sets)]
    vs = [torch.randn(batch, kv_heads, kv_len, head_dim, device="cuda", dtype=dtype) for _ in range(sets)]
    outs = [torch.empty_like(q) for q in qs]
    io_bytes = 2 * batch * q_heads * head_dim * torch.finfo(dtype).bits // 8
    moved = kv_set_bytes + io_bytes

    # Reference for set 0: float32 math.
    ref = F.scaled_dot_product_attention(
        qs[0].float(), ks[0].float(), vs[0].float(), enable_gqa=True
    )
    results = []

    fd_args = [decode_args(fd, qs[i], ks[i], vs[i], outs[i]) for i in range(sets)]
    workspace = ctypes.c_size_t()
    fd.check(fd.lib.fd_workspace_size(handle, ctypes.byref(fd_args[0]), ctypes.byref(workspace)), "fd_workspace_size")
    fd.check(fd.lib.fd_reserve_workspace(handle, workspace.value), "fd_reserve_workspace")

    def flashdecode_calls():
        stream = torch.cuda.current_stream().cuda_stream
        for a in fd_args:
            fd.check(fd.lib.fd_decode(handle, ctypes.byref(a), ctypes.c_void_p(stream)), "fd_decode")
        return sets

    implementations = [("flashdecode", flashdecode_calls, lambda: outs[0])]
    for name, backend in (("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa-flash", SDPBackend.FLASH_ATTENTION)):
        holder = {}

        def sdpa_calls(backend=backend, holder=holder):
            with sdpa_kernel(backend):
                for i in range(sets):
                    o = F.scaled_dot_product_attention(qs[i], ks[i], vs[i], enable_gqa=True)
                    if i == 0:
                        holder["out"] = o
            return sets

        implementations.append((name, sdpa_calls, lambda holder=holder: holder["out"]))

    for name, calls, first_out in implementations:
        row = {"impl": name, "shape": list(shape), "dtype": str(dtype).replace("torch.", ""), "kv_sets": sets}
        try:
            seconds = time_graph(calls, replays)
            torch.cuda.synchronize()
            row.update(
                us=seconds * 1e6,
                gbps=moved / seconds * 1e-9,
                max_abs_err=(first_out().float() - ref).abs().max().item(),
            )
        except Exception as error:  # an SDPA backend may refuse a shape
            row["error"] = str(error).splitlines()[0][:120]
        results.append(row)
    del qs, ks, vs, outs
    torch.cuda.empty_cache()
    return results, kv_set_bytes


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lib", required=True, help="path of libflashdecode.so.0")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    parser.add_argument("--replays", type=int, default=30)
    parser.add_argument("--rotation-mib", type=int, default=1024, help="KV bytes rotated through, at least")
    parser.add_argument(
        "--shapes",
        default="1x32/8x32768x128,32x32/8x2048x128,8x64/8x16384x128,4x32/32x8192x128",
        help="comma-separated BATCHxQHEADS/KVHEADSxKVLENxHEADDIM",
    )
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    shapes = []
    for text in args.shapes.split(","):
        b, heads, n, d = text.split("x")
        hq, hkv = heads.split("/")
        shapes.append((int(b), int(hq), int(hkv), int(n), int(d)))

    fd = FlashDecode(args.lib)
    handle = fd.create_cuda_handle(torch.cuda.current_device())
    props = torch.cuda.get_device_properties(0)
    ceiling, copy = bandwidth_ceilings()
    print(f"flashdecode {fd.version}, torch {torch.__version__}, {props.name}, {props.multi_processor_count} SMs")
    print(f"ceilings: streaming read {ceiling * 1e-9:.0f} GB/s, device-to-device copy {copy * 1e-9:.0f} GB/s (read + written)")
    all_rows = []
    for shape in shapes:
        rows, kv_bytes = run_shape(fd, handle, shape, dtype, args.rotation_mib << 20, args.replays)
        for row in rows:
            row["kv_mib"] = kv_bytes / 2**20
            if "gbps" in row:
                row["pct_of_read"] = 100 * row["gbps"] * 1e9 / ceiling
        all_rows.extend(rows)
    fd.lib.fd_destroy(handle)

    print("=== results (median under CUDA graph replay, KV rotated)")
    print(f"{'shape B x Hq/Hkv x N x D':<26} {'KV MiB':>7} {'impl':<12} {'us':>9} {'GB/s':>7} {'%read':>6} {'max|err|':>9}")
    for r in all_rows:
        b, hq, hkv, n, d = r["shape"]
        label = f"{b}x{hq}/{hkv}x{n}x{d} {r['dtype']}"
        if "error" in r:
            print(f"{label:<26} {r['kv_mib']:>7.0f} {r['impl']:<12} n/a: {r['error']}")
        else:
            print(
                f"{label:<26} {r['kv_mib']:>7.0f} {r['impl']:<12} {r['us']:>9.1f} {r['gbps']:>7.0f} "
                f"{r['pct_of_read']:>6.1f} {r['max_abs_err']:>9.2g}"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"read_ceiling_gbps": ceiling * 1e-9, "copy_gbps": copy * 1e-9, "results": all_rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
