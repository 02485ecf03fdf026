#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""One call each of flashdecode and SDPA cuDNN/FA2 on shapes of
compare_sdpa.py (dense and paged; default 1,2,6), inside an NVTX range
'probe<id>', for Nsight Compute (on the GPU machine):

  ncu --clock-control none --nvtx --nvtx-include 'probe2/' [-k regex:mma_split] \
      --section SpeedOfLight --section WarpStateStats \
      python3 tests/bench/ncu_probe.py build/src/libflashdecode.so.0 2,10 [e4m3|e5m2|int8|e4m3-tok]

With an 8-bit format, flashdecode alone on that cache (compare_quantized.py's
inputs and quantization, per-tensor scales, or a scale per token with
e4m3-tok; SDPA has no 8-bit cache).
A warm-up call of each runs first, outside the range. fp16, fresh random data.
FD_PROBE_Q_LEN=N (16-bit caches): N query tokens a sequence (causal; SDPA
then runs them unmasked).
"""
import ctypes
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_quantized as cq  # noqa: E402
import compare_sdpa as cs  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402


def sixteen_bit(shape):
    """fd_decode_args on a 16-bit cache, and SDPA's calls on the same (dense) K/V."""
    sid, b, hq, hkv, n, d, kind = shape
    q = torch.randn(b, hq, int(os.environ.get("FD_PROBE_Q_LEN", "1")), d, device="cuda", dtype=torch.float16)
    out = torch.empty_like(q)
    if kind == "paged":
        gen = torch.Generator(device="cuda")
        gen.manual_seed(sid)
        pk, pv, table, dk, dv = cs.make_paged(
            lambda *size: torch.randn(*size, device="cuda", dtype=torch.float16, generator=gen), gen, b, hkv, n, d, 1,
            False)
        k, v = dk[0], dv[0]
        a = cs.decode_args(fd, q, pk[0], pv[0], out, block_table=table)
    else:
        k = torch.randn(b, hkv, n, d, device="cuda", dtype=torch.float16)
        v = torch.randn(b, hkv, n, d, device="cuda", dtype=torch.float16)
        a = cs.decode_args(fd, q, k, v, out)

    def anchors():
        for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    return a, anchors, (q, k, v, out)


def eight_bit(shape, fmt):
    """fd_decode_args on an 8-bit cache (per-tensor scales; per-token with a
    -tok suffix); no anchors."""
    per_token = fmt.endswith("-tok")
    fmt = fmt.removesuffix("-tok")
    data = cq.make_inputs(shape, torch.float16, 0)
    q8 = data["quant"][fmt, per_token]
    scales = cq.cache_scales(q8["k"][0], (q8["k_scale"][0], q8["v_scale"][0]), per_token, data["paged"])
    a = cq.decode_args(fd, data["qs"][0], q8["k"][0], q8["v"][0], data["outs"][0], data["lens"], data["table"], scales)
    return a, lambda: None, data


fd = cs.FlashDecode(os.path.abspath(sys.argv[1]))
handle = fd.create_cuda_handle(0)
shapes = [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "1,2,6").split(",")]
fmt = sys.argv[3] if len(sys.argv) > 3 else None
for shape in cq.DECODE_SHAPES if fmt else cs.SHAPES:
    sid, kind = shape[0], shape[-1]
    if sid not in shapes or (not fmt and kind not in ("dense", "paged")):
        continue
    a, anchors, keep = eight_bit(shape, fmt) if fmt else sixteen_bit(shape)
    ws = ctypes.c_size_t()
    fd.check(fd.lib.fd_workspace_size(handle, ctypes.byref(a), ctypes.byref(ws)), "ws")
    fd.check(fd.lib.fd_reserve_workspace(handle, ws.value), "reserve")
    stream = torch.cuda.current_stream().cuda_stream
    for probe in (False, True):
        if probe:
            torch.cuda.nvtx.range_push(f"probe{sid}")
        fd.check(fd.lib.fd_decode(handle, ctypes.byref(a), ctypes.c_void_p(stream)), "decode")
        anchors()
        if probe:
            torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()
    print(f"shape {sid} {fmt or 'fp16'}: {fd.plan(handle, a)}")
    del keep
fd.lib.fd_destroy(handle)
