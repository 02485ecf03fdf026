#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Host time the Python binding adds to one decode: binding time = Python call time - C call time.

    python3 tests/bench/python_overhead.py --lib build/src/libflashdecode.so.0            # NumPy and torch CPU
    python3 tests/bench/python_overhead.py --lib build-h200/src/libflashdecode.so.0 --device cuda   # torch CUDA

The "C call" is the raw ctypes ``fd_decode`` with an ``fd_decode_args`` built
once, on its own handle, for the same problem and the same memory: what any
binding must pay at least. Each Python row calls the public API the way an
application does (``Handle.decode`` with and without ``out=``,
``flash_decode``) on the same arrays. Every case is timed in --rounds
rounds, the cases interleaved and their order reversed on odd rounds; each
round runs --iters calls in batches of --batch, and on CUDA synchronises
between batches without timing the synchronisation, so the launch queue
never fills and only host time is measured (a batch stays far below the
queue's depth). The table gives the median over rounds (and the fastest
round); binding time subtracts the C call's median of the same kind of
arrays, and "binding (min)" subtracts fastest from fastest, the steadier
figure on a loaded machine.

The default problem is tiny on the CPU (batch 1, 4 query heads over 1 KV
head, 16 tokens, head_dim 64, float32), so that the C call's own time and
noise stay small, and the issue's 4x32/8x1024x128 float16 on CUDA. Before
timing, every Python entry point is checked against a float64 reference.
``--binding DIR`` times another copy of the package (e.g. an older commit's
``bindings/python/src``) against the same library.
"""

import argparse
import ctypes
import json
import math
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--lib", help="libflashdecode to load (default: $FLASHDECODE_LIBRARY, else the package's search)"
    )
    parser.add_argument(
        "--binding", default=os.path.join(HERE, "..", "..", "bindings", "python", "src"), help="the package's folder"
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--kinds", default=None, help="numpy,torch (default: both on cpu, torch on cuda)")
    parser.add_argument("--shape", default=None, help="batch,q_heads,kv_heads,kv_len,head_dim")
    parser.add_argument("--dtype", default=None, choices=("float32", "float16", "bfloat16"))
    parser.add_argument("--iters", type=int, default=None, help="calls per case and round")
    parser.add_argument("--batch", type=int, default=50, help="calls between CUDA synchronisations")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=0, help="CPU backend worker threads of every handle (0: all)")
    parser.add_argument("--json", help="also write the results here")
    return parser.parse_args()


def reference(q, k, v):
    """float64 decode attention in HND: q [B, H, 1, D], k/v [B, Hkv, L, D] (NumPy)."""
    import numpy as np

    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    scores = np.einsum("bhqd,bhnd->bhqn", q, k) / math.sqrt(q.shape[-1])
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    return np.einsum("bhqn,bhnd->bhqd", weights / weights.sum(-1, keepdims=True), v)


def main():
    args = parse_args()
    sys.path.insert(0, os.path.abspath(args.binding))
    import numpy as np

    import flashdecode
    from flashdecode import _library

    info = flashdecode.load_library(args.lib) if args.lib else flashdecode.load_library()
    lib = _library.library()
    cuda = args.device == "cuda"
    kinds = (args.kinds or ("torch" if cuda else "numpy,torch")).split(",")
    shape = args.shape or ("4,32,8,1024,128" if cuda else "1,4,1,16,64")
    batch, heads, kv_heads, kv_len, dim = (int(x) for x in shape.split(","))
    dtype = args.dtype or ("float16" if cuda else "float32")
    iters = args.iters or (2000 if cuda else 4000)
    torch = None
    if "torch" in kinds:
        try:
            import torch
        except ImportError:
            if cuda:
                sys.exit("--device cuda needs PyTorch")
            print("PyTorch is not installed: NumPy only", file=sys.stderr)
            kinds = [k for k in kinds if k != "torch"]

    rng = np.random.default_rng(0)
    host = {
        "q": rng.standard_normal((batch, heads, 1, dim)).astype(np.float32),
        "k": rng.standard_normal((batch, kv_heads, kv_len, dim)).astype(np.float32),
        "v": rng.standard_normal((batch, kv_heads, kv_len, dim)).astype(np.float32),
    }
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def problem(kind):
        """(q, k, v, out) in HND, of ``kind``, and NHD views of them for Handle.decode's default layout."""
        if kind == "numpy":
            if dtype == "bfloat16":
                sys.exit("NumPy bfloat16 needs ml_dtypes; use --dtype float16 or float32")
            arrays = {name: value.astype(dtype) for name, value in host.items()}
            arrays["out"] = np.empty_like(arrays["q"])
        else:
            device = "cuda" if cuda else "cpu"
            arrays = {name: torch.from_numpy(value).to(device, getattr(torch, dtype)) for name, value in host.items()}
            arrays["out"] = torch.empty_like(arrays["q"])
        return arrays

    def as_numpy(x):
        return x.float().cpu().numpy() if torch is not None and isinstance(x, torch.Tensor) else x.astype(np.float32)

    tolerance = {"float32": 1e-4, "float16": 4e-3, "bfloat16": 3e-2}[dtype]
    backend = "cuda" if cuda else "cpu"
    rows = []  # (label, kind, function)
    c_calls = {}
    handles = []
    c_handles = []
    for kind in kinds:
        arrays = problem(kind)
        q, k, v, out = arrays["q"], arrays["k"], arrays["v"], arrays["out"]
        # Handle.decode's default layout is NHD: the same memory, seen as [B, 1, H, D] and [B, L, Hkv, D].
        q_nhd, k_nhd, v_nhd, out_nhd = (
            x.transpose(0, 2, 1, 3) if kind == "numpy" else x.transpose(1, 2) for x in (q, k, v, out)
        )
        handle = flashdecode.Handle(backend, num_threads=args.threads) if not cuda else flashdecode.Handle("cuda")
        handles.append(handle)
        expected = reference(as_numpy(q), as_numpy(k), as_numpy(v))  # of the inputs as rounded to dtype

        def check(result, label, kind=kind, expected=expected):
            sync()
            got = as_numpy(result)
            if got.shape != expected.shape:  # NHD results
                got = got.transpose(0, 2, 1, 3)
            error = np.abs(got - expected).max()
            if not error <= tolerance:
                sys.exit(f"{label} ({kind}): max error {error} > {tolerance}")

        handle.decode(q_nhd, k_nhd, v_nhd, out=out_nhd)
        check(out, "Handle.decode(out=)")
        check(handle.decode(q_nhd, k_nhd, v_nhd), "Handle.decode")
        check(flashdecode.flash_decode(q, k, v), "flash_decode")
        check(handle.decode(q, k, v, layout="HND"), "Handle.decode(layout='HND')")

        rows.append(
            (
                "Handle.decode(q, k, v, out=out)",
                kind,
                lambda h=handle, a=(q_nhd, k_nhd, v_nhd), o=out_nhd: h.decode(*a, out=o),
            )
        )
        rows.append(("Handle.decode(q, k, v)", kind, lambda h=handle, a=(q_nhd, k_nhd, v_nhd): h.decode(*a)))
        rows.append(("flash_decode(q, k, v)", kind, lambda a=(q, k, v): flashdecode.flash_decode(*a)))
        if kind == "torch" and hasattr(torch.nn.functional, "scaled_dot_product_attention"):
            sdpa = torch.nn.functional.scaled_dot_product_attention
            try:
                sdpa(q, k, v, enable_gqa=True)
                rows.append(("torch SDPA (for comparison)", kind, lambda a=(q, k, v): sdpa(*a, enable_gqa=True)))
            except (TypeError, RuntimeError):
                pass

        # The C call: one fd_decode_args for the NHD problem, built once, on a handle of its own.
        c_args = _library.new_decode_args()
        pointers = {}
        for name, x_nhd in (("q", q_nhd), ("k", k_nhd), ("v", v_nhd), ("out", out_nhd)):
            if kind == "numpy":
                pointer = x_nhd.__array_interface__["data"][0]
                strides = tuple(s // x_nhd.itemsize for s in x_nhd.strides)
            else:
                pointer, strides = x_nhd.data_ptr(), tuple(x_nhd.stride())
            tensor = getattr(c_args, name)
            tensor.data = pointer
            tensor.dtype = {"float32": 0, "float16": 1, "bfloat16": 2}[dtype]
            tensor.ndim = 4
            for axis in range(4):
                tensor.shape[axis] = x_nhd.shape[axis]
                tensor.strides[axis] = strides[axis]
            pointers[name] = pointer
        options = _library.new_options()
        options.backend = 2 if cuda else 1
        options.num_threads = args.threads
        c_handle = ctypes.c_void_p()
        _library.check(lib.fd_create(ctypes.byref(c_handle), ctypes.byref(options)))
        c_handles.append(c_handle.value)
        stream = torch.cuda.current_stream().cuda_stream if cuda else None
        fd_decode, args_ref, handle_pointer = lib.fd_decode, ctypes.byref(c_args), c_handle.value

        def c_call(f=fd_decode, h=handle_pointer, a=args_ref, s=stream):
            if f(h, a, s):
                raise RuntimeError(_library.last_error_message())

        c_call()
        check(out, "the C call")
        c_calls[kind] = c_call

    def time_case(function):
        """Mean host microseconds per call over --iters calls, in batches of --batch."""
        total = 0
        done = 0
        while done < iters:
            n = min(args.batch, iters - done)
            sync()
            start = time.perf_counter_ns()
            for _ in range(n):
                function()
            total += time.perf_counter_ns() - start
            done += n
        sync()
        return total / iters / 1000.0

    cases = [("C call (ctypes fd_decode, prebuilt args)", kind, c_calls[kind]) for kind in kinds] + rows
    for _, _, function in cases:  # warm up: caches, allocator pools, lazy initialisation
        for _ in range(200):
            function()
    sync()
    samples = {index: [] for index in range(len(cases))}
    for round_index in range(args.rounds):
        order = list(range(len(cases)))
        if round_index % 2:
            order.reverse()
        for index in order:
            samples[index].append(time_case(cases[index][2]))

    results = []
    c_median = {kind: statistics.median(samples[index]) for index, (_, kind, _) in enumerate(cases[: len(kinds)])}
    c_min = {kind: min(samples[index]) for index, (_, kind, _) in enumerate(cases[: len(kinds)])}
    for index, (label, kind, _) in enumerate(cases):
        median, fastest = statistics.median(samples[index]), min(samples[index])
        is_binding_call = index >= len(kinds) and not label.startswith("torch SDPA")
        results.append(
            {
                "case": label,
                "arrays": kind,
                "median_us": median,
                "min_us": fastest,
                "binding_us": median - c_median[kind] if is_binding_call else None,
                "binding_min_us": fastest - c_min[kind] if is_binding_call else None,
            }
        )

    print(
        f"flashdecode {info.version} ({info.path}); binding {os.path.abspath(args.binding)}\n"
        f"device {args.device}, {dtype}, batch {batch}, heads {heads}/{kv_heads}, kv_len {kv_len}, head_dim {dim}; "
        f"{args.rounds} rounds x {iters} calls" + (f", CPU threads {args.threads or 'all'}" if not cuda else "")
    )
    width = max(len(r["case"]) for r in results)
    print(
        f"{'case':<{width}}  {'arrays':<6}  {'median us':>9}  {'min us':>7}  {'binding us':>10}  {'binding (min)':>13}"
    )
    for r in results:
        binding = "" if r["binding_us"] is None else f"{r['binding_us']:10.1f}"
        binding_min = "" if r["binding_min_us"] is None else f"{r['binding_min_us']:13.1f}"
        print(
            f"{r['case']:<{width}}  {r['arrays']:<6}  {r['median_us']:9.1f}  {r['min_us']:7.1f}  {binding:>10}  {binding_min:>13}"
        )
    print("binding us = median us - the C call's median us; binding (min) = min us - the C call's min us (same arrays)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "library": info.path,
                    "version": info.version,
                    "binding": os.path.abspath(args.binding),
                    "device": args.device,
                    "dtype": dtype,
                    "shape": [batch, heads, kv_heads, kv_len, dim],
                    "rounds": args.rounds,
                    "iters": iters,
                    "results": results,
                },
                f,
                indent=1,
            )
    sync()
    for handle in handles:
        handle.close()
    for pointer in c_handles:
        lib.fd_destroy(pointer)


if __name__ == "__main__":
    main()
