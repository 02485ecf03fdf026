# SPDX-License-Identifier: Apache-2.0
# Capture what BatchDecodeWithPagedKVCacheWrapper.plan() asks for with fp16 q / fp8 kv, without a GPU.
import torch, flashinfer, flashinfer.decode as D, flashinfer.utils as U
from flashinfer.jit.attention.modules import get_batch_decode_uri, get_batch_prefill_uri, gen_batch_decode_module, _gen_batch_prefill_primary_module
_e = torch.empty
torch.empty = lambda *a, **k: _e(*a, **{x: y for x, y in k.items() if x != "pin_memory"})
class Got(Exception): pass
def fake_dec(*a): raise Got(("decode", get_batch_decode_uri(*a), a))
def fake_pre(backend, *a): raise Got(("prefill", get_batch_prefill_uri(backend, *a), (backend,) + a))
D.get_batch_decode_module = fake_dec; D.get_batch_prefill_module = fake_pre
D.determine_attention_backend = lambda dev, *a, **k: U.determine_attention_backend.__wrapped__(dev, *a, **k) if hasattr(U.determine_attention_backend, "__wrapped__") else ("fa3" if U.is_fa3_backend_supported(*a) else "fa2")
D.BatchDecodeWithPagedKVCacheWrapper._auto_prefers_cudnn = lambda self, *a, **k: False
names = []
for tc in (False, True):
    for hd in (64, 128, 256):
        ws = torch.zeros(1 << 20, dtype=torch.uint8)
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, kv_layout="HND", use_tensor_cores=tc)
        i32 = dict(dtype=torch.int32)
        try:
            w.plan(torch.arange(3, **i32) * 4, torch.arange(8, **i32), torch.full((2,), 5, **i32), 32, 8, hd, 16,
                   q_data_type=torch.float16, kv_data_type=torch.float8_e4m3fn)
            print("no module lookup?!")
        except Got as g:
            kind, uri, args = g.args[0]
            spec = gen_batch_decode_module(*args) if kind == "decode" else _gen_batch_prefill_primary_module(*args)
            print(f"tc={tc} hd={hd} {kind} args={args}\n  uri ={uri}\n  spec={spec.name} match={spec.name == uri} aot_path={spec.aot_path}")
            names.append(uri)
open("expected_uris.txt", "w").write("\n".join(names) + "\n")
