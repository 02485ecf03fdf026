# SPDX-License-Identifier: Apache-2.0
# GPU smoke test of the prebuilt fp8 (e4m3) KV-cache decode modules: fp16 q, fp8 K/V, fp16 out.
# Run after `eval "$(bash .anchors/flashinfer/setup.sh)"`:  python3 tests/bench/flashinfer-fp8/check_fp8.py
import glob, math, os, time, torch, flashinfer
print("flashinfer", flashinfer.__version__, flashinfer.__file__, torch.__version__)
dev = "cuda"
ws = torch.zeros(128 << 20, dtype=torch.uint8, device=dev)
f8 = torch.float8_e4m3fn
def ref(q, k, v):  # q [B,Hq,D], k/v [B,Hkv,N,D] (already dequantized)
    g = q.shape[1] // k.shape[1]
    kf, vf = k.float().repeat_interleave(g, 1), v.float().repeat_interleave(g, 1)
    s = torch.einsum("bhd,bhnd->bhn", q.float(), kf) / math.sqrt(q.shape[-1])
    return torch.einsum("bhn,bhnd->bhd", s.softmax(-1), vf)
bad = 0
t0 = time.time()
for D in (64, 128, 256):
    for tc in (False, True):
        for (B, Hq, Hkv, N, P, lay) in ((3, 8, 8, 1000, 16, "HND"), (2, 32, 8, 512, 512, "HND"),
                                        (2, 32, 4, 300, 16, "NHD"), (4, 64, 8, 2048, 16, "NHD")):
            q = torch.randn(B, Hq, D, device=dev, dtype=torch.float16)
            k = torch.randn(B, Hkv, N, D, device=dev).to(f8)
            v = torch.randn(B, Hkv, N, D, device=dev).to(f8)
            npg = -(-N // P)
            def pool(t):
                t = torch.nn.functional.pad(t.view(torch.uint8), (0, 0, 0, npg * P - N)).view(f8)
                t = t.view(B, Hkv, npg, P, D).permute(0, 2, 1, 3, 4).reshape(B * npg, Hkv, P, D)
                return t.contiguous() if lay == "HND" else t.transpose(1, 2).contiguous()
            w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, kv_layout=lay, use_tensor_cores=tc)
            i32 = dict(dtype=torch.int32, device=dev)
            w.plan(torch.arange(B + 1, **i32) * npg, torch.arange(B * npg, **i32),
                   torch.full((B,), N - (npg - 1) * P, **i32), Hq, Hkv, D, P,
                   q_data_type=torch.float16, kv_data_type=f8)
            o = w.run(q, (pool(k), pool(v)))
            r = ref(q, k.float(), v.float())
            err = ((o.float() - r).norm() / r.norm()).item()
            # with k_scale/v_scale
            o2 = w.run(q, (pool(k), pool(v)), k_scale=0.5, v_scale=2.0)
            q2 = q.float() * 0.5
            r2 = ref(q2, k.float(), v.float()) * 2.0
            err2 = ((o2.float() - r2).norm() / r2.norm()).item()
            ok = err < 2e-2 and err2 < 2e-2 and o.dtype == torch.float16
            bad += not ok
            print(f"{'ok ' if ok else 'BAD'} fp8e4m3 D={D:3d} tc={int(tc)} B={B} Hq={Hq} Hkv={Hkv} N={N} page={P} {lay} rel_err={err:.1e} scaled={err2:.1e}")
torch.cuda.synchronize()
jit = glob.glob(os.path.join(os.environ.get("FLASHINFER_WORKSPACE_BASE", os.path.expanduser("~")), ".cache/flashinfer/*/*/cached_ops/*/*.so"))
print(f"{'ALL OK' if not bad else str(bad) + ' FAILED'} in {time.time() - t0:.0f}s; JIT-built here: {len(jit)}", *jit, sep="\n  ")
