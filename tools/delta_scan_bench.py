#!/usr/bin/env python
"""Bench: the fused forward state scan vs fla's fwd_h + fwd_o, and the backward state scan vs
fla's dhu, on one GPU.

    python scripts/delta_scan_bench.py out.json [--no-gdn] [--no-b16] [--all-configs]

KDA at B=8 (then B=16), T=8192, H=HV=16, K=128, V=256 bf16 (the baseline shape): the scan's
inputs come from fla's own KDA forward stages (``kda_gate_chunk_cumsum`` with A_log/dt_bias,
then ``chunk_kda_fwd_intra(disable_recompute=True)``, which also returns qg), then fla's
``chunk_gated_delta_rule_fwd_h`` + ``chunk_gla_fwd_o_gk`` and our ``state_scan_fwd`` run side
by side (``triton.testing.do_bench`` medians). Each configuration of ours is forced (no
autotune: the best of them is what the autotuner would pick), checked against fla's o and
final state, then timed: every value-major (VK) one and the three best key-major ones of
2026-11-30 (all with ``--all-configs``). At B=8 also: q_gated (qg precomputed) and
save_h/save_v_new (h, v_new vs fla). Then GDN at K=V=128 (fla's fwd_h + ``chunk_fwd_o``).
Prints as it goes; writes one JSON to argv[1] after each row. About 3 minutes, mostly
compilation.
"""
from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
import triton

from kda_inputs import production_inputs, qkv_beta  # noqa: E402  (a sibling script module)
from kernel_fun._common.numerics import rel_rms as rel

T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def bench(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")



def copy_tbps() -> float:
    """Device-to-device copy bandwidth (bytes read + written), the ceiling of this run."""
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    ms = bench(lambda: y.copy_(x))
    return 2 * x.numel() / ms / 1e9


def per_config(run_with, configs, check=None) -> dict:
    """Time each configuration (forced, no autotune); with ``check``, compare its outputs to
    fla's first (``check(outputs) -> dict of rel errors``)."""
    from kernel_fun._delta._kernels.state_scan_fwd import config_name
    out = {}
    for c in configs:
        name = config_name(c)
        try:
            t = time.time()
            res = run_with(c)
            torch.cuda.synchronize()
            errs = check(res) if check else {}
            del res
            ms = bench(lambda: run_with(c))
            out[name] = {"ms": round(ms, 4), **{k: float(f"{v:.3g}") for k, v in errs.items()}}
            err_s = " ".join(f"{k} {v:.1e}" for k, v in errs.items())
            log(f"    {name:22s} {ms:.3f} ms  {err_s}  (ready in {time.time() - t:.1f}s)")
        except Exception as e:  # a config that does not fit (shared memory) is reported, not fatal
            out[name] = f"error: {type(e).__name__}: {str(e)[:120]}"
            log(f"    {name}: {out[name]}")
    return out


def _selected(V: int, all_configs: bool):
    """Every value-major (VK) configuration, and the key-major ones measured best on
    2026-11-30 (all of them with --all-configs); none wider than V."""
    from kernel_fun._delta._kernels.state_scan_fwd import CANDIDATES, CONFIGS, config_name
    keep = {"BV128-w8-s2-rNone", "BV64-w4-s2-rNone", "BV64-w4-s1-r128"}
    return [c for c in CONFIGS + CANDIDATES if c.kwargs["BV"] <= V
            and (all_configs or c.kwargs["VK"] or config_name(c) in keep)]


def _best(rows: dict) -> tuple[str, float]:
    ok = {k: v["ms"] for k, v in rows.items() if isinstance(v, dict)}
    k = min(ok, key=ok.get)
    return k, ok[k]


def kda_rows(B=8, T=8192, H=16, HV=16, K=128, V=256, full=True, all_configs=False) -> dict:
    from fla.ops.common.chunk_delta_h import chunk_gated_delta_rule_fwd_h
    from fla.ops.gla.chunk import chunk_gla_fwd_o_gk
    from fla.ops.kda.chunk_intra import chunk_kda_fwd_intra

    from kernel_fun._delta._kernels.state_scan_fwd import state_scan_fwd

    q, k, v, beta, gk, scale = production_inputs(B, T, H, HV, K, V)
    # disable_recompute=True also returns qg = q * exp2(gk) (for the q_gated row)
    w, u, qg, kg, Aqk, _ = chunk_kda_fwd_intra(q=q, k=k, v=v, gk=gk, beta=beta, scale=scale, chunk_size=64,
                                               disable_recompute=True)
    del v
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

    def ours_qg(**kw):
        return state_scan_fwd(qg, kg, w, u, gk=gk, Aqk=Aqk, scale=scale, output_final_state=True, q_gated=True, **kw)

    def check(res):
        return {"o": rel(res[0], o_fla), "ht": rel(res[1], ht_fla)}

    r = {"shape": dict(B=B, T=T, H=H, HV=HV, K=K, V=V, dtype="bfloat16", initial_state=False,
                       output_final_state=True)}
    r["fla_fwd_h_ms"] = bench(fla_h)
    r["fla_fwd_o_ms"] = bench(fla_o)
    r["fla_pair_ms"] = bench(fla_pair)
    log(f"fla fwd_h {r['fla_fwd_h_ms']:.3f} ms + chunk_gla_fwd_o_gk {r['fla_fwd_o_ms']:.3f} ms; "
        f"pair {r['fla_pair_ms']:.3f} ms")
    # the bytes ours must move: q, kg, w (bf16), gk (fp32), Aqk, u in; o out
    nbytes = (3 * q.numel() * 2 + gk.numel() * 4 + Aqk.numel() * 2 + u.numel() * 2 + u.numel() * 2)
    r["ours_unique_gb"] = nbytes / 1e9
    log(f"  ours, every configuration (o, final state vs fla); >= {nbytes / 1e9:.2f} GB to move:")
    r["per_config"] = per_config(lambda c: ours(config=c), _selected(V, all_configs), check)
    name, ms = _best(r["per_config"])
    r["best_config"], r["ours_ms"], r["speedup"] = name, ms, r["fla_pair_ms"] / ms
    r["ours_tbps"] = nbytes / ms / 1e9
    log(f"ours best {name}: {ms:.3f} ms ({r['speedup']:.2f}x fla, {r['ours_tbps']:.2f} TB/s)")
    r.update(dhu_rows(qg, kg, w, gk, u, scale))
    if full:
        from kernel_fun._delta._kernels.state_scan_fwd import CANDIDATES, CONFIGS, config_name
        byname = {config_name(c): c for c in CONFIGS + CANDIDATES}
        log("  q_gated (qg from chunk_kda_fwd_intra(disable_recompute=True)), o and final state vs fla:")
        qg_cf = [c for c in _selected(V, False) if c.kwargs["VK"] and c.kwargs["BV"] >= 64
                 or config_name(c) == "BV128-w8-s2-rNone"]
        r["q_gated_per_config"] = per_config(lambda c: ours_qg(config=c), qg_cf, check)
        r["q_gated_best_config"], r["ours_q_gated_ms"] = _best(r["q_gated_per_config"])
        log(f"ours q_gated best {r['q_gated_best_config']}: {r['ours_q_gated_ms']:.3f} ms")
        log("  saving h and v_new (the backward's recompute), h and v_new vs fla:")

        def check_saves(res):
            return {"o": rel(res[0], o_fla), "ht": rel(res[1], ht_fla), "h": rel(res[2], h), "v_new": rel(res[3], v_new)}
        sv = [byname[name]] + ([byname["BV128-w8-s2-rNone"]] if name != "BV128-w8-s2-rNone" else [])
        r["save_h_v_new_per_config"] = per_config(lambda c: ours(config=c, save_h=True, save_v_new=True), sv, check_saves)
    return r


def dhu_rows(qg, kg, w, gk, u, scale) -> dict:
    """The backward state scan: fla's chunk_gated_delta_rule_bwd_dhu against ours, every
    configuration forced and checked against fla (dh, dh0, dv2), on the KDA chain's tensors
    (do, dv and dht random: the timing does not depend on their values)."""
    from fla.ops.common.chunk_delta_h import chunk_gated_delta_rule_bwd_dhu

    from kernel_fun._delta._kernels import state_scan_bwd as sb

    gen = torch.Generator(device="cuda").manual_seed(3)
    B, _, HV, K = w.shape
    V = u.shape[-1]
    kw = dict(q=qg, k=kg, w=w, gk=gk, do=torch.randn(u.shape, device="cuda", generator=gen).to(u.dtype),
              dv=torch.randn(u.shape, device="cuda", generator=gen).to(u.dtype),
              h0=torch.zeros(B, HV, K, V, device="cuda"), dht=torch.randn(B, HV, K, V, device="cuda", generator=gen),
              scale=scale, chunk_size=64)
    want = chunk_gated_delta_rule_bwd_dhu(**kw)
    r = {"fla_dhu_ms": bench(lambda: chunk_gated_delta_rule_bwd_dhu(**kw))}
    log(f"fla chunk_gated_delta_rule_bwd_dhu {r['fla_dhu_ms']:.3f} ms; ours, every configuration (vs fla):")

    def check(res):
        return {n: rel(o, f) for n, o, f in zip(("dh", "dh0", "dv2"), res, want)}

    r["dhu_per_config"] = rows = per_config(lambda c: sb.state_scan_bwd(**kw, config=c), sb.CONFIGS + sb.CANDIDATES, check)
    good = {k: v for k, v in rows.items() if isinstance(v, dict) and max(v[n] for n in ("dh", "dh0", "dv2")) < 1e-2}
    if good:
        name, ms = _best(good)
        r.update(dhu_best_config=name, ours_dhu_ms=ms, dhu_speedup=r["fla_dhu_ms"] / ms)
        log(f"ours dhu best {name}: {ms:.3f} ms ({r['dhu_speedup']:.2f}x fla)")
    return r


def gdn_rows(B=8, T=8192, H=16, HV=16, K=128, V=128, all_configs=False) -> dict:
    from fla.ops.common.chunk_delta_h import chunk_gated_delta_rule_fwd_h
    from fla.ops.common.chunk_o import chunk_fwd_o
    from fla.ops.gated_delta_rule.chunk_fwd import chunk_gated_delta_rule_fwd_intra
    from fla.ops.utils import chunk_local_cumsum
    from fla.ops.utils.constant import RCP_LN2

    from kernel_fun._delta._kernels.state_scan_fwd import state_scan_fwd

    q, k, v, beta = qkv_beta(B, T, H, HV, K, V)
    g_raw = F.logsigmoid(torch.randn(B, T, HV, device="cuda")) / 4
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

    def check(res):
        return {"o": rel(res[0], o_fla), "ht": rel(res[1], ht_fla)}

    r = {"shape": dict(B=B, T=T, H=H, HV=HV, K=K, V=V, dtype="bfloat16", output_final_state=True)}
    r["fla_pair_ms"] = bench(fla_pair)
    log(f"fla fwd_h + chunk_fwd_o   {r['fla_pair_ms']:.3f} ms")
    r["per_config"] = per_config(lambda c: ours(config=c), _selected(V, all_configs), check)
    name, ms = _best(r["per_config"])
    r["best_config"], r["ours_ms"], r["speedup"] = name, ms, r["fla_pair_ms"] / ms
    log(f"ours best {name}: {ms:.3f} ms ({r['speedup']:.2f}x fla)")
    return r


def main() -> int:
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_json", nargs="?", default="delta_scan_bench.json")
    ap.add_argument("--no-gdn", action="store_true", help="KDA rows only")
    ap.add_argument("--all-configs", action="store_true",
                    help="every key-major configuration too (about 1 minute more)")
    ap.add_argument("--no-b16", action="store_true", help="skip the KDA row at B=16")
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
    families = [("kda", lambda: kda_rows(all_configs=args.all_configs))]
    if not args.no_b16:
        families.append(("kda_b16", lambda: kda_rows(B=16, full=False, all_configs=args.all_configs)))
    if not args.no_gdn:
        families.append(("gdn", lambda: gdn_rows(all_configs=args.all_configs)))
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
