#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Times flashdecode's attention variants (issue 19's targets) on the CUDA backend.

    python3 tests/bench/compare_variants.py --lib build-h200/src/libflashdecode.so.0 \
        [--parts qlen,window,logits,merge] [--dtypes float16,bfloat16] [--json out.json] \
        [--q-lens 1,2,4,8] [--extra BxHq/HkvxNxD,...] [--base-lib [name=]path ...] \
        [--fi-dir .anchors/flashinfer] [--no-fi]

Same method as compare_sdpa.py (whose helpers it uses): every implementation
under CUDA graph replay in one process on the same inputs, K/V sets rotated
beyond L2, CUDA events, the median of many replays, in --rounds rounds; every
output checked against a float64 reference before it is timed. Parts:

- qlen: shapes 1-3 of compare_sdpa.py (and the dense --extra shapes) with
  q_len 1, 2, 4, 8 (--q-lens) query tokens per sequence, causal (the new tokens are the cache's last q_len): flashdecode
  against itself at q_len 1 (the target: at most 1.15x), and against PyTorch
  SDPA on the same [B, H, q_len, D] queries: FlashAttention-2 without a mask
  (is_causal would align the mask top-left, wrong for decode: the unmasked
  call does the same reads and is the anchor's best case), and SDPA with the
  explicit causal-offset mask (which FlashAttention-2 cannot take: another
  backend runs it); and FlashInfer 0.7.2's BatchPrefillWithPagedKVCacheWrapper
  (fa2 backend, causal, which aligns the mask bottom-right as decode does:
  what engines call for speculative steps), the dense caches seen as pages of
  16 tokens (no copy), q as its [B * q_len, H, D] rows, planned once on the
  host (row fi-prefill; n/a with the reason without the anchor bundle in
  --fi-dir, see ../shared/anchors/flashinfer).
- window: one sequence of 32 query / 8 KV heads, head_dim 128: a 4096-token
  sliding window over a 32768-token cache against a 4096-token cache (target:
  at most 1.1x), dense and through pages of 16 tokens.
- logits: shapes 1-4 plain and with a logit softcap (30), ALiBi slopes and
  attention sinks, each alone (target: at most 3% over plain).
- merge: fd_merge_states of 8 states [256, 32, 128] (f16 and f32 states,
  output in the states' dtype) against the device-to-device copy rate
  measured in the same run (target: at least 80%), with the bytes read and
  written counted once; also against a copy of the same bytes under the same
  replay (what a call of this size reaches: launch and ramp included), and
  FlashInfer 0.7.2's merge_states on the same states (row fi; its cascade
  module built into the bundle as tests/bench/flashinfer-fp8/README.md says,
  else n/a with the reason).

--base-lib adds other builds of the library to the qlen, logits and merge
parts (rows "fd-<name>" on the same inputs in the same process: an A/B of a
change; the ratios and overheads are flashdecode's, the --lib build's).
"""
import argparse
import ctypes
import json
import math
import os
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_sdpa import (SHAPES, FlashDecode, bandwidth_ceilings, base_libraries, fd_tensor, parse_extra_shapes,  # noqa: E402
                          flashdecode_calls, rel_error, time_graph)
from compare_serving import FI_WORKSPACE, FlashInfer  # noqa: E402
from flashdecode._library import FdDecodeArgs, FdMergeArgs, FdTensor  # noqa: E402

FD_MASK_CAUSAL = 0
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
FI_PAGE = 16  # tokens a page of the dense caches as FlashInfer sees them
ROTATION_BYTES = 1 << 30  # K/V sets rotated per timed call: far beyond the 60 MiB L2
BOUNDS = {torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float32: 1e-5}


def reference(q, k, v, lens=None, window=0, softcap=0.0, slopes=None, sinks=None, causal=True):
    """float64 attention for q [B, Hq, T, D] (the last T positions) over k/v
    [B, Hkv, N, D]: the semantics of flashdecode.h's "Attention variants"."""
    b, hq, t, d = q.shape
    hkv, n = k.shape[1], k.shape[2]
    g = hq // hkv
    q64 = q.double().reshape(b, hkv, g * t, d)  # rows head-major: (head, token)
    s = torch.matmul(q64, k.double().transpose(-1, -2)).reshape(b, hq, t, n) / math.sqrt(d)
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    lens = torch.full((b,), n, device=q.device, dtype=torch.int64) if lens is None else lens.long()
    pos_q = lens[:, None] - t + torch.arange(t, device=q.device)[None, :]  # [B, T]
    pos_k = torch.arange(n, device=q.device)
    dist = pos_k[None, None, :] - pos_q[:, :, None]  # [B, T, N]
    if slopes is not None:
        s = s + slopes.double()[None, :, None, None] * dist[:, None, :, :].double()
    seen = pos_k[None, None, :] < lens[:, None, None]
    if causal:
        seen = seen & (dist <= 0)
    if window > 0:
        seen = seen & (-dist < window)
    s = s.masked_fill(~seen[:, None, :, :], float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.double()[None, :, None, None].expand(b, hq, t, 1)], dim=-1)
    p = torch.softmax(s, dim=-1)
    if sinks is not None:
        p = p[..., :-1]
    p = torch.nan_to_num(p)  # rows that see nothing
    out = torch.matmul(p.reshape(b, hkv, g * t, n), v.double()).reshape(b, hq, t, d)
    return out


def decode_args(fd, q, k, v, out, block_table=None, **variants):
    """q/out [B, H, T, D] and dense k/v [B, Hkv, N, D] (or page pools
    [pages, page_size, Hkv, D] with block_table) as the API's tensors."""
    args = FdDecodeArgs()
    fd.lib.fd_decode_args_init(ctypes.byref(args), ctypes.sizeof(args))
    args.q = fd_tensor(q, (0, 2, 1, 3))
    args.out = fd_tensor(out, (0, 2, 1, 3))
    order = (0, 2, 1, 3) if block_table is None else (0, 1, 2, 3)
    args.k = fd_tensor(k, order)
    args.v = fd_tensor(v, order)
    if block_table is not None:
        args.block_table = fd_tensor(block_table, (0, 1))
    args.mask = variants.get("mask", FD_MASK_CAUSAL)
    args.window_left = variants.get("window", 0)
    args.logit_softcap = variants.get("softcap", 0.0)
    if variants.get("slopes") is not None:
        args.alibi_slopes = fd_tensor(variants["slopes"], (0,))
    if variants.get("sinks") is not None:
        args.sinks = fd_tensor(variants["sinks"], (0,))
    return args


class Bench:
    def __init__(self, fd, replays, rounds, bases=(), flashinfer=None):
        self.fd, self.replays, self.rounds = fd, replays, rounds
        self.flashinfer = flashinfer  # the anchor bundle's fi_adapter, or None
        self.handle = fd.create_cuda_handle(torch.cuda.current_device())
        # --base-lib: (row name, FlashDecode, handle) of other builds
        self.bases = [(name, base, base.create_cuda_handle(torch.cuda.current_device())) for name, base in bases]

    def time(self, impls):
        """{name: calls()} timed in rounds (order reversed on odd rounds): {name: median seconds per call}."""
        names = list(impls)
        per = {n: [] for n in names}
        for r in range(self.rounds):
            for n in (names if r % 2 == 0 else names[::-1]):
                per[n].append(time_graph(impls[n], self.replays)[0])
        return {n: statistics.median(v) for n, v in per.items()}

    def fd_calls(self, arg_list):
        return flashdecode_calls(self.fd, self.handle, arg_list)

    def base_calls(self, arg_list, outs, ref, dtype, what):
        """{row name: calls()} of the --base-lib builds on the same arguments, each output checked first."""
        calls = {}
        for name, base, handle in self.bases:
            calls[name] = flashdecode_calls(base, handle, arg_list)
            checked(calls[name], outs, ref, dtype, f"{what} ({name})")
        return calls


def kv_sets(batch, kv_heads, n, d, dtype, gen):
    sets = max(2, math.ceil(ROTATION_BYTES / (2 * batch * kv_heads * n * d * torch.finfo(dtype).bits // 8)))
    ks = [torch.randn(batch, kv_heads, n, d, device="cuda", dtype=dtype, generator=gen) for _ in range(sets)]
    vs = [torch.randn(batch, kv_heads, n, d, device="cuda", dtype=dtype, generator=gen) for _ in range(sets)]
    return ks, vs


def checked(calls, outs, ref, dtype, what):
    for o in outs:
        o.fill_(float("nan"))
    calls()
    torch.cuda.synchronize()
    err = rel_error(outs[0], ref)[0]
    if not err <= BOUNDS[dtype]:
        raise SystemExit(f"{what}: relative error {err:.3g} above {BOUNDS[dtype]:g}")
    return err


def fi_prefill_calls(adapter, qs, ks, vs, t):
    """FlashInfer's causal batch prefill over dense [B, Hkv, N, D] caches seen
    as pages of FI_PAGE tokens, planned once: (calls(), outputs as [B, Hq, T, D] views)."""
    fi = adapter._ensure_flashinfer()
    batch, hq, _, d = qs[0].shape
    hkv, n = ks[0].shape[1], ks[0].shape[2]
    kv_indptr, indices, last = adapter.dense_pages(batch, hkv, n, d, FI_PAGE, qs[0].device)
    qo_indptr = torch.arange(batch + 1, dtype=torch.int32, device="cuda") * t
    pages = [(adapter.dense_view(k, FI_PAGE), adapter.dense_view(v, FI_PAGE)) for k, v in zip(ks, vs)]
    rows_q = [q.transpose(1, 2).reshape(batch * t, hq, d).contiguous() for q in qs]
    rows_out = [torch.empty_like(q) for q in rows_q]
    workspace = torch.zeros(FI_WORKSPACE, dtype=torch.uint8, device="cuda")
    wrapper = fi.BatchPrefillWithPagedKVCacheWrapper(workspace, kv_layout="HND", backend="fa2")
    wrapper.plan(qo_indptr, kv_indptr, indices, last, hq, hkv, d, FI_PAGE, causal=True, sm_scale=1.0 / math.sqrt(d),
                 q_data_type=qs[0].dtype, kv_data_type=ks[0].dtype)

    def calls():
        for q, kv, o in zip(rows_q, pages, rows_out):
            wrapper.run(q, kv, out=o)
        return len(rows_q)

    calls.keep = (wrapper, workspace, kv_indptr, indices, last, qo_indptr)
    return calls, [o.view(batch, t, hq, d).transpose(1, 2) for o in rows_out]


def part_qlen(bench, dtype, rows, q_lens=(1, 2, 4, 8), extra_shapes=()):
    for shape in [s for s in SHAPES if s[0] in (1, 2, 3)] + list(extra_shapes):
        sid, batch, hq, hkv, n, d, _ = shape
        gen = torch.Generator(device="cuda")
        gen.manual_seed(100 + sid)
        ks, vs = kv_sets(batch, hkv, n, d, dtype, gen)
        base = None
        for t in q_lens:
            qs = [torch.randn(batch, hq, t, d, device="cuda", dtype=dtype, generator=gen) for _ in ks]
            outs = [torch.empty_like(q) for q in qs]
            args = [decode_args(bench.fd, q, k, v, o) for q, k, v, o in zip(qs, ks, vs, outs)]
            fd_calls = bench.fd_calls(args)
            err = checked(fd_calls, outs, reference(qs[0], ks[0], vs[0]), dtype, f"shape {sid} q_len {t}")
            pos_q = n - t + torch.arange(t, device="cuda")
            mask = torch.arange(n, device="cuda")[None, :] <= pos_q[:, None]  # [T, N], True = seen

            def fa2(qs=qs, outs=outs):
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    for q, k, v, o in zip(qs, ks, vs, outs):
                        o.copy_(F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
                return len(qs)

            def masked(qs=qs, outs=outs, mask=mask):
                with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]):
                    for q, k, v, o in zip(qs, ks, vs, outs):
                        o.copy_(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True))
                return len(qs)

            impls = {"flashdecode": fd_calls, "fa2-unmasked": fa2}
            impls.update(bench.base_calls(args, outs, reference(qs[0], ks[0], vs[0]), dtype, f"shape {sid} q_len {t}"))
            try:
                checked(masked, outs, reference(qs[0], ks[0], vs[0]), dtype, "sdpa masked")
                impls["sdpa-masked"] = masked
            except Exception as error:  # no backend takes it: reported, not timed
                print(f"shape {sid} q_len {t}: SDPA with a mask did not run: {error}")
            if bench.flashinfer is not None:
                try:
                    fi_calls, fi_outs = fi_prefill_calls(bench.flashinfer, qs, ks, vs, t)
                    checked(fi_calls, fi_outs, reference(qs[0], ks[0], vs[0]), dtype, "FlashInfer prefill")
                    impls["fi-prefill"] = fi_calls
                except (Exception, SystemExit) as error:  # reported, not timed
                    print(f"shape {sid} q_len {t}: FlashInfer prefill did not run: {str(error).splitlines()[0][:160]}")
            times = bench.time(impls)
            if t == 1:
                base = times["flashdecode"]
            plan = bench.fd.plan(bench.handle, args[0])
            rows.append({"part": "qlen", "shape": sid, "sizes": f"{batch}x{hq}/{hkv}x{n}x{d}", "dtype": str(dtype)[6:],
                         "q_len": t, "error": err,
                         "plan": plan, "us": {k: v * 1e6 for k, v in times.items()},
                         "ratio_to_q1": times["flashdecode"] / base})
            print(f"shape {sid} {str(dtype)[6:]} q_len {t}: " +
                  "  ".join(f"{k} {v * 1e6:7.1f} us" for k, v in times.items()) +
                  f"  flashdecode/q_len1 {times['flashdecode'] / base:.3f}  [{plan}]", flush=True)


def paged(ks, vs, page):
    """Page pools [pages, page, Hkv, D] of dense [1, Hkv, N, D] caches, with a shuffled table."""
    n = ks[0].shape[2]
    pages = n // page
    perm = torch.randperm(pages, device="cuda").to(torch.int32)
    table = perm.reshape(1, pages).contiguous()

    def pool(x):
        p = torch.empty(pages, page, x.shape[1], x.shape[3], device="cuda", dtype=x.dtype)
        p[perm.long()] = x[0].permute(1, 0, 2).reshape(pages, page, x.shape[1], x.shape[3])
        return p

    return [pool(k) for k in ks], [pool(v) for v in vs], table


def part_window(bench, dtype, rows):
    hq, hkv, d, window, n = 32, 8, 128, 4096, 32768
    gen = torch.Generator(device="cuda")
    gen.manual_seed(7)
    for kind in ("dense", "paged"):
        times = {}
        for label, length, w in (("cache-4096", window, 0), ("window-4096-of-32768", n, window)):
            ks, vs = kv_sets(1, hkv, length, d, dtype, gen)
            qs = [torch.randn(1, hq, 1, d, device="cuda", dtype=dtype, generator=gen) for _ in ks]
            outs = [torch.empty_like(q) for q in qs]
            ref = reference(qs[0], ks[0], vs[0], window=w)
            if kind == "paged":
                pks, pvs, table = paged(ks, vs, 16)
                args = [decode_args(bench.fd, q, k, v, o, block_table=table, window=w)
                        for q, k, v, o in zip(qs, pks, pvs, outs)]
            else:
                args = [decode_args(bench.fd, q, k, v, o, window=w) for q, k, v, o in zip(qs, ks, vs, outs)]
            calls = bench.fd_calls(args)
            checked(calls, outs, ref, dtype, f"window {label} {kind}")
            times[label] = bench.time({label: calls})[label]
        ratio = times["window-4096-of-32768"] / times["cache-4096"]
        rows.append({"part": "window", "kind": kind, "dtype": str(dtype)[6:],
                     "us": {k: v * 1e6 for k, v in times.items()}, "ratio": ratio})
        print(f"window {kind} {str(dtype)[6:]}: " + "  ".join(f"{k} {v * 1e6:7.1f} us" for k, v in times.items()) +
              f"  ratio {ratio:.3f}", flush=True)


def part_logits(bench, dtype, rows):
    for shape in [s for s in SHAPES if s[0] in (1, 2, 3, 4)]:
        sid, batch, hq, hkv, n, d, _ = shape
        gen = torch.Generator(device="cuda")
        gen.manual_seed(200 + sid)
        ks, vs = kv_sets(batch, hkv, n, d, dtype, gen)
        qs = [torch.randn(batch, hq, 1, d, device="cuda", dtype=dtype, generator=gen) for _ in ks]
        outs = [torch.empty_like(q) for q in qs]
        slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / hq) for h in range(hq)], device="cuda")
        sinks = torch.randn(hq, device="cuda", generator=gen) + 2.0
        variants = {"plain": {}, "softcap": {"softcap": 30.0}, "alibi": {"slopes": slopes}, "sinks": {"sinks": sinks}}
        impls = {}
        for name, v in variants.items():
            args = [decode_args(bench.fd, q, k, vv, o, **v) for q, k, vv, o in zip(qs, ks, vs, outs)]
            calls = bench.fd_calls(args)
            ref = reference(qs[0], ks[0], vs[0], **v)
            checked(calls, outs, ref, dtype, f"shape {sid} {name}")
            impls[name] = calls
            impls.update({f"{base} {name}": c for base, c in bench.base_calls(args, outs, ref, dtype, name).items()})
        times = bench.time(impls)
        over = {k: times[k] / times["plain"] - 1 for k in variants if k != "plain"}
        for base, _, _ in bench.bases:
            over.update({f"{base} {k}": times[f"{base} {k}"] / times[f"{base} plain"] - 1 for k in variants
                         if k != "plain"})
        rows.append({"part": "logits", "shape": sid, "dtype": str(dtype)[6:],
                     "us": {k: v * 1e6 for k, v in times.items()}, "overhead": over})
        print(f"shape {sid} {str(dtype)[6:]}: " + "  ".join(f"{k} {v * 1e6:7.1f} us" for k, v in times.items()) +
              "  " + "  ".join(f"{k} {100 * v:+.1f}%" for k, v in over.items()), flush=True)


def fi_merge_calls(adapter, outs_in, lses, ref, dtype):
    """FlashInfer's merge_states (its CUDA cascade module, outputs preallocated)
    on the same states, stacked as it takes them ([rows, states, heads, dim],
    LSEs in base 2) outside the timing: (calls(), None) once its output is
    checked, or (None, the reason it does not run)."""
    if adapter is None:
        return None, "no FlashInfer anchor (--fi-dir, --no-fi)"
    try:
        module = adapter._ensure_flashinfer().cascade.get_cascade_module()
        states, heads, d = len(outs_in[0]), outs_in[0][0].shape[2], outs_in[0][0].shape[3]
        vs = [torch.stack([x.reshape(-1, heads, d) for x in outs], dim=1) for outs in outs_in]
        ss = [torch.stack([x.reshape(-1, heads) for x in lse], dim=1) / math.log(2.0) for lse in lses]
        merged = [torch.empty(v.shape[0], heads, d, device="cuda", dtype=dtype) for v in vs]
        merged_lse = [torch.empty(v.shape[0], heads, device="cuda") for v in vs]

        def calls():
            for args in zip(vs, ss, merged, merged_lse):
                module.merge_states(*args)
            return len(vs)

        merged[0].fill_(float("nan"))
        calls()
        torch.cuda.synchronize()
    except Exception as error:  # a dtype its module was not built for, a missing module
        return None, f"FlashInfer's merge_states: {str(error).splitlines()[0][:120]}"
    err = rel_error(merged[0].reshape(ref.shape), ref)[0]
    if not err <= BOUNDS[dtype]:
        return None, f"FlashInfer's merge_states: relative error {err:.3g} (states {states})"
    return calls, None


def part_merge(bench, copy_rate, rows):
    batch, heads, d, states = 256, 32, 128, 8
    for dtype in (torch.float16, torch.float32):
        elem = torch.finfo(dtype).bits // 8
        set_bytes = states * batch * heads * (d * elem + 4)
        sets = max(2, math.ceil(ROTATION_BYTES / set_bytes))
        outs_in = [[torch.randn(batch, 1, heads, d, device="cuda", dtype=dtype) for _ in range(states)]
                   for _ in range(sets)]
        lses = [[torch.randn(batch, 1, heads, device="cuda") * 3 for _ in range(states)] for _ in range(sets)]
        merged = [torch.empty(batch, 1, heads, d, device="cuda", dtype=dtype) for _ in range(sets)]
        merged_lse = [torch.empty(batch, 1, heads, device="cuda") for _ in range(sets)]
        keep = []
        arg_list = []
        for i in range(sets):
            so = (FdTensor * states)(*[fd_tensor(x, (0, 1, 2, 3)) for x in outs_in[i]])
            sl = (FdTensor * states)(*[fd_tensor(x, (0, 1, 2)) for x in lses[i]])
            a = FdMergeArgs()
            bench.fd.lib.fd_merge_args_init(ctypes.byref(a), ctypes.sizeof(a))
            a.num_states = states
            a.states_out = ctypes.cast(so, ctypes.POINTER(FdTensor))
            a.states_lse = ctypes.cast(sl, ctypes.POINTER(FdTensor))
            a.out = fd_tensor(merged[i], (0, 1, 2, 3))
            a.lse = fd_tensor(merged_lse[i], (0, 1, 2))
            keep += [so, sl]
            arg_list.append(a)

        def merge_calls(fd, handle):
            def calls():
                stream = torch.cuda.current_stream().cuda_stream
                for a in arg_list:
                    fd.check(fd.lib.fd_merge_states(handle, ctypes.byref(a), ctypes.c_void_p(stream)),
                             "fd_merge_states")
                return len(arg_list)
            return calls

        # This build's merge, then each --base-lib build's on the same arguments.
        impls = {"merge": merge_calls(bench.fd, bench.handle)}
        impls.update({f"{name} merge": merge_calls(base, handle) for name, base, handle in bench.bases})
        lse = torch.stack([x.double() for x in lses[0]])  # [S, B, 1, H]
        m = lse.max(dim=0).values
        w = torch.exp(lse - m)
        ref = (torch.stack([x.double() for x in outs_in[0]]) * w[..., None]).sum(0) / w.sum(0)[..., None]
        for name, calls in impls.items():
            merged[0].fill_(float("nan"))
            calls()
            torch.cuda.synchronize()
            err = rel_error(merged[0], ref)[0]
            if not err <= BOUNDS[dtype]:
                raise SystemExit(f"{name} {dtype}: relative error {err:.3g}")
        fi_calls, fi_reason = fi_merge_calls(bench.flashinfer, outs_in, lses, ref, dtype)
        if fi_calls is not None:
            impls["fi merge"] = fi_calls
        moved = set_bytes + batch * heads * (d * elem + 4)
        # What a copy moving the same bytes (half read, half written) takes
        # under the same replay: the rate a call of this size can reach.
        sources = [torch.randn(moved // 4, device="cuda", dtype=torch.float16) for _ in range(sets)]
        targets = [torch.empty_like(x) for x in sources]

        def copies():
            for source, target in zip(sources, targets):
                target.copy_(source)
            return len(sources)

        times = bench.time({**impls, "copy": copies})
        seconds = times["merge"]
        rate = moved / seconds
        small_copy_rate = moved / times["copy"]
        bases_us = {name: times[f"{name} merge"] * 1e6 for name, _, _ in bench.bases}
        if fi_calls is not None:
            bases_us["fi"] = times["fi merge"] * 1e6
        else:
            print(f"fi merge {str(dtype)[6:]}: n/a, {fi_reason}", flush=True)
        rows.append({"part": "merge", "dtype": str(dtype)[6:], "us": seconds * 1e6, "bytes": moved,
                     "rate": rate, "copy_rate": copy_rate, "of_copy": rate / copy_rate,
                     "same_bytes_copy_us": times["copy"] * 1e6, "of_same_bytes_copy": rate / small_copy_rate,
                     **({"base_us": bases_us} if bases_us else {})})
        print(f"merge 8 x [256, 32, 128] {str(dtype)[6:]}: {seconds * 1e6:.1f} us, {rate / 1e12:.2f} TB/s = "
              f"{100 * rate / copy_rate:.1f}% of the copy rate {copy_rate / 1e12:.2f} TB/s; a copy of the same "
              f"bytes {times['copy'] * 1e6:.1f} us ({100 * small_copy_rate / copy_rate:.1f}% of the copy rate), "
              f"the merge {100 * rate / small_copy_rate:.1f}% of it" +
              "".join(f"; {name} {us:.1f} us ({100 * moved / (us * 1e-6) / copy_rate:.1f}%)"
                      for name, us in bases_us.items()), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lib", required=True)
    parser.add_argument("--parts", default="qlen,window,logits,merge")
    parser.add_argument("--dtypes", default="float16,bfloat16")
    parser.add_argument("--q-lens", default="1,2,4,8", help="qlen part: query tokens per sequence (ratios to the first)")
    parser.add_argument("--extra", default="",
                        help="qlen part: dense shapes 'BxHq/HkvxNxD' beyond 1-3, comma-separated (ids 101, ...)")
    parser.add_argument("--replays", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json")
    parser.add_argument("--fi-dir", default=os.path.join(ROOT, ".anchors", "flashinfer"),
                        help="the FlashInfer anchor bundle (fi_adapter.py, setup.sh) for the qlen part's fi-prefill rows")
    parser.add_argument("--no-fi", action="store_true", help="skip the fi-prefill rows")
    parser.add_argument("--base-lib", action="append", default=[], metavar="[NAME=]PATH",
                        help="another build timed on the same inputs (qlen, logits, merge): rows fd-NAME")
    args = parser.parse_args()
    extra_shapes = parse_extra_shapes(args.extra, parser)
    if any(shape[-1] != "dense" for shape in extra_shapes):
        parser.error("--extra: dense shapes only")
    torch.backends.cuda.matmul.allow_tf32 = False
    fd = FlashDecode(args.lib)
    flashinfer = None
    if ("qlen" in args.parts.split(",") or "merge" in args.parts.split(",")) and not args.no_fi:
        anchor = FlashInfer(args.fi_dir)  # puts the bundle on sys.path
        if anchor.reason:
            print(f"fi-prefill rows n/a: {anchor.reason}")
        elif not os.path.isfile(os.path.join(args.fi_dir, "fi_adapter.py")):
            print(f"fi-prefill rows n/a: they need the anchor bundle's fi_adapter.py in {args.fi_dir}")
        else:
            import fi_adapter  # noqa: E402

            flashinfer = fi_adapter
    bench = Bench(fd, args.replays, args.rounds, base_libraries(args.base_lib), flashinfer)
    read_rate, copy_rate = bandwidth_ceilings()
    print(f"{fd.version} on {torch.cuda.get_device_name()}: read {read_rate / 1e12:.2f} TB/s, "
          f"copy {copy_rate / 1e12:.2f} TB/s")
    rows = []
    parts = args.parts.split(",")
    for name in args.dtypes.split(","):
        dtype = getattr(torch, name)
        if "qlen" in parts:
            part_qlen(bench, dtype, rows, [int(t) for t in args.q_lens.split(",")], extra_shapes)
        if "window" in parts:
            part_window(bench, dtype, rows)
        if "logits" in parts:
            part_logits(bench, dtype, rows)
    if "merge" in parts:
        part_merge(bench, max(copy_rate, bandwidth_ceilings()[1]), rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"version": fd.version, "device": torch.cuda.get_device_name(), "read_rate": read_rate,
                       "copy_rate": copy_rate, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
