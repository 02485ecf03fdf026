#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Side-by-side timing of several builds of flashdecode (and forced split
counts) on the same inputs, in one process, rounds in alternating order.

    python3 tests/bench/ab_variants.py --lib dev=build-dev/src/libflashdecode.so.0 \
        --lib var1=build-var1/src/libflashdecode.so.0 [--shapes 1,3,5] [--dtypes float16] \
        [--extra 64x32/8x4096x128] [--kv-row 128] [--splits "5:4,16;1:64"] [--plans] [--rounds 3] [--replays 60]

tests/tools/build-variant.sh builds a variant (a git ref, the working tree,
extra CUDA flags) into ab/NAME/. Every library is loaded from its own path
(its CUDA runtime is static and hidden, so the copies do not clash). For
each shape of compare_sdpa.py the
inputs are built once, every variant's output is checked against the float64
reference, then each round times every variant under CUDA graph replay (KV sets
rotated, median of the replays), the order reversed on odd rounds. --splits
adds variants of the first library with num_splits forced for a shape
("shape:n,n;shape:n"); --split-tokens adds variants of every library in
batch-invariant mode (fd_decode_args.split_tokens; libraries of 0.3 and
later) on every shape ("n,n"). Prints one line per shape: each variant's per-round medians
in microseconds.
"""
import argparse
import ctypes
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_sdpa as cs  # noqa: E402
import torch  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lib", action="append", required=True, help="NAME=path of libflashdecode.so.0")
    parser.add_argument("--shapes", default="1,3,4,5,7,8,10")
    parser.add_argument("--extra", default="", help="more shapes, 'BxHq/HkvxNxD[:kind]' comma-separated (ids 101, ...)")
    parser.add_argument("--page-size", type=int, default=cs.PAGE_SIZE, help="tokens a page of the paged shapes 10, 11, 12")
    parser.add_argument("--page-order", choices=cs.PAGE_ORDERS, default=cs.PAGE_ORDER,
                        help="block table of the paged shapes: shuffled pages, or in order")
    parser.add_argument("--page-pool", type=int, default=1,
                        help="page pools this many times the pages the table uses (shuffled: scattered over all)")
    parser.add_argument("--kv-row", type=int, default=0,
                        help="dense K/V rows of this many elements, the first head_dim used (padded rows)")
    parser.add_argument("--dtypes", default="float16")
    parser.add_argument("--splits", default="", help="forced split counts on the first library: 'shape:n,n;shape:n'")
    parser.add_argument("--split-tokens", default="",
                        help="batch-invariant variants of every library, split lengths 'n,n' on every shape")
    parser.add_argument("--plans", action="store_true",
                        help="print each variant's plan (kernel, splits x tokens, merge; builds from 0.2 on)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--replays", type=int, default=60)
    parser.add_argument("--rotation-mib", type=int, default=1024)
    args = parser.parse_args()
    cs.set_page_size(args.page_size, parser)
    cs.set_page_order(args.page_order, args.page_pool)

    libs = []
    for spec in args.lib:
        name, path = spec.split("=", 1)
        fd = cs.FlashDecode(os.path.abspath(path))
        libs.append((name, fd, fd.create_cuda_handle(0)))
    addresses = {ctypes.cast(fd.lib.fd_decode, ctypes.c_void_p).value for _, fd, _ in libs}
    if len(addresses) != len(libs):
        sys.exit("libraries share code: give each variant its own path")
    forced = {}
    for part in filter(None, args.splits.split(";")):
        sid, counts = part.split(":")
        forced[int(sid)] = [int(c) for c in counts.split(",")]
    fixed_lengths = [int(n) for n in filter(None, args.split_tokens.split(","))]

    shapes = [s for s in cs.SHAPES if str(s[0]) in args.shapes.split(",")] + cs.parse_extra_shapes(args.extra, parser)
    torch.backends.cuda.matmul.allow_tf32 = False
    print(f"{'shape':<30} {'dtype':<8} " + "variant: per-round medians (us)")
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        bound = cs.BOUNDS[dtype_name]
        for shape in shapes:
            if args.kv_row and (shape[6] != "dense" or args.kv_row < shape[5]):
                sys.exit(f"--kv-row {args.kv_row}: for dense shapes with head_dim <= it, not {cs.shape_label(shape)}")
            data = cs.make_inputs(shape, dtype, args.rotation_mib << 20, keep_dense=False, kv_row=args.kv_row or None)
            variants = [(name, fd, handle, 0, 0) for name, fd, handle in libs]
            base_name, base_fd, base_handle = libs[0]
            variants += [(f"{base_name}/s{n}", base_fd, base_handle, n, 0) for n in forced.get(shape[0], [])]
            variants += [(f"{name}/t{n}", fd, handle, 0, n) for name, fd, handle in libs for n in fixed_lengths
                         if fd.lib.fd_version_number() >= 300]  # split_tokens: 0.3 and later
            calls = []
            for name, fd, handle, splits, split_tokens in variants:
                fd_args = cs.decode_args_per_set(fd, data, shape)
                for a in fd_args:
                    a.num_splits = splits
                    a.split_tokens = split_tokens

                # A handle shared by forced-split variants keeps the largest workspace.
                run = cs.flashdecode_calls(fd, handle, fd_args)
                rel = cs.first_set_error(run, data)
                ok = rel <= bound and not math.isnan(rel)
                plan = fd.plan(handle, fd_args[0]) if args.plans else ""
                calls.append((name, run, rel, ok, plan))
            times = {name: [] for name, _, _, _, _ in calls}
            for r in range(args.rounds):
                order = calls if r % 2 == 0 else calls[::-1]
                for name, run, _, ok, _ in order:
                    if ok:
                        times[name].append(cs.time_graph(run, args.replays)[0] * 1e6)
            cells = []
            for name, _, rel, ok, plan in calls:
                plan = f" [{plan}]" if plan else ""
                if not ok:
                    cells.append(f"{name}{plan}: CHECK FAILED ({rel:.1e})")
                else:
                    t = times[name]
                    cells.append(f"{name}{plan}: " + "/".join(f"{x:.1f}" for x in t) +
                                 f" (med {statistics.median(t):.1f})")
            print(f"{cs.shape_label(shape):<30} {dtype_name:<8} " + " | ".join(cells), flush=True)
            del data, calls
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
