"""How far one ulp of input rounding moves the fp64 GDN reference's gradients (CPU, no GPU).

Each bf16 input moved one ulp up or down at random (three draws), the fp64 reference re-run,
and the relative move of dA_log, ddt_bias, dg, dq printed per case and input seed: where it
passes a tolerance, that output is ill-conditioned at that case and no kernel can be held to
the tolerance there (tests/gdn/test_chain_gpu.py's ILL_CONDITIONED measures the same floor on
the GPU, in the test). Run: python tools/gdn_noise_floor.py (about 3 minutes on 2 cores)."""
import sys, torch
sys.path.insert(0, "tests/gdn")
import chain_cases as cc
from kernel_fun.gdn.reference import chunk_gated_delta_rule_ref
from kernel_fun._common.numerics import rel_rms as rel
LAYER = dict(use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True, output_final_state=True)
def one_ulp(t, seed):
    gen = torch.Generator().manual_seed(seed); out = {}
    for n, x in t.items():
        y = x.detach().clone()
        if y.dtype == torch.bfloat16:
            f = y.float()
            ulp = torch.where(f == 0, torch.zeros_like(f), torch.exp2(torch.floor(torch.log2(f.abs())) - 7))
            s = torch.randint(0, 2, y.shape, generator=gen).float() * 2 - 1
            y = (f + s * ulp).to(torch.bfloat16)
        out[n] = y.requires_grad_(True)
    return out
for name, c in [("k64_v256_kfirst", dict(B=2, T=300, H=2, HV=2, K=64, V=256, h0=True, state_v_first=False)),
                ("layer_grouped", dict(B=2, T=1000, H=2, HV=4, K=128, V=128, h0=True))]:
  for seed in (0, 1):
    c2 = dict(c); v_first = c2.get("state_v_first", True)
    t = cc.make_inputs(**c2, device="cpu", dtype=torch.bfloat16, seed=seed)
    gen = torch.Generator().manual_seed(1)
    B, T, HV, V, K = c["B"], c["T"], c["HV"], c["V"], c["K"]
    do = torch.randn(B, T, HV, V, generator=gen).to(torch.bfloat16)
    dht = torch.randn(B, HV, *((V, K) if v_first else (K, V)), generator=gen)
    fl = dict(LAYER, state_v_first=v_first)
    ref = cc.run(chunk_gated_delta_rule_ref, t, do.double(), dht.double(), **fl)
    for s in range(3):
        m = cc.run(chunk_gated_delta_rule_ref, one_ulp(t, 7 + s), do.double(), dht.double(), **fl)
        print(name, seed, s, {n: f"{rel(m[n], ref[n]):.2e}" for n in ("dA_log", "ddt_bias", "dg", "dq")}, flush=True)
