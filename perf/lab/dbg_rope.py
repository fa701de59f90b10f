"""Lab: the first mismatching RoPE elements and KV-append bytes against torch, printed."""
import torch

import cute_kernels as ck
from cute_kernels.attention.decode_ops import FP8_KV, _append_torch, append_kv
from cute_kernels.rope.ops import rope_reference, rope_tables

torch.manual_seed(0)
cos, sin = rope_tables(8192, 128, device="cuda")
for trial in range(3):
    q = torch.randn(3, 129, 32, 128, device="cuda").bfloat16()
    pos = torch.arange(1000, 1129, device="cuda")
    qo, _ = ck.rope(q, None, cos, sin, positions=pos)
    ref, _ = rope_reference(q.double(), None, cos.double(), sin.double(), pos, False, 128)
    err = (qo.double() - ref).abs()
    bad = err > 2 * 2**-8 * ref.abs() + 1e-30
    for idx in bad.nonzero()[:3].tolist():
        b, s, h, d = idx
        pd = d + 64 if d < 64 else d - 64
        print("bad", idx, "out", qo[b, s, h, d].item(), "ref", ref[b, s, h, d].item(), "x", q[b, s, h, d].item(),
              "partner", q[b, s, h, pd].item(), "cos", cos[1000 + s, d % 64].item(), "sin", sin[1000 + s, d % 64].item())
        # fp32 formula
        a, bb = q[b, s, h, d].float(), q[b, s, h, pd].float()
        c, sn = cos[1000 + s, d % 64], sin[1000 + s, d % 64]
        print("  fp32", (a * c - bb * sn).item() if d < 64 else (a * c + bb * sn).item())
# append fp8 token q_len 1
for q_len in (1, 5):
    b, hk, d = 3, 8, 128
    kc = torch.randn(b, 512, hk, d, device="cuda").to(FP8_KV)
    vc = torch.randn(b, 512, hk, d, device="cuda").to(FP8_KV)
    ks = torch.rand(b, 512, hk, device="cuda") + 0.01
    vs = torch.rand(b, 512, hk, device="cuda") + 0.01
    lens = torch.tensor([0, 17, 500 - q_len], dtype=torch.int32, device="cuda")
    k = torch.randn(b, q_len, hk, d, device="cuda").bfloat16()
    v = torch.randn(b, q_len, hk, d, device="cuda").bfloat16()
    r = [t.clone() for t in (kc, vc, ks, vs)]
    _append_torch(r[0], r[1], k, v, lens, None, r[2], r[3])
    append_kv(kc, vc, k, v, lens, None, ks, vs)
    for name, a, e in (("k", kc, r[0]), ("v", vc, r[1])):
        m = a.view(torch.uint8) != e.view(torch.uint8)
        print(q_len, name, "mismatch", int(m.sum()), m.nonzero()[:4].tolist())
        for idx in m.nonzero()[:2].tolist():
            print("   got", a[tuple(idx)].float().item(), "exp", e[tuple(idx)].float().item())
    for name, a, e in (("ks", ks, r[2]), ("vs", vs, r[3])):
        m = a != e
        print(q_len, name, "mismatch", int(m.sum()), m.nonzero()[:4].tolist(), a[m][:3].tolist(), e[m][:3].tolist())
