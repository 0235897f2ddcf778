#!/usr/bin/env python
"""GDN's forward intra stage, ours against fla's, on the GPU: ``gdn/_kernels/wy_inverse.py`` (one
program per (chunk, qk head)) against fla 0.6.0's ``chunk_gated_delta_rule_fwd_kkt_solve_kernel``
(one per (chunk, value head); fla's chain zero-fills A before it, which is not counted here), both
autotuned, the same bf16 k, fp32 gate and beta, at the model's layer shape and the op bench's main
one; each timed by ``harness.median_ms``, with its distance from the fp64 solve and A's bytes over
the copy rate measured in the same run; at the layer shape also each configuration of ours forced
(``CONFIGS`` and ``CANDIDATES``). Records: ``bench/records/2026-12-04-h200-gdn-wy-inverse-*.json``.

    python tools/wy_inverse_ab.py OUT.json
"""
from __future__ import annotations

import json
import math
import sys

import torch

SHAPES = {"layer_hv32": dict(B=4, T=4096, H=16, HV=32), "prod_b8": dict(B=8, T=8192, H=16, HV=16)}


def main(path: str) -> int:
    from fla.ops.gated_delta_rule.chunk_fwd import chunk_gated_delta_rule_fwd_kkt_solve_kernel as fla_kkt

    from kernel_fun._common.numerics import rel_rms
    from kernel_fun.bench.harness import measure_ceilings, median_ms
    from kernel_fun.gdn import reference_stages as R
    from kernel_fun.gdn._kernels import wy_inverse as inv

    ceil = measure_ceilings()
    out = {"ceilings": ceil, "cases": {}}
    for name, s in SHAPES.items():
        B, T, H, HV, K = s["B"], s["T"], s["H"], s["HV"], 128
        gen = torch.Generator(device="cuda").manual_seed(0)
        k = torch.nn.functional.normalize(torch.randn(B, T, H, K, device="cuda", generator=gen), dim=-1).bfloat16()
        a = -torch.rand(B, T, HV, device="cuda", generator=gen) * 0.5
        g = torch.cat([c.cumsum(1) for c in a.split(64, dim=1)], 1) / math.log(2.0)
        beta = torch.rand(B, T, HV, device="cuda", generator=gen) * 2.0
        A_fla = torch.zeros(B, T, HV, 64, device="cuda", dtype=k.dtype)

        def fla():
            fla_kkt[(T // 64, B * HV)](k=k, g=g, beta=beta, A=A_fla, cu_seqlens=None, chunk_indices=None, T=T, H=H,
                                       HV=HV, K=K, BT=64, BC=16)

        def ours():
            return inv.wy_inverse(k, g, beta)

        fla()
        A = ours()
        torch.cuda.synchronize()
        # the fp64 solve on the first sequence's first 8 chunks (both write the blocks on and below the diagonal)
        n = 512
        ref = R.wy_inverse_ref(k[:1, :n].cpu(), g[:1, :n].cpu(), beta[:1, :n].cpu()).float()

        def err(x):
            return rel_rms(R.lower_blocks(x[:1, :n].float().cpu(), 1, n), ref)

        t_fla, t_ours = median_ms(fla), median_ms(ours)
        A_bytes = B * T * HV * 64 * 2 * 10 / 16 + B * T * H * K * 2  # A's blocks written, k read
        row = dict(shape=dict(s, K=K), fla_ms=round(t_fla, 4), ours_ms=round(t_ours, 4),
                   speedup=round(t_fla / t_ours, 3), err_fla=err(A_fla), err_ours=err(A),
                   bytes_floor_ms=round(A_bytes / (ceil["copy_TBps"] * 1e9), 4),
                   ours_config=str(getattr(inv.wy_inverse_kernel_tuned, "best_config", "")),
                   fla_config=str(getattr(getattr(fla_kkt, "fn", None), "best_config", "")))
        if name == "layer_hv32":
            from kernel_fun._common.tuning import config_name

            row["configs"] = {}
            for c in inv.CONFIGS + inv.CANDIDATES:
                A_c = inv.wy_inverse(k, g, beta, config=c)
                row["configs"][config_name(c)] = dict(ms=round(median_ms(lambda: inv.wy_inverse(k, g, beta, config=c)), 4),
                                                      err=err(A_c))
        print(name, row, flush=True)
        out["cases"][name] = row
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "wy_inverse_ab.json"))
