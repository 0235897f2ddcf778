#!/usr/bin/env python
"""Bench: the fused forward state scan vs fla's fwd_h + fwd_o, on one GPU.

    python scripts/delta_scan_bench.py out.json [--no-gdn] [--qg-autotune]

KDA at B=8, T=8192, H=HV=16, K=128, V=256 bf16 (the baseline shape): the scan's inputs come
from fla's own KDA forward stages (``kda_gate_chunk_cumsum`` with A_log/dt_bias, then
``chunk_kda_fwd_intra``), then fla's ``chunk_gated_delta_rule_fwd_h`` + ``chunk_gla_fwd_o_gk``
and our ``state_scan_fwd`` run side by side (``triton.testing.do_bench`` medians), ours is
checked against fla's o and final state, and every autotune configuration of ours is timed.
Then the same for GDN at K=V=128 (fla's fwd_h + ``chunk_fwd_o``). Prints as it goes and writes
one JSON to argv[1]. About 2-3 minutes, mostly compilation and autotuning (fla's included).
The q_gated row (qg from the intra stage, ``state_scan_fwd(..., q_gated=True)``) runs the
production configuration unless ``--qg-autotune`` (about 30 s more).
"""
from __future__ import annotations

import datetime
import json
import math
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
import triton

T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def bench(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def copy_tbps() -> float:
    """Device-to-device copy bandwidth (bytes read + written), the ceiling of this run."""
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    ms = bench(lambda: y.copy_(x))
    return 2 * x.numel() / ms / 1e9


def per_config(run_with) -> dict:
    from kernel_fun._delta._kernels.state_scan_fwd import CONFIGS
    out = {}
    for c in CONFIGS:
        name = f"BV{c.kwargs['BV']}-w{c.num_warps}-s{c.num_stages}-r{c.maxnreg}"
        try:
            ms = bench(lambda: run_with(c))
            out[name] = round(ms, 4)
            log(f"    {name}: {ms:.3f} ms")
        except Exception as e:  # a config that does not fit (shared memory) is reported, not fatal
            out[name] = f"error: {type(e).__name__}: {str(e)[:120]}"
            log(f"    {name}: {out[name]}")
    return out


def kda_rows(B=8, T=8192, H=16, HV=16, K=128, V=256, qg_autotune=False) -> dict:
    from fla.ops.common.chunk_delta_h import chunk_gated_delta_rule_fwd_h
    from fla.ops.gla.chunk import chunk_gla_fwd_o_gk
    from fla.ops.kda.chunk_intra import chunk_kda_fwd_intra
    from fla.ops.kda.gate import kda_gate_chunk_cumsum
    from fla.ops.utils.constant import RCP_LN2

    from kernel_fun._delta._kernels.state_scan_fwd import state_scan_fwd, state_scan_fwd_kernel_tuned

    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    q = F.normalize(torch.randn(B, T, H, K, device=dev), dim=-1).to(dt)
    k = F.normalize(torch.randn(B, T, H, K, device=dev), dim=-1).to(dt)
    v = torch.randn(B, T, HV, V, device=dev, dtype=dt)
    beta = torch.randn(B, T, HV, device=dev).sigmoid().to(dt)
    g_raw = torch.randn(B, T, HV, K, device=dev, dtype=dt)
    # Model-like gate parameters (Mamba-style): A in [1, 16], dt in [1e-3, 1e-1].
    A_log = torch.empty(HV, device=dev).uniform_(1, 16).log()
    dt_init = torch.exp(torch.empty(HV * K, device=dev).uniform_(math.log(1e-3), math.log(1e-1)))
    dt_bias = dt_init + torch.log(-torch.expm1(-dt_init))  # inverse softplus
    scale = K ** -0.5
    gk = kda_gate_chunk_cumsum(g=g_raw, A_log=A_log, dt_bias=dt_bias, scale=RCP_LN2, chunk_size=64)
    # disable_recompute=True also returns qg = q * exp2(gk) (for the q_gated row)
    w, u, qg, kg, Aqk, _ = chunk_kda_fwd_intra(q=q, k=k, v=v, gk=gk, beta=beta, scale=scale, chunk_size=64,
                                               disable_recompute=True)
    del g_raw, v
    torch.cuda.synchronize()
    log(f"KDA inputs built: B={B} T={T} H={H} HV={HV} K={K} V={V}; "
        f"gate per chunk (log2, mean of the last row) {gk[:, 63::64].float().mean().item():.2f}")

    def fla_h():
        return chunk_gated_delta_rule_fwd_h(k=kg, w=w, u=u, gk=gk, output_final_state=True, chunk_size=64)

    h, v_new, ht_fla = fla_h()

    def fla_o():
        return chunk_gla_fwd_o_gk(q=q, v=v_new, g=gk, A=Aqk, h=h, scale=scale, chunk_size=64)

    def fla_pair():
        h_, vn_, ht_ = fla_h()
        return chunk_gla_fwd_o_gk(q=q, v=vn_, g=gk, A=Aqk, h=h_, scale=scale, chunk_size=64), ht_

    o_fla = fla_o()

    def ours(**kw):
        return state_scan_fwd(q, kg, w, u, gk=gk, Aqk=Aqk, scale=scale, output_final_state=True, **kw)

    t = time.time()
    o, ht, _, _ = ours()
    torch.cuda.synchronize()
    log(f"ours compiled + autotuned in {time.time() - t:.1f}s; best {state_scan_fwd_kernel_tuned.best_config}")
    err = {"o_vs_fla": rel(o, o_fla), "final_state_vs_fla": rel(ht, ht_fla)}
    log(f"ours vs fla: o rel rms {err['o_vs_fla']:.2e}, final state {err['final_state_vs_fla']:.2e}")
    best = state_scan_fwd_kernel_tuned.best_config
    # the recompute variant runs the production configuration (no second autotune)
    _, _, h2, vn2 = ours(save_h=True, save_v_new=True, config=best)
    err["h_vs_fla"], err["v_new_vs_fla"] = rel(h2, h), rel(vn2, v_new)
    log(f"ours (save_h, save_v_new) vs fla: h {err['h_vs_fla']:.2e}, v_new {err['v_new_vs_fla']:.2e}")
    del h2, vn2

    r = {"shape": dict(B=B, T=T, H=H, HV=HV, K=K, V=V, dtype="bfloat16", initial_state=False,
                       output_final_state=True)}
    r["fla_fwd_h_ms"] = bench(fla_h)
    log(f"fla fwd_h                 {r['fla_fwd_h_ms']:.3f} ms")
    r["fla_fwd_o_ms"] = bench(fla_o)
    log(f"fla chunk_gla_fwd_o_gk    {r['fla_fwd_o_ms']:.3f} ms")
    r["fla_pair_ms"] = bench(fla_pair)
    log(f"fla pair                  {r['fla_pair_ms']:.3f} ms")
    r["ours_ms"] = bench(ours)
    log(f"ours                      {r['ours_ms']:.3f} ms  ({r['fla_pair_ms'] / r['ours_ms']:.2f}x)")
    r["ours_save_h_v_new_ms"] = bench(lambda: ours(save_h=True, save_v_new=True, config=best))
    log(f"ours, saving h and v_new  {r['ours_save_h_v_new_ms']:.3f} ms (config {best})")

    def ours_qg(**kw):
        return state_scan_fwd(qg, kg, w, u, gk=gk, Aqk=Aqk, scale=scale, output_final_state=True, q_gated=True, **kw)

    qg_kw = {} if qg_autotune else {"config": best}
    t = time.time()
    o_qg, _, _, _ = ours_qg(**qg_kw)
    torch.cuda.synchronize()
    qg_config = state_scan_fwd_kernel_tuned.best_config if qg_autotune else best
    err["o_q_gated_vs_fla"] = rel(o_qg, o_fla)
    log(f"ours q_gated (qg from the intra stage) ready in {time.time() - t:.1f}s; config "
        f"{qg_config}; o vs fla {err['o_q_gated_vs_fla']:.2e}")
    r["ours_q_gated_ms"] = bench(lambda: ours_qg(**qg_kw))
    r["q_gated_config"] = str(qg_config)
    log(f"ours, q_gated             {r['ours_q_gated_ms']:.3f} ms")
    del o_qg
    r["speedup"] = r["fla_pair_ms"] / r["ours_ms"]
    r["best_config"] = str(best)
    # the bytes ours must move: q, kg, w (bf16), gk (fp32), Aqk, u in; o out
    nbytes = (3 * q.numel() * 2 + gk.numel() * 4 + Aqk.numel() * 2 + u.numel() * 2 + o.numel() * 2)
    r["ours_unique_gb"] = nbytes / 1e9
    r["ours_tbps"] = nbytes / r["ours_ms"] / 1e9
    log(f"ours moves >= {nbytes / 1e9:.2f} GB: {r['ours_tbps']:.2f} TB/s")
    log("  every configuration of ours:")
    r["per_config_ms"] = per_config(lambda c: ours(config=c))
    r["errors"] = err
    return r


def gdn_rows(B=8, T=8192, H=16, HV=16, K=128, V=128) -> dict:
    from fla.ops.common.chunk_delta_h import chunk_gated_delta_rule_fwd_h
    from fla.ops.common.chunk_o import chunk_fwd_o
    from fla.ops.gated_delta_rule.chunk_fwd import chunk_gated_delta_rule_fwd_intra
    from fla.ops.utils import chunk_local_cumsum
    from fla.ops.utils.constant import RCP_LN2

    from kernel_fun._delta._kernels.state_scan_fwd import state_scan_fwd, state_scan_fwd_kernel_tuned

    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    q = F.normalize(torch.randn(B, T, H, K, device=dev), dim=-1).to(dt)
    k = F.normalize(torch.randn(B, T, H, K, device=dev), dim=-1).to(dt)
    v = torch.randn(B, T, HV, V, device=dev, dtype=dt)
    beta = torch.randn(B, T, HV, device=dev).sigmoid().to(dt)
    g_raw = F.logsigmoid(torch.randn(B, T, HV, device=dev)) / 4
    scale = K ** -0.5
    g = chunk_local_cumsum(g_raw, chunk_size=64, scale=RCP_LN2)
    w, u, _ = chunk_gated_delta_rule_fwd_intra(k=k, v=v, g=g, beta=beta, chunk_size=64)
    torch.cuda.synchronize()
    log(f"GDN inputs built: B={B} T={T} H={H} HV={HV} K={K} V={V}")

    def fla_pair():
        h, vn, ht = chunk_gated_delta_rule_fwd_h(k=k, w=w, u=u, g=g, output_final_state=True, chunk_size=64)
        return chunk_fwd_o(q=q, k=k, v=vn, h=h, g=g, scale=scale, chunk_size=64), ht

    def ours(**kw):
        return state_scan_fwd(q, k, w, u, g=g, scale=scale, output_final_state=True, **kw)

    o_fla, ht_fla = fla_pair()
    t = time.time()
    o, ht, _, _ = ours()
    torch.cuda.synchronize()
    log(f"ours compiled + autotuned in {time.time() - t:.1f}s; best {state_scan_fwd_kernel_tuned.best_config}")
    err = {"o_vs_fla": rel(o, o_fla), "final_state_vs_fla": rel(ht, ht_fla)}
    log(f"ours vs fla: o rel rms {err['o_vs_fla']:.2e}, final state {err['final_state_vs_fla']:.2e}")
    r = {"shape": dict(B=B, T=T, H=H, HV=HV, K=K, V=V, dtype="bfloat16", output_final_state=True)}
    r["fla_pair_ms"] = bench(fla_pair)
    log(f"fla fwd_h + chunk_fwd_o   {r['fla_pair_ms']:.3f} ms")
    r["ours_ms"] = bench(ours)
    log(f"ours                      {r['ours_ms']:.3f} ms  ({r['fla_pair_ms'] / r['ours_ms']:.2f}x)")
    r["speedup"] = r["fla_pair_ms"] / r["ours_ms"]
    r["best_config"] = str(state_scan_fwd_kernel_tuned.best_config)
    log("  every configuration of ours:")
    r["per_config_ms"] = per_config(lambda c: ours(config=c))
    r["errors"] = err
    return r


def main() -> int:
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_json", nargs="?", default="delta_scan_bench.json")
    ap.add_argument("--no-gdn", action="store_true", help="KDA rows only")
    ap.add_argument("--qg-autotune", action="store_true", help="autotune the q_gated row too")
    args = ap.parse_args()
    out_path = args.out_json
    if not torch.cuda.is_available():
        print("delta_scan_bench: needs a CUDA device", file=sys.stderr)
        return 2
    import fla

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    except Exception:
        sha = ""
    rec = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__, "triton": triton.__version__,
        "fla": getattr(fla, "__version__", "?"), "git_sha": sha,
        "timing": "triton.testing.do_bench median, warmup 25 ms, rep 200 ms",
    }
    log(f"{rec['gpu']}, torch {rec['torch']}, triton {rec['triton']}, fla {rec['fla']}, sha {sha[:10]}")
    rec["copy_tbps"] = copy_tbps()
    log(f"device copy: {rec['copy_tbps']:.2f} TB/s")
    rows = {}
    families = [("kda", lambda: kda_rows(qg_autotune=args.qg_autotune))]
    if not args.no_gdn:
        families.append(("gdn", gdn_rows))
    for name, fn in families:
        try:
            rows[name] = fn()
        except Exception as e:  # report and keep what was measured
            import traceback
            traceback.print_exc()
            rows[name] = {"error": f"{type(e).__name__}: {e}"}
        torch.cuda.empty_cache()
        with open(out_path, "w") as f:  # write after each family: a later failure keeps this one
            json.dump({**rec, "rows": rows}, f, indent=2, default=str)
    log(f"wrote {out_path}")
    return 0 if all("error" not in r for r in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
