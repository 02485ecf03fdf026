#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Times flashdecode on 8-bit KV caches (e4m3, e5m2, int8) against its 16-bit cache and FlashInfer's fp8 decode.

    eval "$(bash .anchors/flashinfer/setup.sh)"   # optional: FlashInfer rows (skipped with a reason without it)
    python3 tests/bench/compare_quantized.py --lib build-h200/src/libflashdecode.so.0 \
        [--dtypes float16,bfloat16] [--shapes 1,...,10] [--extra BxHq/HkvxNxD[:kind],...]
        [--parts decode,append] [--json out.json] [--plot out.png]
        [--base-lib NAME=PATH ...]

Same method as compare_sdpa.py (whose helpers it imports): in one process, on
the same inputs, every implementation runs under CUDA graph replay (one graph
calls it once per KV set), KV sets rotated so that their total is well above
the 60 MiB L2, CUDA events, the median over --replays replays divided by the
calls per replay, in --rounds rounds with the order reversed on odd rounds
(the median of the round medians is reported); the streaming-read and
device-to-device copy ceilings are measured at the start and the end of the
run and the higher is used.

Part `decode`, for compare_sdpa.py's shapes 1-10 (9 ragged: real lengths for
every implementation; 10 paged: token-major pages of 16, shuffled block
table) and each q dtype (fp16; bf16 with --dtypes), rows:
- fd-16bit: flashdecode on a cache of q's dtype (the baseline);
- fd-e4m3, fd-e5m2, fd-int8: the same keys and values quantized with one f32
  scale per tensor (amax / the format's largest value; a k_scale/v_scale of
  shape [batch, kv_capacity, kv_heads] with strides 0);
- fd-e4m3-tok: e4m3 with a scale per token and KV head (the full scale tensor,
  laid out as the cache: what per-token scales cost);
- fi-e4m3-tc, fi-e4m3-cc: FlashInfer 0.7.2's BatchDecodeWithPagedKVCacheWrapper
  with kv_data_type float8_e4m3fn, use_tensor_cores True (its fa2 prefill
  kernel; FA3 is chosen only for an fp8 q) and False (its CUDA-core decode
  kernel), on the fd-e4m3 bytes and scales: dense caches seen as pages of 16
  (HND, no copy, as the anchor bundle's fi_adapter.make does), shape 9 with
  each sequence's real pages, shape 10 on the same NHD page pool and table.
  FlashInfer takes fp8 scales as floats to run(): k_scale is folded into the
  softmax scale, v_scale is applied after the kernel as `out *= v_scale` (a
  second kernel, part of its time here, as in a serving engine). Its fp8
  modules are prebuilt for an fp16 q only (the bundle in .anchors/flashinfer,
  made as tests/bench/flashinfer-fp8/README.md says; without them each
  compiles on first use): for bf16 the rows run only with --fi-dtypes
  float16,bfloat16, which compiles them on first use (the time is printed).
--base-lib adds another build's NAME-16bit and 8-bit rows (NAME-e4m3,
NAME-e4m3-tok, ...) and, with part `append`, its append rows (impl
NAME:fd_append_kv, ...): an A/B on the same inputs in the same process.
Every output is checked against a float64 reference over the dequantized
cache (stored value * scale) before timing: relative L2 error at most 2e-3
for an fp16 q, 1e-2 for bf16. Effective bandwidth counts the K and V bytes
that must be read once (1 byte an element for the 8-bit rows; per-token
scales are not counted, so their cost shows as a lower rate) plus q and out;
"%read" is of the streaming-read ceiling, "x16" the time over fd-16bit's.

Part `append`: fd_append_kv() of 256 sequences x 8 KV heads x head_dim 128 x
one new token (q's dtype) into an e4m3 cache (per-tensor scales), paged
(pages of 16, shuffled table) and dense, and into a 16-bit paged cache; each
graph runs it 16 times on the same inputs (new K/V just written by the
projection are L2-resident in an engine too). Against two copies of the
same bytes, each one graph node: `d2d-copy` (cudaMemcpy of the new K/V) and
`torch-cast` (PyTorch's one-kernel f16 -> e4m3 conversion into a contiguous
buffer: the same bytes read and written, no scatter). Each written element
is checked bit for bit against PyTorch's conversion of new / scale. And
against the floors of any append that reads the lengths and the block table
on the device (kernels compiled with NVRTC, nvrtc_module.py, of
fd_append_kv's launch shape, copying the 16-bit rows): `floor-copy` (no
dependent load), `floor-length` (the store's address from the length, a
row per KV head as in the dense cache: the dense floor) and `floor-page`
(the length, then the page: the paged floor, into a second set of the
16-bit paged pool); fd_append_kv's rows show their time over their floor's.
The floors move 16-bit values (4 bytes an element read and written; an
8-bit cache's append moves 3): the 16-bit rows' floors, and no lower than
the 8-bit rows' own. Then
"decode step with append" against "decode alone" under one graph, on a
decode of 32 query heads over the same caches of --append-kv-len tokens
(sets rotated above L2): the target is at most 3 us more.

Part `scaling`: what a call costs besides its bytes. Two families of
dense caches, 32 query heads over 8 KV heads, head_dim 128: one sequence
of 16k-256k tokens, and 16-256 sequences of 2048 tokens (through shapes 1
and 2). Each impl's times are fitted by least squares as t = fixed +
bytes / rate: `rate` is what each further byte streams at (% of the read
ceiling), `fixed` what the call costs whatever its size (launches, the
pipeline's fill, the last wave's end, merges). A ratio of two impls' times
at one size approaches the ratio of their rates only where the fixed cost
is small beside the streaming.

Missing FlashInfer, fp8 in PyTorch, or a library without 8-bit caches or
fd_append_kv make those rows "n/a" with the reason; the rest still runs.
The C ABI comes from the Python binding's mirror (bindings/python); the
k_scale/v_scale fields of fd_decode_args and fd_append_args are declared
here when that mirror does not have them yet.
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
except ImportError:  # --from-json needs no torch
    torch = None

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, HERE)
from compare_sdpa import (  # noqa: E402
    FD_DTYPE_CODES,
    SHAPES,
    FlashDecode,
    bandwidth_ceilings,
    base_libraries,
    fd_tensor,
    flashdecode_calls,
    parse_extra_shapes,
    plot,
    reference,
    rel_error,
    shape_label,
    time_graph,
)
from flashdecode._library import FdDecodeArgs, FdTensor  # noqa: E402
from nvrtc_module import NvrtcModule  # noqa: E402

FD_DTYPE_CODES.update({"float8_e4m3fn": 4, "float8_e5m2": 5, "int8": 6})  # fd_tensor() reads this table
FD_DTYPE_F32 = 0

# fd_decode_args with 0.3's k_scale/v_scale, and fd_append_args: from the binding when it has them.
if "k_scale" in dict(FdDecodeArgs._fields_):
    DecodeArgs = FdDecodeArgs
else:

    class DecodeArgs(FdDecodeArgs):
        """fd_decode_args with the fields 0.3 appended after `sinks`."""

        _fields_ = [("k_scale", FdTensor), ("v_scale", FdTensor)]


try:
    from flashdecode._library import FdAppendArgs  # noqa: E402
except ImportError:

    class FdAppendArgs(ctypes.Structure):
        """fd_append_args (since 0.3)."""

        _fields_ = [
            ("struct_size", ctypes.c_size_t),
            ("k_new", FdTensor),
            ("v_new", FdTensor),
            ("k", FdTensor),
            ("v", FdTensor),
            ("k_scale", FdTensor),
            ("v_scale", FdTensor),
            ("seq_lens", FdTensor),
            ("block_table", FdTensor),
        ]


PAGE = 16  # tokens a page: shape 10, the append caches, FlashInfer's view of dense caches
DECODE_SHAPES = [s for s in SHAPES if s[0] <= 10]
FORMATS = ("e4m3", "e5m2", "int8")
FORMAT_MAX = {"e4m3": 448.0, "e5m2": 57344.0, "int8": 127.0}
BOUNDS = {"float16": 2e-3, "bfloat16": 1e-2}
APPEND_CALLS = 16  # appends a graph replays (the same inputs each time)
APPEND_TARGET_US = 3.0  # decode step with append vs decode alone: at most this much more


def torch_format(fmt):
    return {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2, "int8": torch.int8}[fmt]


def quantize(x, fmt, per_token=False):
    """x (16-bit, [..., D]) as an 8-bit tensor and its f32 scale: one scale
    (a 1-element tensor) or one per row of D ([...]), amax / the format's
    largest value. Converted as fd_append_kv() specifies: x / scale in
    float32, clamped (fp8 saturates), rounded to nearest even."""
    xf = x.float()
    amax = xf.abs().amax(-1) if per_token else xf.abs().amax().reshape(1)
    scale = (amax / FORMAT_MAX[fmt]).clamp_min(1e-12)
    y = (xf / (scale[..., None] if per_token else scale)).clamp(-FORMAT_MAX[fmt], FORMAT_MAX[fmt])
    if fmt == "int8":
        y = torch.round(y)  # half to even
    return y.to(torch_format(fmt)), scale


def dequantize(stored, scale, per_token=False):
    """stored value * scale in float64."""
    return stored.double() * (scale.double()[..., None] if per_token else scale.double())


def scale_desc(scale, shape, strides):
    """An f32 fd_tensor of shape `shape` (the cache without head_dim) over `scale`."""
    desc = FdTensor()
    desc.data = scale.data_ptr()
    desc.dtype = FD_DTYPE_F32
    desc.ndim = 3
    for i in range(3):
        desc.shape[i] = shape[i]
        desc.strides[i] = strides[i]
    return desc


def cache_scales(k, scales, per_token, paged):
    """fd_tensors of (k_scale, v_scale) for cache k: dense [B, Hkv, N, D] (seen
    as [B, N, Hkv, D]) or a page pool [pages, PAGE, Hkv, D]; per-token scales
    are laid out as the cache ([B, Hkv, N] or [pages, PAGE, Hkv])."""
    shape = (k.shape[0], k.shape[1], k.shape[2]) if paged else (k.shape[0], k.shape[2], k.shape[1])
    if not per_token:
        return tuple(scale_desc(s, shape, (0, 0, 0)) for s in scales)
    strides = (k.shape[1] * k.shape[2], k.shape[2], 1) if paged else (k.shape[1] * k.shape[2], 1, k.shape[2])
    return tuple(scale_desc(s, shape, strides) for s in scales)


def init_decode_args(fd):
    args = DecodeArgs()
    size = fd.lib.fd_decode_args_init(ctypes.byref(args), ctypes.sizeof(args))
    if size < ctypes.sizeof(args):
        raise RuntimeError(f"fd_decode_args of this library has {size} bytes, no k_scale/v_scale (before 0.3)")
    return args


def decode_args(fd, q, k, v, out, lens, table, scales=None):
    """fd_decode_args: q/out [B, Hq, 1, D]; k/v dense [B, Hkv, N, D] (seen as
    [B, N, Hkv, D]) or, with table, page pools [pages, PAGE, Hkv, D];
    scales: (k_scale, v_scale) fd_tensors or None."""
    args = init_decode_args(fd)
    args.q = fd_tensor(q, (0, 2, 1, 3))
    args.out = fd_tensor(out, (0, 2, 1, 3))
    order = (0, 1, 2, 3) if table is not None else (0, 2, 1, 3)
    args.k = fd_tensor(k, order)
    args.v = fd_tensor(v, order)
    if table is not None:
        args.block_table = fd_tensor(table, (0, 1))
    if lens is not None:
        args.seq_lens = fd_tensor(lens, (0,))
    if scales is not None:
        args.k_scale, args.v_scale = scales
    return args


def declare_append(fd):
    """fd_append_kv's prototypes, declared here whatever the binding has; False if the library lacks it."""
    lib = fd.lib
    if not hasattr(lib, "fd_append_kv"):
        return False
    lib.fd_append_args_init.restype = ctypes.c_size_t
    lib.fd_append_args_init.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    lib.fd_append_kv.restype = ctypes.c_int
    lib.fd_append_kv.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    return True


def append_args(fd, k_new, v_new, k, v, lens, table, scales=None):
    """fd_append_args: k_new/v_new [B, new_len, Hkv, D]; the cache as in decode_args()."""
    args = FdAppendArgs()
    fd.lib.fd_append_args_init(ctypes.byref(args), ctypes.sizeof(args))
    args.k_new = fd_tensor(k_new, (0, 1, 2, 3))
    args.v_new = fd_tensor(v_new, (0, 1, 2, 3))
    order = (0, 1, 2, 3) if table is not None else (0, 2, 1, 3)
    args.k = fd_tensor(k, order)
    args.v = fd_tensor(v, order)
    if table is not None:
        args.block_table = fd_tensor(table, (0, 1))
    if lens is not None:
        args.seq_lens = fd_tensor(lens, (0,))
    if scales is not None:
        args.k_scale, args.v_scale = scales
    return args


def dense_of(pool, table, kv_len):
    """A page pool [pages, PAGE, Hkv, D] gathered through table as [B, Hkv, N, D]."""
    batch, hkv, d = table.shape[0], pool.shape[2], pool.shape[3]
    return pool[table.long()].reshape(batch, kv_len, hkv, d).permute(0, 2, 1, 3)


# ---------------------------------------------------------------------------------------------------------------
# FlashInfer


class FlashInferAnchor:
    """FlashInfer from the anchor bundle (fi_adapter.py beside setup.sh), or the reason it is not there."""

    def __init__(self, fi_dir, dtypes):
        self.fi, self.reason, self.ready, self.dtypes = None, None, {}, dtypes
        if not hasattr(torch, "float8_e4m3fn"):
            self.reason = f"torch {torch.__version__} has no float8_e4m3fn"
            return
        try:
            if os.path.isdir(fi_dir):
                sys.path.insert(0, fi_dir)
                import fi_adapter  # noqa: E402

                self.fi = fi_adapter._ensure_flashinfer()
            else:
                import flashinfer

                self.fi = flashinfer
            print(f"FlashInfer {self.fi.__version__} from {os.path.dirname(self.fi.__file__)}")
        except Exception as error:
            self.reason = f"FlashInfer not loaded ({fi_dir}): {str(error).splitlines()[0][:100]}"

    def make(self, q, ks, vs, k_scales, v_scales, lens, table, kv_len, tensor_cores, outs):
        """A function decoding set i with BatchDecodeWithPagedKVCacheWrapper on
        fp8 caches: dense [B, Hkv, N, D] seen as HND pages of PAGE (each
        sequence's first ceil(len / PAGE) pages), or NHD page pools with table."""
        fi, dev = self.fi, q[0].device
        batch, q_heads, _, d = q[0].shape
        lengths = lens.long() if lens is not None else torch.full((batch,), kv_len, device=dev)
        npages = (lengths + PAGE - 1) // PAGE
        indptr = torch.cat([torch.zeros(1, device=dev, dtype=torch.long), npages.cumsum(0)]).to(torch.int32)
        last = (lengths - (npages - 1) * PAGE).to(torch.int32)
        if table is not None:  # the real pool: NHD [pages, PAGE, Hkv, D]
            layout, kv_heads = "NHD", ks[0].shape[2]
            mask = torch.arange(table.shape[1], device=dev)[None, :] < npages[:, None]
            indices = table[mask].to(torch.int32)
            views = list(zip(ks, vs))
        else:  # page (b, j) of a dense [B, Hkv, N, D] cache: index b*Hkv*npr + j in a view of page stride PAGE*D
            layout, kv_heads = "HND", ks[0].shape[1]
            npr = kv_len // PAGE
            per_seq = torch.arange(npr, device=dev)[None, :]
            mask = per_seq < npages[:, None]
            indices = (torch.arange(batch, device=dev)[:, None] * (kv_heads * npr) + per_seq)[mask].to(torch.int32)
            shape = ((batch - 1) * kv_heads * npr + npr, kv_heads, PAGE, d)
            strides = (PAGE * d, kv_len * d, d, 1)
            views = [(k.as_strided(shape, strides), v.as_strided(shape, strides)) for k, v in zip(ks, vs)]
        workspace = torch.zeros(128 << 20, dtype=torch.uint8, device=dev)
        wrapper = fi.BatchDecodeWithPagedKVCacheWrapper(workspace, kv_layout=layout, use_tensor_cores=tensor_cores)
        key = (q[0].dtype, d, tensor_cores)
        started = time.monotonic()
        wrapper.plan(
            indptr,
            indices,
            last,
            q_heads,
            kv_heads,
            d,
            PAGE,
            q_data_type=q[0].dtype,
            kv_data_type=ks[0].dtype,
            sm_scale=1.0 / math.sqrt(d),
        )
        qs = [x.reshape(batch, q_heads, d) for x in q]
        flat = [o.view(batch, q_heads, d) for o in outs]
        scales = [(float(a.item()), float(b.item())) for a, b in zip(k_scales, v_scales)]
        if key not in self.ready:  # the first run loads (or, without a prebuilt module, compiles) the module
            wrapper.run(qs[0], views[0], k_scale=scales[0][0], v_scale=scales[0][1], out=flat[0])
            torch.cuda.synchronize()
            self.ready[key] = time.monotonic() - started
            print(
                f"  FlashInfer e4m3 {str(q[0].dtype)[6:]} D={d} tensor_cores={tensor_cores}: module ready in "
                f"{self.ready[key]:.1f} s" + (" (compiled on this machine)" if self.ready[key] > 5 else "")
            )

        def calls():
            for i in range(len(qs)):
                wrapper.run(qs[i], views[i], k_scale=scales[i][0], v_scale=scales[i][1], out=flat[i])
            return len(qs)

        calls.keep = (wrapper, workspace, indptr, indices, last)
        return calls


# ---------------------------------------------------------------------------------------------------------------
# decode part


def make_inputs(shape, dtype, rotation_bytes):
    """One shape's inputs, seeded by its id: q sets, 16-bit K/V sets (dense
    [B, Hkv, N, D], or NHD page pools with a shuffled table), and their 8-bit
    versions: per-tensor for every format, per-token for e4m3."""
    sid, batch, q_heads, kv_heads, kv_len, d, kind = shape
    gen = torch.Generator(device="cuda")
    gen.manual_seed(2000 + sid)
    kv8_set_bytes = 2 * batch * kv_heads * kv_len * d
    sets = max(2, math.ceil(rotation_bytes / kv8_set_bytes))
    paged = "paged" in kind
    size = (batch * kv_len // PAGE, PAGE, kv_heads, d) if paged else (batch, kv_heads, kv_len, d)

    def randn(*size):
        return torch.randn(*size, device="cuda", dtype=dtype, generator=gen)

    data = {"sets": sets, "kv8_set_bytes": kv8_set_bytes, "paged": paged, "lens": None, "table": None}
    data["qs"] = [randn(batch, q_heads, 1, d) for _ in range(sets)]
    data["k16"] = [randn(*size) for _ in range(sets)]
    data["v16"] = [randn(*size) for _ in range(sets)]
    if paged:
        pages = size[0]
        perm = torch.randperm(pages, device="cuda", generator=gen).to(torch.int32)
        data["table"] = perm.reshape(batch, kv_len // PAGE).contiguous()
    if kind.startswith("ragged"):
        data["lens"] = torch.randint(1, kv_len + 1, (batch,), device="cuda", generator=gen, dtype=torch.int32)
    data["quant"] = {}
    if hasattr(torch, "float8_e4m3fn"):
        variants = [(fmt, False) for fmt in FORMATS] + [("e4m3", True)]
    else:
        variants = [("int8", False)]
    for fmt, per_token in variants:
        entry = {"k": [], "v": [], "k_scale": [], "v_scale": []}
        for k, v in zip(data["k16"], data["v16"]):
            for name, x in (("k", k), ("v", v)):
                stored, scale = quantize(x, fmt, per_token)
                entry[name].append(stored)
                entry[name + "_scale"].append(scale)
        data["quant"][(fmt, per_token)] = entry
    data["outs"] = [torch.empty_like(q) for q in data["qs"]]
    return data


def reference_of(data, shape, k, v):
    """The float64 reference of set 0 over caches k, v (16-bit or dequantized)."""
    if data["paged"]:
        k, v = dense_of(k, data["table"], shape[4]), dense_of(v, data["table"], shape[4])
    return reference(data["qs"][0], k, v, data["lens"])


def implementations(fd, handle, shape, data, anchor, bases=(), splits=()):
    """(name, build, reference) of each row: build() returns the row's calls
    (see time_graph()), or is the reason the row is skipped. bases: (row
    name, FlashDecode, handle) of other builds (--base-lib), whose 16-bit and
    8-bit rows run too (NAME-16bit, NAME-e4m3, NAME-e4m3-tok, ...). splits:
    split counts (--splits) of extra e4m3 rows fd-e4m3-sN."""
    kv_len = shape[4]
    qs, outs, lens, table = data["qs"], data["outs"], data["lens"], data["table"]

    def fd_build(ks, vs, scales_of, lib=fd, lib_handle=handle, num_splits=0):
        def build():
            args = [
                decode_args(lib, qs[i], ks[i], vs[i], outs[i], lens, table, scales_of(i))
                for i in range(data["sets"])
            ]
            for a in args:
                a.num_splits = num_splits
            calls = flashdecode_calls(lib, lib_handle, args)
            calls.plan = lib.plan(lib_handle, args[0])
            return calls

        return build

    rows = [
        (
            "fd-16bit",
            fd_build(data["k16"], data["v16"], lambda i: None),
            reference_of(data, shape, data["k16"][0], data["v16"][0]),
        )
    ]
    def scales_for(q8, per_token):
        return lambda i: cache_scales(q8["k"][i], (q8["k_scale"][i], q8["v_scale"][i]), per_token, data["paged"])

    refs = {}
    for (fmt, per_token), q8 in data["quant"].items():
        refs[fmt, per_token] = reference_of(
            data,
            shape,
            dequantize(q8["k"][0], q8["k_scale"][0], per_token),
            dequantize(q8["v"][0], q8["v_scale"][0], per_token),
        )
        build = fd_build(q8["k"], q8["v"], scales_for(q8, per_token))
        rows.append((f"fd-{fmt}" + ("-tok" if per_token else ""), build, refs[fmt, per_token]))
        if fmt == "e4m3" and not per_token:
            for n in splits:
                build = fd_build(q8["k"], q8["v"], scales_for(q8, per_token), num_splits=n)
                rows.append((f"fd-e4m3-s{n}", build, refs[fmt, per_token]))
    for base_name, base_fd, base_handle in bases:
        rows.append(
            (f"{base_name}-16bit", fd_build(data["k16"], data["v16"], lambda i: None, base_fd, base_handle), rows[0][2])
        )
        for (fmt, per_token), q8 in data["quant"].items():
            build = fd_build(q8["k"], q8["v"], scales_for(q8, per_token), base_fd, base_handle)
            rows.append((f"{base_name}-{fmt}" + ("-tok" if per_token else ""), build, refs[fmt, per_token]))
    for tensor_cores in (True, False):
        name = "fi-e4m3-" + ("tc" if tensor_cores else "cc")
        if anchor is None:
            continue  # a part without FlashInfer rows
        if anchor.fi is None or ("e4m3", False) not in data["quant"]:
            rows.append((name, anchor.reason or "no float8_e4m3fn in this torch", None))
            continue
        q_dtype = str(qs[0].dtype).replace("torch.", "")
        if q_dtype not in anchor.dtypes:
            rows.append((name, f"not run for a {q_dtype} q (not prebuilt; --fi-dtypes {q_dtype} compiles it)", None))
            continue
        q8 = data["quant"]["e4m3", False]

        def build(tensor_cores=tensor_cores, q8=q8):
            return anchor.make(
                qs, q8["k"], q8["v"], q8["k_scale"], q8["v_scale"], lens, table, kv_len, tensor_cores, outs
            )

        rows.append((name, build, refs["e4m3", False]))
    return rows


def run_shape(fd, handle, anchor, shape, dtype, args, bases=()):
    sid, batch, q_heads, kv_heads, kv_len, d, kind = shape
    dtype_name = str(dtype).replace("torch.", "")
    data = make_inputs(shape, dtype, args.rotation_mib << 20)
    lens = data["lens"]
    real_tokens = int(lens.sum().item()) if lens is not None else batch * kv_len
    elem = torch.finfo(dtype).bits // 8
    qo_bytes = 2 * batch * q_heads * d * elem
    bound = BOUNDS[dtype_name]
    results, timed = [], []
    for name, build, ref in implementations(fd, handle, shape, data, anchor, bases, args.splits):
        kv_elem = elem if name.endswith("-16bit") else 1
        row = {
            "impl": name,
            "shape_id": sid,
            "shape": [batch, q_heads, kv_heads, kv_len, d],
            "kind": kind,
            "label": shape_label(shape),
            "dtype": dtype_name,
            "kv_sets": data["sets"],
            "kv_mib": data["kv8_set_bytes"] * kv_elem / 2**20,
            "real_tokens": real_tokens,
            "bytes": 2 * kv_heads * d * kv_elem * real_tokens + qo_bytes,
        }
        if name.endswith("-tok"):
            row["scale_bytes"] = 2 * kv_heads * 4 * real_tokens
        if isinstance(build, str):
            row["error"] = build
            results.append(row)
            continue
        try:
            calls = build()
            if getattr(calls, "plan", ""):
                row["plan"] = calls.plan
            for out in data["outs"]:
                out.fill_(float("nan"))
            calls()  # once, eagerly: the output is checked before timing
            torch.cuda.synchronize()
            rel, max_abs = rel_error(data["outs"][0], ref)
            row.update(rel_err=rel, max_abs_err=max_abs, ok=bool(rel <= bound))
            if row["ok"]:
                timed.append((row, calls))
            else:
                row["error"] = f"check failed: rel err {rel:.1e} > {bound:.0e}"
        except Exception as error:  # a library without 8-bit caches, a FlashInfer module that does not load, ...
            row["error"] = str(error).splitlines()[0][:140] if str(error) else type(error).__name__
        results.append(row)
    measure(timed, args.rounds, args.replays)
    for row, _ in timed:
        row["gbps"] = row["bytes"] / row["us"] * 1e-3
    base = next((r for r in results if r["impl"] == "fd-16bit" and "us" in r), None)
    for row in results:
        if base is not None and "us" in row:
            row["x16"] = row["us"] / base["us"]
    del data, timed
    torch.cuda.empty_cache()
    return results


SCALING_FAMILIES = {
    "length": [(100 + i, 1, 32, 8, n, 128, "dense") for i, n in enumerate((16384, 32768, 65536, 131072, 262144))],
    "batch": [(110 + i, b, 32, 8, 2048, 128, "dense") for i, b in enumerate((16, 32, 64, 128, 256))],
}


def fit_scaling(rows, ceiling):
    """Least-squares t = fixed + bytes / rate per (family, dtype, impl)."""
    fits = []
    keys = sorted({(r["family"], r["dtype"], r["impl"]) for r in rows if "us" in r})
    for family, dtype, impl in keys:
        pts = [
            (r["bytes"], r["us"])
            for r in rows
            if "us" in r and (r["family"], r["dtype"], r["impl"]) == (family, dtype, impl)
        ]
        if len(pts) < 3:
            continue
        n = len(pts)
        mx = sum(x for x, _ in pts) / n
        my = sum(y for _, y in pts) / n
        slope = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)  # us per byte
        fixed = my - slope * mx
        worst = max(abs(y - (fixed + slope * x)) / y for x, y in pts)
        rate = 1e-3 / slope  # GB/s
        fits.append(
            {
                "family": family,
                "dtype": dtype,
                "impl": impl,
                "fixed_us": fixed,
                "rate_gbps": rate,
                "rate_pct_of_read": 100 * rate * 1e9 / ceiling,
                "worst_residual": worst,
                "points": len(pts),
            }
        )
    return fits


def measure(timed, rounds, replays):
    """`rounds` rounds of time_graph() over every (row, calls), the order
    reversed on odd rounds; row["us"] is the median of the round medians."""
    for r in range(rounds):
        for row, calls in timed if r % 2 == 0 else timed[::-1]:
            median, fastest, slowest = time_graph(calls, replays)
            torch.cuda.synchronize()
            row.setdefault("us_rounds", []).append(median * 1e6)
            row["us_min"] = min(row.get("us_min", math.inf), fastest * 1e6)
            row["us_max"] = max(row.get("us_max", 0.0), slowest * 1e6)
    for row, _ in timed:
        row["us"] = statistics.median(row["us_rounds"])


# ---------------------------------------------------------------------------------------------------------------
# append part

APPEND_SHAPE = (256, 32, 8, 128)  # batch, q heads (for the decode), KV heads, head_dim; one new token

# The floors of a graph-safe append: 16-bit rows copied by a kernel of
# fd_append_kv's shape (a block per sequence, a thread per 16 bytes of K and
# of V), with none, one (the length) or two (the length, then the page)
# dependent loads ahead of the stores. Their differences are what reading the
# lengths and the block table on the device costs, whatever the kernel.
APPEND_FLOOR_KERNELS = r"""
extern "C" __global__ void append_floor_copy(const uint4 *k_new, const uint4 *v_new, uint4 *k_out, uint4 *v_out,
                                             int row_vectors) {
  const int item = blockIdx.x * blockDim.x + threadIdx.x;
  if (item >= row_vectors) return;
  const size_t at = (size_t)blockIdx.y * row_vectors + item;
  k_out[at] = k_new[at];
  v_out[at] = v_new[at];
}

// Dense: each KV head's row lands at the sequence's length, as in the dense
// cache ([batch, kv_heads, slots, head]: a head's rows apart).
extern "C" __global__ void append_floor_length(const uint4 *k_new, const uint4 *v_new, uint4 *k_out, uint4 *v_out,
                                               int row_vectors, const int *lens, int slots, int head_vectors) {
  const int item = blockIdx.x * blockDim.x + threadIdx.x;
  if (item >= row_vectors) return;
  const size_t at = (size_t)blockIdx.y * row_vectors + item;
  const uint4 k = k_new[at], v = v_new[at];
  const int pos = lens[blockIdx.y] - 1;
  const int h = item / head_vectors;
  const size_t to = ((size_t)blockIdx.y * row_vectors + (size_t)h * head_vectors) * slots +
                    (size_t)(pos % slots) * head_vectors + (item - h * head_vectors);
  k_out[to] = k;
  v_out[to] = v;
}

// Paged: the length, then the block table's page; the pools are [pages, page_size, row].
extern "C" __global__ void append_floor_page(const uint4 *k_new, const uint4 *v_new, uint4 *k_pool, uint4 *v_pool,
                                             int row_vectors, const int *lens, const int *table, int columns,
                                             int page_size) {
  const int item = blockIdx.x * blockDim.x + threadIdx.x;
  if (item >= row_vectors) return;
  const size_t at = (size_t)blockIdx.y * row_vectors + item;
  const uint4 k = k_new[at], v = v_new[at];
  const int pos = lens[blockIdx.y] - 1;
  const int page = table[(size_t)blockIdx.y * columns + pos / page_size];
  const size_t to = ((size_t)page * page_size + pos % page_size) * row_vectors + item;
  k_pool[to] = k;
  v_pool[to] = v;
}
"""
APPEND_FLOOR_THREADS = 128  # fd_append_kv's block


def append_floor_rows(row_of, k_new, v_new, lens, table, pool_k, pool_v):
    """(row, calls) for the three floor kernels, or one row with the reason they cannot run.
    pool_k/pool_v: a 16-bit paged cache of q's dtype that no check reads afterwards."""
    batch, _, kv_heads, d = k_new.shape
    moved = 2 * 2 * k_new.numel() * k_new.element_size()  # K and V, read and written
    try:
        module = NvrtcModule(APPEND_FLOOR_KERNELS, ("append_floor_copy", "append_floor_length", "append_floor_page"))
    except Exception as error:
        return [(row_of("append", "floor-copy", "contiguous", error=str(error).splitlines()[0][:140]), None)]
    row_vectors = kv_heads * d * k_new.element_size() // 16
    head_vectors = row_vectors // kv_heads
    slots = PAGE
    out_k = torch.empty(batch, kv_heads, slots, d, device=k_new.device, dtype=k_new.dtype)
    out_v = torch.empty_like(out_k)

    def pointer(t):
        return ctypes.c_void_p(t.data_ptr())

    common = [pointer(k_new), pointer(v_new)]
    launches = {
        "floor-copy": ("append_floor_copy", common + [pointer(out_k), pointer(out_v), ctypes.c_int(row_vectors)]),
        "floor-length": (
            "append_floor_length",
            common + [pointer(out_k), pointer(out_v), ctypes.c_int(row_vectors), pointer(lens), ctypes.c_int(slots)]
            + [ctypes.c_int(head_vectors)],
        ),
        "floor-page": (
            "append_floor_page",
            common
            + [pointer(pool_k), pointer(pool_v), ctypes.c_int(row_vectors), pointer(lens), pointer(table)]
            + [ctypes.c_int(table.shape[1]), ctypes.c_int(PAGE)],
        ),
    }
    grid = (-(-row_vectors // APPEND_FLOOR_THREADS), batch)
    pos = lens.long() - 1
    b = torch.arange(batch, device=k_new.device)
    rows = []
    for impl, (kernel, values) in launches.items():
        params = NvrtcModule.arguments(values)
        row = row_of("append", impl, "contiguous" if impl == "floor-copy" else impl[6:], bytes=moved)
        # Once before timing, every row it writes checked bit for bit.
        out_k.fill_(float("nan"))
        out_v.fill_(float("nan"))
        try:
            module.launch(kernel, grid, APPEND_FLOOR_THREADS, params)
            torch.cuda.synchronize()
        except Exception as error:
            row["error"] = str(error).splitlines()[0][:140]
            rows.append((row, None))
            continue
        if impl == "floor-page":
            row["mismatches"] = append_mismatches(pool_k, pool_v, k_new, v_new, lens, table, None)
        else:  # copy: out's first `batch` rows of [kv_heads, d]; length: out[b, :, pos % slots]
            row["mismatches"] = 0
            for got, new in ((out_k, k_new), (out_v, v_new)):
                if impl == "floor-copy":
                    written = got.view(batch * slots, kv_heads, d)[:batch]
                else:
                    written = got[b, :, pos % slots]  # [batch, kv_heads, d]
                row["mismatches"] += int((written.view(torch.int16) != new[:, 0].view(torch.int16)).sum())
        row["ok"] = row["mismatches"] == 0

        def calls(kernel=kernel, params=params, values=values, keep=(out_k, out_v)):
            for _ in range(APPEND_CALLS):
                module.launch(kernel, grid, APPEND_FLOOR_THREADS, params)
            return APPEND_CALLS

        rows.append((row, calls))
    return rows


def run_append(fd, handle, dtype, args, with_floors=True):
    """fd_append_kv alone against two copies of its bytes and (with_floors) the
    floor kernels, and decode with append against decode alone, on e4m3
    (per-tensor scales) and 16-bit caches."""
    batch, q_heads, kv_heads, d = APPEND_SHAPE
    kv_len = args.append_kv_len
    dtype_name = str(dtype).replace("torch.", "")
    dev = "cuda"
    gen = torch.Generator(device=dev)
    gen.manual_seed(3000)
    rows = []

    def row_of(part, impl, cache, **extra):
        return {
            "part": part,
            "impl": impl,
            "cache": cache,
            "dtype": dtype_name,
            "batch": batch,
            "q_heads": q_heads,
            "kv_heads": kv_heads,
            "head_dim": d,
            "kv_len": kv_len,
            **extra,
        }

    if not declare_append(fd):
        rows.append(row_of("append", "fd_append_kv", "-", error="the library has no fd_append_kv (before 0.3)"))
        return rows
    fp8 = hasattr(torch, "float8_e4m3fn")
    new_elems = 2 * batch * kv_heads * d
    # Lengths include the new token; a block table shared by the sets.
    lens = torch.randint(kv_len // 2 + 1, kv_len + 1, (batch,), device=dev, generator=gen, dtype=torch.int32)
    pages = batch * kv_len // PAGE
    table = torch.randperm(pages, device=dev, generator=gen).to(torch.int32).reshape(batch, kv_len // PAGE)
    set_bytes = 2 * batch * kv_heads * kv_len * d
    sets = max(2, math.ceil((args.rotation_mib << 20) / set_bytes))
    k_new = [torch.randn(batch, 1, kv_heads, d, device=dev, dtype=dtype, generator=gen) for _ in range(sets)]
    v_new = [torch.randn(batch, 1, kv_heads, d, device=dev, dtype=dtype, generator=gen) for _ in range(sets)]
    qs = [torch.randn(batch, q_heads, 1, d, device=dev, dtype=dtype, generator=gen) for _ in range(sets)]
    outs = [torch.empty_like(q) for q in qs]

    # The copy ceilings of the new K/V bytes: one graph node each, APPEND_CALLS per graph.
    src = torch.stack([k_new[0], v_new[0]])
    dst16 = torch.empty_like(src)
    ceilings = [("d2d-copy", lambda: dst16.copy_(src), 2 * src.numel() * src.element_size())]
    if fp8:
        dst8 = torch.empty(src.shape, device=dev, dtype=torch.float8_e4m3fn)
        ceilings.append(("torch-cast", lambda: dst8.copy_(src), new_elems * (2 + 1)))
    timed = []
    for name, op, moved in ceilings:
        row = row_of("append", name, "contiguous", bytes=moved)

        def calls(op=op):
            for _ in range(APPEND_CALLS):
                op()
            return APPEND_CALLS

        rows.append(row)
        timed.append((row, calls))

    caches = []  # (label, paged, cache dtype or fmt, per-set k, v, scale tensors)
    kinds = (("paged", True), ("dense", False))
    for label, paged in kinds:
        size = (pages, PAGE, kv_heads, d) if paged else (batch, kv_heads, kv_len, d)
        if fp8:
            ks, vs, scales = [], [], []
            for _ in range(sets):
                k8, ks_ = quantize(torch.randn(*size, device=dev, dtype=dtype, generator=gen), "e4m3")
                v8, vs_ = quantize(torch.randn(*size, device=dev, dtype=dtype, generator=gen), "e4m3")
                ks.append(k8)
                vs.append(v8)
                scales.append((ks_, vs_))
            caches.append((f"e4m3 {label}", paged, ks, vs, scales))
        if label == "paged" or args.append_16bit_dense:
            ks = [torch.randn(*size, device=dev, dtype=dtype, generator=gen) for _ in range(sets)]
            vs = [torch.randn(*size, device=dev, dtype=dtype, generator=gen) for _ in range(sets)]
            caches.append((f"16-bit {label}", paged, ks, vs, None))

    # floor-page writes set 1's pool: the append check below reads set 0's, whose new slots must hold old bytes.
    paged16 = next(c for c in caches if c[0] == "16-bit paged")
    floors = append_floor_rows(row_of, k_new[0], v_new[0], lens, table, paged16[2][1], paged16[3][1]) if with_floors else []
    for row, calls in floors:
        rows.append(row)
        if calls is not None:
            timed.append((row, calls))

    bound = BOUNDS[dtype_name]
    for cache, paged, ks, vs, scales in caches:
        tbl = table if paged else None
        moved = new_elems * (2 + ks[0].element_size())
        row = row_of("append", "fd_append_kv", cache, bytes=moved)
        rows.append(row)
        try:
            descs = [cache_scales(ks[i], scales[i], False, paged) if scales else None for i in range(sets)]
            app = [append_args(fd, k_new[i], v_new[i], ks[i], vs[i], lens, tbl, descs[i]) for i in range(sets)]
            dec = [decode_args(fd, qs[i], ks[i], vs[i], outs[i], lens, tbl, descs[i]) for i in range(sets)]
            stream = torch.cuda.current_stream().cuda_stream
            fd.check(fd.lib.fd_append_kv(handle, ctypes.byref(app[0]), ctypes.c_void_p(stream)), "fd_append_kv")
            torch.cuda.synchronize()
            row["mismatches"] = append_mismatches(ks[0], vs[0], k_new[0], v_new[0], lens, tbl, scales)
            row["ok"] = row["mismatches"] == 0

            def append_calls(app=app):
                s = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
                for _ in range(APPEND_CALLS):
                    fd.check(fd.lib.fd_append_kv(handle, ctypes.byref(app[0]), s), "fd_append_kv")
                return APPEND_CALLS

            timed.append((row, append_calls))
        except Exception as error:
            row["error"] = str(error).splitlines()[0][:140]
            continue
        # Decode alone and decode after the append, one graph each; the append
        # rewrites the same slots each replay, so both see the same cache.
        ref_k = ks[0] if scales is None else dequantize(ks[0], scales[0][0])
        ref_v = vs[0] if scales is None else dequantize(vs[0], scales[0][1])
        if paged:
            ref_k, ref_v = dense_of(ref_k, table, kv_len), dense_of(ref_v, table, kv_len)
        ref = reference(qs[0], ref_k, ref_v, lens)
        for impl in ("decode", "append+decode"):
            r = row_of(
                "step",
                impl,
                cache,
                bytes=2 * kv_heads * d * ks[0].element_size() * int(lens.sum().item())
                + 2 * batch * q_heads * d * dtype.itemsize,
            )
            rows.append(r)
            try:
                decode_calls = flashdecode_calls(fd, handle, dec)

                def step_calls(decode_calls=decode_calls, with_append=impl != "decode", app=app, dec=dec):
                    if not with_append:
                        return decode_calls()
                    s = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
                    for i in range(sets):
                        fd.check(fd.lib.fd_append_kv(handle, ctypes.byref(app[i]), s), "fd_append_kv")
                        fd.check(fd.lib.fd_decode(handle, ctypes.byref(dec[i]), s), "fd_decode")
                    return sets

                for out in outs:
                    out.fill_(float("nan"))
                step_calls()
                torch.cuda.synchronize()
                rel, _ = rel_error(outs[0], ref)
                r.update(rel_err=rel, ok=bool(rel <= bound))
                timed.append((r, step_calls))
            except Exception as error:
                r["error"] = str(error).splitlines()[0][:140]
    measure(timed, args.rounds, args.replays)
    for row, _ in timed:
        row["gbps"] = row["bytes"] / row["us"] * 1e-3
    for cache in {r["cache"] for r in rows if r["part"] == "step"}:
        alone = next((r for r in rows if r["cache"] == cache and r["impl"] == "decode" and "us" in r), None)
        both = next((r for r in rows if r["cache"] == cache and r["impl"] == "append+decode" and "us" in r), None)
        if alone and both:
            both["extra_us"] = both["us"] - alone["us"]
            both["within_target"] = both["extra_us"] <= APPEND_TARGET_US
    copy_row = next((r for r in rows if r["impl"] == "torch-cast" and "us" in r), None) or next(
        (r for r in rows if r["impl"] == "d2d-copy" and "us" in r), None
    )
    floor_of = {r["impl"]: r for r in rows if r["impl"].startswith("floor-") and "us" in r}
    for r in rows:
        if r["impl"] == "fd_append_kv" and "us" in r and copy_row is not None:
            r["x_copy"] = r["us"] / copy_row["us"]
            r["copy_ref"] = copy_row["impl"]
        floor = floor_of.get("floor-page" if "paged" in r["cache"] else "floor-length")
        if r["impl"] == "fd_append_kv" and "us" in r and floor is not None:
            r["x_floor"] = r["us"] / floor["us"]
            r["floor_ref"] = floor["impl"]
        if r["impl"].startswith("floor-") and "us" in r and copy_row is not None:
            r["x_copy"] = r["us"] / copy_row["us"]
            r["copy_ref"] = copy_row["impl"]
    del caches, timed
    torch.cuda.empty_cache()
    return rows


def append_mismatches(k, v, k_new, v_new, lens, table, scales):
    """Elements of the new token's slots that differ, bit for bit, from PyTorch's conversion of new / scale."""
    batch = k_new.shape[0]
    pos = lens.long() - 1
    b = torch.arange(batch, device=k.device)
    bad = 0
    for cache, new, j in ((k, k_new, 0), (v, v_new, 1)):
        if table is not None:
            got = cache[table.long()[b, pos // PAGE], pos % PAGE]  # [B, Hkv, D]
        else:
            got = cache[b, :, pos]  # dense [B, Hkv, N, D]
        x = new[:, 0]
        if scales is None:
            want = x.to(cache.dtype)
        else:
            s = scales[0][j]
            want = (x.float() / s).clamp(-448.0, 448.0).to(cache.dtype)
        bad += int(
            (
                got.view(torch.uint8 if cache.element_size() == 1 else torch.int16)
                != want.view(torch.uint8 if cache.element_size() == 1 else torch.int16)
            )
            .sum()
            .item()
        )
    return bad


# ---------------------------------------------------------------------------------------------------------------
# report


def report(rows, append_rows, shapes, dtypes, plot_path):
    print(
        "=== decode (median under CUDA graph replay, KV rotated; GB/s over the K/V bytes read once + q + out;"
        " x16: time / fd-16bit's)"
    )
    print(
        f"{'shape B x Hq/Hkv x N x D':<30} {'dtype':<8} {'impl':<12} {'us':>8} {'GB/s':>6} {'%read':>6} {'x16':>5} "
        f"{'rel err':>8}"
    )
    for r in rows:
        head = f"{r['label']:<30} {r['dtype']:<8} {r['impl']:<12}"
        if "us" not in r:
            print(f"{head} n/a: {r.get('error', 'not timed')}")
            continue
        plan = f"  [{r['plan']}]" if r.get("plan") else ""
        print(
            f"{head} {r['us']:>8.1f} {r['gbps']:>6.0f} {r.get('pct_of_read', 0):>6.1f} {r.get('x16', 0):>5.2f} "
            f"{r['rel_err']:>8.1e}{plan}"
        )
    for dtype in dtypes:
        impls = []
        for r in rows:
            if r["dtype"] == dtype and r["impl"] not in impls:
                impls.append(r["impl"])
        for impl in impls:
            xs = [r["x16"] for r in rows if r["dtype"] == dtype and r["impl"] == impl and "x16" in r]
            pct = [r["pct_of_read"] for r in rows if r["dtype"] == dtype and r["impl"] == impl and "pct_of_read" in r]
            if xs and impl != "fd-16bit":
                geo = math.exp(sum(math.log(x) for x in xs) / len(xs))
                print(
                    f"{dtype:<8} {impl:<12} geometric mean time / fd-16bit over {len(xs)} shapes: {geo:.2f}; "
                    f"median % of read {statistics.median(pct):.1f}"
                )
    if append_rows:
        print("=== append (256 sequences x 8 KV heads x 128, one new token) and the decode step with it")
        for r in append_rows:
            head = f"{r['part']:<6} {r['dtype']:<8} {r['cache']:<13} {r['impl']:<14}"
            if "us" not in r:
                print(f"{head} n/a: {r.get('error', 'not timed')}")
                continue
            extra = ""
            if "x_copy" in r:
                extra += f"  {r['x_copy']:.2f}x {r['copy_ref']}"
            if "x_floor" in r:
                extra += f"  {r['x_floor']:.2f}x {r['floor_ref']}"
            if "mismatches" in r:
                extra += f"  mismatches {r['mismatches']}"
            if "extra_us" in r:
                extra += (
                    f"  +{r['extra_us']:.2f} us over decode alone "
                    + ("(within" if r["within_target"] else "(OVER")
                    + f" the {APPEND_TARGET_US:.0f} us target)"
                )
            if "rel_err" in r:
                extra += f"  rel err {r['rel_err']:.1e}"
            print(f"{head} {r['us']:>8.2f} us {r['gbps']:>6.0f} GB/s{extra}")
    if plot_path:
        impls = []
        for r in rows:
            if r["impl"] not in impls:
                impls.append(r["impl"])
        try:
            plot(plot_path, rows, shapes, dtypes, impls)
        except Exception as error:
            print(f"plot failed: {error}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lib", help="path of libflashdecode.so.0 (required unless --from-json)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--plot", help="write a PNG of %% of the read ceiling per shape and implementation here")
    parser.add_argument("--dtypes", default="float16", help="q dtypes, comma-separated: float16, bfloat16")
    parser.add_argument("--shapes", default="1,2,3,4,5,6,7,8,9,10", help="compare_sdpa.py's shape ids, 1..10")
    parser.add_argument(
        "--extra",
        default="",
        help="more shapes, 'BxHq/HkvxNxD[:kind]' comma-separated, kind dense (default), ragged or paged "
        "(ids 101, 102, ...; '--shapes \"\"' runs only these), e.g. 8x128/8x16384x128 for groups of 16",
    )
    parser.add_argument("--parts", default="decode,append", help="comma-separated: decode, append, scaling")
    parser.add_argument("--replays", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3, help="timing rounds, order alternating (median of rounds)")
    parser.add_argument("--rotation-mib", type=int, default=1024, help="8-bit KV bytes rotated through, at least")
    parser.add_argument(
        "--append-kv-len",
        type=int,
        default=1024,
        help="cache capacity of the append part's decode step (lengths random in (N/2, N])",
    )
    parser.add_argument(
        "--append-16bit-dense", action="store_true", help="also a 16-bit dense cache in the append part"
    )
    parser.add_argument(
        "--fi-dir",
        default=os.path.join(ROOT, ".anchors", "flashinfer"),
        help="the FlashInfer anchor bundle (fi_adapter.py, setup.sh); else an installed flashinfer",
    )
    parser.add_argument(
        "--fi-dtypes",
        default="float16",
        help="q dtypes of the FlashInfer rows: the bundle prebuilds fp8 modules for float16 only; bfloat16 "
        "compiles 6 modules on first use (20-40 s each)",
    )
    parser.add_argument(
        "--base-lib",
        action="append",
        default=[],
        help="NAME=PATH (or PATH: NAME base) of another build, timed in the same process as rows NAME-16bit, "
        "NAME-e4m3, NAME-e4m3-tok, ..., NAME:fd_append_kv (A/B); repeatable",
    )
    parser.add_argument(
        "--splits",
        type=lambda text: [int(x) for x in text.split(",") if x],
        default=[],
        help="N,M,...: extra rows fd-e4m3-sN, the e4m3 cache with num_splits N (a planner study)",
    )
    parser.add_argument("--from-json", help="print the tables and draw the plot of an earlier run's JSON; run nothing")
    args = parser.parse_args()
    dtypes = [d for d in args.dtypes.split(",") if d]
    wanted = {int(x) for x in args.shapes.split(",") if x}
    shapes = [s for s in DECODE_SHAPES if s[0] in wanted] + parse_extra_shapes(args.extra, parser)
    for shape in shapes:
        if shape[6] not in ("dense", "ragged", "paged"):
            parser.error(f"--extra: {shape_label(shape)}: this script runs dense, ragged and paged caches")
    parts = {p for p in args.parts.split(",") if p}
    if args.append_kv_len < 2 or args.append_kv_len % PAGE:
        parser.error(f"--append-kv-len must be a multiple of {PAGE}")
    if args.from_json:
        with open(args.from_json) as f:
            saved = json.load(f)
        dtypes = [d for d in dtypes if any(r["dtype"] == d for r in saved["results"])] or sorted(
            {r["dtype"] for r in saved["results"]}
        )
        print(
            f"ceilings: streaming read {saved['read_ceiling_gbps']:.0f} GB/s, device-to-device copy "
            f"{saved['copy_gbps']:.0f} GB/s (read + written)"
        )
        report(saved["results"], saved.get("append", []), shapes, dtypes, args.plot)
        return 0
    if torch is None:
        parser.error("PyTorch is needed to run the comparison")
    if not args.lib:
        parser.error("--lib is needed")

    fd = FlashDecode(args.lib)
    handle = fd.create_cuda_handle(torch.cuda.current_device())
    bases = [
        (name, base_fd, base_fd.create_cuda_handle(torch.cuda.current_device()))
        for name, base_fd in base_libraries(args.base_lib)
    ]
    props = torch.cuda.get_device_properties(0)
    anchor = FlashInferAnchor(args.fi_dir, args.fi_dtypes.split(",")) if "decode" in parts else None
    if anchor is not None and anchor.reason:
        print(f"FlashInfer rows skipped: {anchor.reason}")
    ceilings = [bandwidth_ceilings()]
    print(f"flashdecode {fd.version}, torch {torch.__version__}, {props.name}, {props.multi_processor_count} SMs")
    print(
        f"ceilings at the start: streaming read {ceilings[0][0] * 1e-9:.0f} GB/s, device-to-device copy "
        f"{ceilings[0][1] * 1e-9:.0f} GB/s (read + written)"
    )
    rows, append_rows, scaling_rows = [], [], []
    started = time.monotonic()
    for dtype_name in dtypes:
        dtype = getattr(torch, dtype_name)
        if "decode" in parts:
            for shape in shapes:
                got = run_shape(fd, handle, anchor, shape, dtype, args, bases)
                rows.extend(got)
                times = ", ".join(f"{r['impl']} {r['us']:.1f}" if "us" in r else f"{r['impl']} n/a" for r in got)
                print(
                    f"[{time.monotonic() - started:5.0f} s] {shape_label(shape)} {dtype_name}: {times} us", flush=True
                )
        if "scaling" in parts:
            for family, family_shapes in SCALING_FAMILIES.items():
                for shape in family_shapes:
                    got = run_shape(fd, handle, None, shape, dtype, args, bases)
                    for r in got:
                        r["family"] = family
                    scaling_rows.extend(got)
                    times = ", ".join(f"{r['impl']} {r['us']:.1f}" for r in got if "us" in r)
                    print(f"[{time.monotonic() - started:5.0f} s] {shape_label(shape)} {dtype_name}: {times} us")
        if "append" in parts:
            got = run_append(fd, handle, dtype, args)
            for base_name, base_fd, base_handle in bases:
                for r in run_append(base_fd, base_handle, dtype, args, with_floors=False):
                    if r["impl"] not in ("d2d-copy", "torch-cast") and not r["impl"].startswith("floor-"):
                        r["impl"] = f"{base_name}:{r['impl']}"
                        got.append(r)
            append_rows.extend(got)
            times = ", ".join(f"{r['impl']} {r['cache']} {r['us']:.2f}" for r in got if "us" in r)
            print(f"[{time.monotonic() - started:5.0f} s] append {dtype_name}: {times} us", flush=True)
    fd.lib.fd_destroy(handle)
    ceilings.append(bandwidth_ceilings())
    ceiling = max(read for read, _ in ceilings)
    copy = max(c for _, c in ceilings)
    print(
        f"ceilings at the end: streaming read {ceilings[1][0] * 1e-9:.0f} GB/s, device-to-device copy "
        f"{ceilings[1][1] * 1e-9:.0f} GB/s; used: {ceiling * 1e-9:.0f} and {copy * 1e-9:.0f} GB/s"
    )
    for row in rows + append_rows + scaling_rows:
        if "gbps" in row:
            row["pct_of_read"] = 100 * row["gbps"] * 1e9 / ceiling
    scaling = fit_scaling(scaling_rows, ceiling)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "read_ceiling_gbps": ceiling * 1e-9,
                    "copy_gbps": copy * 1e-9,
                    "read_ceiling_runs_gbps": [read * 1e-9 for read, _ in ceilings],
                    "copy_runs_gbps": [c * 1e-9 for _, c in ceilings],
                    "device": props.name,
                    "torch": torch.__version__,
                    "flashdecode": fd.version,
                    "flashinfer": getattr(getattr(anchor, "fi", None), "__version__", None),
                    "flashinfer_module_seconds": {str(k): v for k, v in (anchor.ready if anchor else {}).items()},
                    "results": rows,
                    "append": append_rows,
                    "scaling_rows": scaling_rows,
                    "scaling": scaling,
                },
                f,
                indent=1,
            )
    report(rows, append_rows, shapes, dtypes, args.plot)
    if scaling:
        print("=== scaling: t = fixed + bytes / rate, least squares over each family's sizes")
        for f in scaling:
            print(
                f"{f['family']:<7} {f['dtype']:<8} {f['impl']:<14} fixed {f['fixed_us']:6.1f} us  rate "
                f"{f['rate_gbps']:5.0f} GB/s ({f['rate_pct_of_read']:5.1f}% of read)  worst residual "
                f"{100 * f['worst_residual']:.1f}%"
            )
    failed = [r for r in rows + append_rows + scaling_rows if r["impl"].startswith("fd") and r.get("ok") is False]
    floors_failed = [r for r in append_rows if r["impl"].startswith("floor-") and r.get("ok") is False]
    if floors_failed:
        print(f"the append floors wrote wrong bytes in {len(floors_failed)} case(s): their times mean nothing")
    if failed or floors_failed:
        print(f"flashdecode failed its check on {len(failed)} case(s)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
