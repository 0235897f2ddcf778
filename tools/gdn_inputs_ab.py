#!/usr/bin/env python
"""GDN's forward inputs and WY inverse on the GPU, two ways: ``inputs_fwd`` then ``wy_inverse`` (two
launches) against ``inputs_wy_fwd`` (one), both autotuned, at the model's layer shape (B=4 T=4096
H=16 HV=32 K=V=128, q, k, v column slices of one fused buffer, as GatedDeltaNet's conv hands them
over) and the op bench's main one (prod_b8: B=8 T=8192 H=HV=16, contiguous). Per shape: each arm's
time (``harness.median_ms``), the fused launch in every configuration, its outputs against the two
launches' (q, k, rstd, gc, beta, v bit for bit or by rel_rms; A against the two launches' and
against the fp64 solve on the first 512 tokens), then the op's forward and forward + backward at
the layer's call with ``chain.FUSED_INVERSE`` on and off, and the copy rate measured in the same run.

    python tools/gdn_inputs_ab.py OUT.json
"""
from __future__ import annotations

import json
import sys

import torch

SHAPES = {"layer_hv32": dict(B=4, T=4096, H=16, HV=32, slices=True),
          "prod_b8": dict(B=8, T=8192, H=16, HV=16, slices=False)}


def _inputs(B, T, H, HV, K, V, slices):
    gen = torch.Generator(device="cuda").manual_seed(0)
    if slices:
        buf = torch.randn(B, T, 2 * H * K + HV * V, device="cuda", generator=gen).bfloat16()
        q, k = (buf[..., i * H * K:(i + 1) * H * K].unflatten(-1, (H, K)) for i in (0, 1))
        v = buf[..., 2 * H * K:].unflatten(-1, (HV, V))
    else:
        q, k = (torch.randn(B, T, H, K, device="cuda", generator=gen).bfloat16() for _ in range(2))
        v = torch.randn(B, T, HV, V, device="cuda", generator=gen).bfloat16()
    g, beta = (torch.randn(B, T, HV, device="cuda", generator=gen).bfloat16() for _ in range(2))
    A_log = torch.rand(HV, device="cuda", generator=gen) * 2.0
    dt_bias = torch.randn(HV, device="cuda", generator=gen)
    return q, k, v, g, beta, A_log, dt_bias


def main(path: str) -> int:
    from kernel_fun import gdn
    from kernel_fun._common.numerics import rel_rms
    from kernel_fun._common.tuning import config_name
    from kernel_fun.bench.harness import measure_ceilings, median_ms
    from kernel_fun.gdn import chain
    from kernel_fun.gdn import reference_stages as R
    from kernel_fun.gdn._kernels import inputs_fwd as f1
    from kernel_fun.gdn._kernels import inputs_wy_fwd as fw
    from kernel_fun.gdn._kernels import wy_inverse as inv

    ceil = measure_ceilings()
    out = {"ceilings": ceil, "cases": {}}
    for name, s in SHAPES.items():
        B, T, H, HV, K, V = s["B"], s["T"], s["H"], s["HV"], 128, 128
        q, k, v, g, beta, A_log, dt_bias = _inputs(B, T, H, HV, K, V, s["slices"])
        args = (q, k, v, g, beta, A_log, dt_bias, True, True, 2.0, chain.RCP_LN2)

        def two():
            o = f1.inputs_fwd(*args)
            return (*o, inv.wy_inverse(o[2], o[5], o[6]))

        def fused(config=None):
            return fw.inputs_wy_fwd(*args, config=config)

        a, b = two(), fused()
        torch.cuda.synchronize()
        names = ("q", "q_rstd", "k", "k_rstd", "v", "gc", "beta", "A")
        diff = {n: (0.0 if torch.equal(x, y) else rel_rms(y.float(), x.float())) for n, x, y in zip(names, a, b)}
        n = 512  # the fp64 solve on the first sequence's first 8 chunks, from the fused launch's k, gc, beta
        ref = R.wy_inverse_ref(b[2][:1, :n].cpu(), b[5][:1, :n].cpu(), b[6][:1, :n].cpu()).float()
        err = {arm: rel_rms(R.lower_blocks(x[7][:1, :n].float().cpu(), 1, n), ref) for arm, x in (("two", a), ("fused", b))}
        del a, b
        row = dict(shape=dict(B=B, T=T, H=H, HV=HV, K=K, V=V, qkv_column_slices=s["slices"]),
                   two_ms=round(median_ms(two), 4), fused_ms=round(median_ms(fused), 4),
                   fused_config=str(getattr(fw.inputs_wy_fwd_kernel_tuned, "best_config", "")),
                   two_configs=[str(getattr(f1.inputs_fwd_kernel_tuned, "best_config", "")),
                                str(getattr(inv.wy_inverse_kernel_tuned, "best_config", ""))],
                   fused_vs_two_rel=diff, A_err_vs_fp64=err)
        # bytes: q, k read and written, v copied where strided, A written, gc/beta/g/beta_raw (4 x [B,T,HV] fp32-ish)
        nbytes = 4 * B * T * H * K * 2 + (2 * B * T * HV * V * 2 if s["slices"] else 0) + B * T * HV * 64 * 2 \
            + 4 * B * T * HV * 4
        row["bytes_floor_ms"] = round(nbytes / (ceil["copy_TBps"] * 1e9), 4)
        row["speedup"] = round(row["two_ms"] / row["fused_ms"], 3)
        row["configs"] = {config_name(c): round(median_ms(lambda: fused(c)), 4) for c in fw.CONFIGS + fw.CANDIDATES}
        print(name, row, flush=True)
        # the op at the layer's call, forward and forward + backward, the fused launch on and off
        leaves = [x.detach().clone().requires_grad_() for x in (q, k, v, g, beta, A_log, dt_bias)]
        do = torch.randn(B, T, HV, V, device="cuda", dtype=torch.bfloat16)

        def call():
            lq, lk, lv, lg, lb, la, ld = leaves
            return gdn.chunk_gated_delta_rule(lq, lk, lv, lg, lb, use_qk_l2norm_in_kernel=True,
                                              use_beta_sigmoid_in_kernel=True, state_v_first=True,
                                              use_gate_in_kernel=True, A_log=la, dt_bias=ld)[0]

        op = {}
        for flag in (False, True, False, True):  # twice each, interleaved
            chain.FUSED_INVERSE = flag
            key = "fused" if flag else "two"
            o = call()
            grads = torch.autograd.grad(o, leaves, do)
            op.setdefault(key, {"fwd_ms": [], "fwdbwd_ms": []})
            op[key]["fwd_ms"].append(round(median_ms(call), 4))
            op[key]["fwdbwd_ms"].append(round(median_ms(lambda: torch.autograd.grad(call(), leaves, do)), 4))
            op[key]["o_grads"] = (o, grads)
        o_t, g_t = op["two"].pop("o_grads")
        o_f, g_f = op["fused"].pop("o_grads")
        op["fused_vs_two_rel"] = {nm: rel_rms(y.float(), x.float()) for nm, x, y in
                                  zip(("o", "dq", "dk", "dv", "dg", "dbeta", "dA_log", "ddt_bias"), (o_t, *g_t),
                                      (o_f, *g_f))}
        chain.FUSED_INVERSE = True
        row["op"] = op
        print(name, "op", op, flush=True)
        out["cases"][name] = row
    with open(path, "w") as fh:
        json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "gdn_inputs_ab.json"))
