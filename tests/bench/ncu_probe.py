#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""One call each of flashdecode and SDPA cuDNN/FA2 on shapes of
compare_sdpa.py (dense and paged; default 1,2,6), inside an NVTX range
'probe<id>', for Nsight Compute (on the GPU machine):

  ncu --clock-control none --nvtx --nvtx-include 'probe2/' [-k regex:mma_split] \
      --section SpeedOfLight --section WarpStateStats \
      python3 tests/bench/ncu_probe.py build/src/libflashdecode.so.0 2,10

A warm-up call of each runs first, outside the range. fp16, fresh random data.
"""
import ctypes
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_sdpa as cs  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

fd = cs.FlashDecode(os.path.abspath(sys.argv[1]))
handle = fd.create_cuda_handle(0)
shapes = [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "1,2,6").split(",")]
for shape in cs.SHAPES:
    sid, b, hq, hkv, n, d, kind = shape
    if sid not in shapes or kind not in ("dense", "paged"):
        continue
    q = torch.randn(b, hq, 1, d, device="cuda", dtype=torch.float16)
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
    ws = ctypes.c_size_t()
    fd.check(fd.lib.fd_workspace_size(handle, ctypes.byref(a), ctypes.byref(ws)), "ws")
    fd.check(fd.lib.fd_reserve_workspace(handle, ws.value), "reserve")
    stream = torch.cuda.current_stream().cuda_stream
    for probe in (False, True):
        if probe:
            torch.cuda.nvtx.range_push(f"probe{sid}")
        fd.check(fd.lib.fd_decode(handle, ctypes.byref(a), ctypes.c_void_p(stream)), "decode")
        for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        if probe:
            torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()
    print(f"shape {sid} done")
