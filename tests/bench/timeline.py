#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Where one call's time goes: per-CTA timestamps of a timeline build.

    cmake -S . -B build-timeline -DFLASHDECODE_TIMELINE=ON -DFLASHDECODE_TESTS=OFF \
        -DFLASHDECODE_CUDA_ARCHS=90a-real && cmake --build build-timeline --target flashdecode
    python3 tests/bench/timeline.py --lib build-timeline/src/libflashdecode.so.0 [--shapes 1,5,7] \
        [--dtype float16] [--kv 16bit|e4m3|e5m2|int8|e4m3-tok] [--q-len 1] [--replays 3] [--raw out.txt]
    python3 tests/bench/timeline.py --lib ... --shapes "" --serving-shape 16x16/2x1..32768x256p64

In a build with FLASHDECODE_TIMELINE=ON every CTA of the CUDA kernels prints
its %globaltimer at fixed points (src/backend/cuda/timeline.cuh). For each
shape of compare_sdpa.py this script builds the inputs as the benchmarks do
(K/V sets rotated through at least --rotation-mib), captures one CUDA graph
of one call per set, replays it, catches what the kernels print, and prints
per launch, in microseconds from the first CTA's start (--kv: the cache in
q's dtype, or 8-bit with compare_quantized.py's inputs, per-tensor scales
or per-token with -tok; --q-len: that many query tokens a sequence, causal,
on a 16-bit cache; --serving-shape: a ragged batch of compare_serving.py's
--shape syntax, its inputs as that script makes them, seed 0):

  first tile   median time from a CTA's wait for the previous grid to its
               first tile in shared memory
  streamed     when CTAs finished their last tile: first / median / last
  epilogue     median from the last tile to the partial or output stored
  merge        median duration of the fused merges (the CTAs that ran one)
  done         when the launch's last CTA exited

in microseconds from the first CTA past griddepcontrol.wait. The printing
slows each CTA's exit: the gaps between launches mean nothing, and neither
does anything in a launch of several waves of CTAs (shape 4, ragged shape 9),
where later CTAs wait for earlier ones' printing; single-wave launches
(shapes 1, 2, 5, 7, 8) read as in tests/bench/history/performance-history.md,
"Run 8". No timing here is a benchmark (compare_sdpa.py and ab_variants.py
are). A build without the option prints nothing, and the script says so.
"""
import argparse
import collections
import ctypes
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_quantized as cq  # noqa: E402
import compare_sdpa as cs  # noqa: E402
import compare_serving as cv  # noqa: E402
import torch  # noqa: E402


def capture_stdout(action):
    """Runs action() with the process's file descriptor 1 (where the CUDA
    printf buffer goes at each synchronisation) redirected to a file; returns
    what was written."""
    sys.stdout.flush()
    with tempfile.TemporaryFile(mode="w+") as sink:
        saved = os.dup(1)
        os.dup2(sink.fileno(), 1)
        try:
            action()
            torch.cuda.synchronize()
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
        sink.seek(0)
        return sink.read()


def parse(text):
    """FDTL lines into {(kernel, launch): [records]}, launches in start order."""
    launches = collections.defaultdict(list)
    for line in text.splitlines():
        fields = line.split()
        if len(fields) != 12 or fields[0] != "FDTL":
            continue
        kernel, launch = fields[1], fields[2]
        times = [int(x) for x in fields[5:11]]
        launches[(kernel, launch)].append({"sm": int(fields[4]), "t": times, "merged": fields[11] == "1"})
    return sorted(launches.items(), key=lambda item: min(r["t"][0] for r in item[1]))


def describe(kernel, records):
    # From the first CTA past griddepcontrol.wait: a programmatically launched
    # grid's CTAs start while the previous grid runs, and wait there.
    origin = min(r["t"][1] for r in records)

    def us(ns):
        return ns / 1000.0

    def spans(a, b, subset=None):
        rows = subset if subset is not None else records
        return [r["t"][b] - r["t"][a] for r in rows if r["t"][a] and r["t"][b]]

    parts = [f"{kernel:<9} {len(records):5d} CTAs on {len({r['sm'] for r in records}):3d} SMs"]
    first = spans(1, 2)
    if first:
        parts.append(f"first tile {us(statistics.median(first)):5.1f}")
    ends = sorted(r["t"][3] - origin for r in records if r["t"][3])
    if ends:
        parts.append(f"streamed {us(ends[0]):6.1f} / {us(statistics.median(ends)):6.1f} / {us(ends[-1]):6.1f}")
    epilogue = spans(3, 4)
    if epilogue:
        parts.append(f"epilogue {us(statistics.median(epilogue)):4.1f}")
    merges = spans(4, 5, [r for r in records if r["merged"]])
    if merges:
        parts.append(f"merge {us(statistics.median(merges)):4.1f} ({len(merges)})")
    parts.append(f"done {us(max(r['t'][5] for r in records) - origin):6.1f}")
    return " | ".join(parts)


def quantized_args(fd, shape, dtype, kv, rotation_bytes):
    """compare_quantized.py's inputs for an 8-bit cache and one fd_decode_args a set."""
    per_token = kv.endswith("-tok")
    fmt = kv.removesuffix("-tok")
    data = cq.make_inputs(shape, dtype, rotation_bytes)
    q8 = data["quant"][fmt, per_token]
    fd_args = []
    for i in range(data["sets"]):
        scales = cq.cache_scales(q8["k"][i], (q8["k_scale"][i], q8["v_scale"][i]), per_token, data["paged"])
        fd_args.append(
            cq.decode_args(fd, data["qs"][i], q8["k"][i], q8["v"][i], data["outs"][i], data["lens"], data["table"], scales)
        )
    return data, fd_args


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lib", required=True, help="libflashdecode.so.0 of a FLASHDECODE_TIMELINE=ON build")
    parser.add_argument("--shapes", default="1,5,7")
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--kv", default="16bit", help="16bit (q's dtype), e4m3, e5m2, int8, or e4m3-tok")
    parser.add_argument("--q-len", type=int, default=1, help="query tokens a sequence (16-bit caches; causal)")
    parser.add_argument("--replays", type=int, default=3, help="graph replays; the last one is shown")
    parser.add_argument("--rotation-mib", type=int, default=400)
    parser.add_argument("--raw", help="also write every FDTL line here")
    parser.add_argument("--serving-shape", action="append", default=[],
                        help="a ragged batch, compare_serving.py's --shape syntax (repeatable; 16-bit caches)")
    args = parser.parse_args()
    serving = [cv.custom_shape(spec, cv.CUSTOM_FIRST_ID + i) for i, spec in enumerate(args.serving_shape)]
    if None in serving or (serving and (args.kv != "16bit" or args.q_len != 1)):
        parser.error("--serving-shape: BATCHxQ_HEADS/KV_HEADSxLO..HIxHEAD_DIM[pPAGE|dense], 16-bit, q_len 1")

    fd = cs.FlashDecode(os.path.abspath(args.lib))
    handle = fd.create_cuda_handle(0)
    dtype = getattr(torch, args.dtype)
    raw = open(args.raw, "w") if args.raw else None
    for shape in [s for s in cs.SHAPES if str(s[0]) in args.shapes.split(",")] + serving:
        label = cs.shape_label(shape) if shape not in serving else cv.shape_label(shape)
        if shape in serving:
            data = cv.make_inputs(shape, dtype, args.rotation_mib << 20, seed=0)
            fd_args = cv.fd_args_per_set(fd, data)
        elif args.kv == "16bit":
            data = cs.make_inputs(shape, dtype, args.rotation_mib << 20, keep_dense=False)
            if args.q_len > 1:  # the default mask is causal: token i sees keys up to n - q_len + i
                data["qs"] = [torch.randn(q.shape[0], q.shape[1], args.q_len, q.shape[3], device="cuda", dtype=dtype)
                              for q in data["qs"]]
                data["outs"] = [torch.empty_like(q) for q in data["qs"]]
            fd_args = cs.decode_args_per_set(fd, data, shape)
        else:
            data, fd_args = quantized_args(fd, shape, dtype, args.kv, args.rotation_mib << 20)
        workspace = ctypes.c_size_t()
        fd.check(fd.lib.fd_workspace_size(handle, ctypes.byref(fd_args[0]), ctypes.byref(workspace)),
                 "fd_workspace_size")
        fd.check(fd.lib.fd_reserve_workspace(handle, workspace.value), "fd_reserve_workspace")

        def run():
            stream = torch.cuda.current_stream().cuda_stream
            for a in fd_args:
                fd.check(fd.lib.fd_decode(handle, ctypes.byref(a), ctypes.c_void_p(stream)), "fd_decode")

        capture_stdout(run)  # warm-up, eager
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            run()
        capture_stdout(lambda: None)  # whatever the capture left in the printf buffer
        for _ in range(args.replays):
            text = capture_stdout(graph.replay)
        launches = parse(text)
        if raw:
            raw.write(f"# shape {shape[0]}\n{text}")
        print(f"== {label} {args.dtype} {args.kv} q_len {args.q_len}: {data['sets']} calls in the graph (last replay)")
        if not launches:
            print("   no FDTL lines: is this a FLASHDECODE_TIMELINE=ON build?")
        for (kernel, _), records in launches:
            print("   " + describe(kernel, records))
        del graph, data
        torch.cuda.empty_cache()
    if raw:
        raw.close()
    fd.lib.fd_destroy(handle)


if __name__ == "__main__":
    main()
