#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Times one build of flashdecode on the same K/V values stored in several
layouts, to tell the memory system's response to row addresses from the
kernel's work (run on the GPU machine, where PyTorch is):

    python3 tests/bench/kv_layouts.py --lib build/src/libflashdecode.so.0 \\
        --extra 8x32/32x4096x96,8x32/32x4096x128 [--rows 104,112,128,192] [--head-gaps 8,64]

For each dense shape (compare_sdpa.py's --extra syntax) the inputs are built
once (KV sets rotated past L2, as in compare_sdpa.py) and copied into:
  bhsd       [batch, kv_head, token, d], K sets then V sets (compare_sdpa's);
  bhsd-kv    the same, each set's K and V in one allocation;
  bshd       token-major, [batch, token, kv_head, d];
  rows of N  bhsd with rows of N elements, the first head_dim used (a padded
             cache: the same bytes read at other addresses; --rows, each
             >= head_dim and a multiple of 8);
  head gap G bhsd with G unused tokens after each head's rows (the heads
             further apart, the rows as they are; --head-gaps).
Each output is checked against the float64 reference, then timed under CUDA
graph replay, 3 rounds of --replays; prints µs per round and GB/s over the
K/V bytes.
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_sdpa as cs  # noqa: E402
import torch  # noqa: E402


def padded(t, row):
    storage = torch.empty(tuple(t.shape[:-1]) + (row,), device="cuda", dtype=t.dtype)
    storage[..., :t.shape[-1]].copy_(t)
    return storage[..., :t.shape[-1]]


def head_gapped(t, gap):
    batch, heads, tokens, d = t.shape
    storage = torch.empty((batch, heads, tokens + gap, d), device="cuda", dtype=t.dtype)
    storage[:, :, :tokens].copy_(t)
    return storage[:, :, :tokens]


def layouts(ks, vs, rows, gaps):
    yield "bhsd", ks, vs
    pairs = [torch.empty((2,) + tuple(k.shape), device="cuda", dtype=k.dtype) for k in ks]
    for pair, k, v in zip(pairs, ks, vs):
        pair[0].copy_(k)
        pair[1].copy_(v)
    yield "bhsd-kv", [p[0] for p in pairs], [p[1] for p in pairs]
    del pairs
    token_major = [[t.transpose(1, 2).contiguous().transpose(1, 2) for t in ts] for ts in (ks, vs)]
    yield "bshd", token_major[0], token_major[1]
    del token_major
    for row in rows:
        if row >= ks[0].shape[-1]:
            yield f"rows of {row}", [padded(k, row) for k in ks], [padded(v, row) for v in vs]
    for gap in gaps:
        yield f"head gap {gap}", [head_gapped(k, gap) for k in ks], [head_gapped(v, gap) for v in vs]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lib", required=True, help="path of libflashdecode.so.0")
    parser.add_argument("--extra", required=True, help="dense shapes, 'BxHq/HkvxNxD' comma-separated")
    parser.add_argument("--rows", default="", help="padded row lengths in elements, comma-separated")
    parser.add_argument("--head-gaps", default="", help="unused tokens between heads, comma-separated")
    parser.add_argument("--dtype", default="float16", choices=sorted(cs.BOUNDS))
    parser.add_argument("--replays", type=int, default=40)
    parser.add_argument("--rotation-mib", type=int, default=1024)
    args = parser.parse_args()
    rows = [int(r) for r in filter(None, args.rows.split(","))]
    if any(r % 8 for r in rows):
        parser.error("--rows: multiples of 8 elements (16-byte rows)")
    gaps = [int(g) for g in filter(None, args.head_gaps.split(","))]

    fd = cs.FlashDecode(os.path.abspath(args.lib))
    handle = fd.create_cuda_handle(0)
    dtype = getattr(torch, args.dtype)
    for shape in cs.parse_extra_shapes(args.extra, parser):
        data = cs.make_inputs(shape, dtype, args.rotation_mib << 20, keep_dense=False)
        print(f"{cs.shape_label(shape)} {args.dtype}", flush=True)
        for name, ks, vs in layouts(data["fd_ks"], data["fd_vs"], rows, gaps):
            data["fd_ks"], data["fd_vs"] = ks, vs
            fd_args = cs.decode_args_per_set(fd, data, shape)
            run = cs.flashdecode_calls(fd, handle, fd_args)
            rel = cs.first_set_error(run, data)
            if not rel <= cs.BOUNDS[args.dtype]:
                print(f"  {name:<15} CHECK FAILED (rel {rel:.1e})", flush=True)
                continue
            times = [cs.time_graph(run, args.replays)[0] * 1e6 for _ in range(3)]
            gbs = data["kv_set_bytes"] / (statistics.median(times) * 1e-6) / 1e9
            print(f"  {name:<15} " + "/".join(f"{t:.1f}" for t in times) + f" us  {gbs:.0f} GB/s", flush=True)
            del ks, vs, fd_args
        del data
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
