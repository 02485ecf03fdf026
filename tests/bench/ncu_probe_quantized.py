#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""One flashdecode call on an 8-bit cache (per-tensor scales) for each of
compare_sdpa.py's shapes given (default 2,3,4), inside an NVTX range
'q8probe<id>', for Nsight Compute (on the GPU machine):

  ncu --clock-control none --nvtx --nvtx-include 'q8probe3/' \
      --section SpeedOfLight --section WarpStateStats --section InstructionStats \
      python3 tests/bench/ncu_probe_quantized.py build/src/libflashdecode.so.0 3 e4m3

A warm-up call runs first, outside the range; the inputs are compare_quantized.py's
(fresh random data, the same quantization), fp16 q.
"""
import ctypes
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_quantized as cq  # noqa: E402
import torch  # noqa: E402

fd = cq.FlashDecode(os.path.abspath(sys.argv[1]))
handle = fd.create_cuda_handle(0)
wanted = [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "2,3,4").split(",")]
fmt = sys.argv[3] if len(sys.argv) > 3 else "e4m3"
for shape in cq.DECODE_SHAPES:
    if shape[0] not in wanted:
        continue
    data = cq.make_inputs(shape, torch.float16, 0)
    q8 = data["quant"][fmt, False]
    scales = cq.cache_scales(q8["k"][0], (q8["k_scale"][0], q8["v_scale"][0]), False, data["paged"])
    a = cq.decode_args(fd, data["qs"][0], q8["k"][0], q8["v"][0], data["outs"][0], data["lens"], data["table"], scales)
    ws = ctypes.c_size_t()
    fd.check(fd.lib.fd_workspace_size(handle, ctypes.byref(a), ctypes.byref(ws)), "workspace size")
    fd.check(fd.lib.fd_reserve_workspace(handle, ws.value), "reserve")
    stream = torch.cuda.current_stream().cuda_stream
    for probe in (False, True):
        if probe:
            torch.cuda.nvtx.range_push(f"q8probe{shape[0]}")
        fd.check(fd.lib.fd_decode(handle, ctypes.byref(a), ctypes.c_void_p(stream)), "decode")
        if probe:
            torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()
    print(f"shape {shape[0]} {fmt}: {fd.plan(handle, a)}")
    del data
fd.lib.fd_destroy(handle)
