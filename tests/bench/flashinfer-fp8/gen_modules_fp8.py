# SPDX-License-Identifier: Apache-2.0
# gen_modules.py with q=float16, kv=float8_e4m3fn, o=float16 (the fp8 KV-cache decode modules);
# WHICH=cascade builds the merge-of-states module (flashinfer.merge_states) instead.
import os, sys, json
import torch
import flashinfer
from flashinfer.jit.attention.modules import (gen_batch_decode_module, _gen_batch_prefill_primary_module,
    _gen_batch_prefill_independent_paged_module, get_batch_decode_uri, get_batch_prefill_uri)
from flashinfer.jit import env as jit_env
from flashinfer.jit.core import build_jit_specs
from flashinfer.jit.cascade import gen_cascade_module
q, kv, o = torch.float16, torch.float8_e4m3fn, torch.float16
hds = [int(x) for x in os.environ.get("HDS", "128 64 256").split()]
which = os.environ.get("WHICH", "decode prefill").split()
specs = [gen_cascade_module()] if "cascade" in which else []
for hd in hds:
    if "decode" in which:
        specs.append(gen_batch_decode_module(q, kv, o, torch.int32, hd, hd, 0, False, False))
    if "prefill" in which:
        specs.append(_gen_batch_prefill_primary_module("fa2", q, kv, o, torch.int32, hd, hd, 0, False, False, False))
    if "indep" in which:
        specs.append(_gen_batch_prefill_independent_paged_module("fa2", q, kv, o, torch.int32, hd, hd, 0, False, False, False))
for s in specs:
    print(s.name, s.aot_path.exists())
if os.environ.get("BUILD") == "1":
    build_jit_specs(specs, verbose=True)
else:
    for s in specs: s.write_ninja()
print("JIT_DIR", jit_env.FLASHINFER_JIT_DIR)
