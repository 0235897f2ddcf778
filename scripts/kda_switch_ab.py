#!/usr/bin/env python
"""A/B of the KDA chain's switches, end to end on one GPU: ``kda.chunk_kda`` fwd+bwd (the
production call: l2norm and gate in the op) with each combination of the intra-backward
epilogue fusions (chain.FUSE_L2NORM_BWD, FUSE_DG_CUMSUM, FUSE_GATE_BWD), of the WY pieces made
in the forward scan (chain.FUSE_WY_FWD, "wyf"), and of the switchable stages (our backward
state scan "dhu", our forward intra scores "ifwd" (with "wyf"), our whole forward intra stage
"fwdi", our one gate pass "gbwd", or fla's), the intra backward's one anchor ("ianc"), the WY + intra backward kernel
("wyi"), dv made inside our dhu ("dvd", with "dhu") and the score gradient made in our WY
stage ("daqk", with "dvd"), against the chain as it ships.

    python scripts/kda_switch_ab.py out.json [--B 16] [--combos off,l2+dhu,...]

Each combination is checked against the shipped chain's o and gradients (relative RMS) before
it is timed (``triton.testing.do_bench`` medians of the whole autograd fwd+bwd, and of the
forward alone with inputs that require grad); the peak memory of one fwd+bwd is recorded as
``kernel-fun bench`` measures it. fla's own
chunk_kda is not run here: this picks the defaults; ``kernel-fun bench`` measures them against
fla afterwards. Prints as it goes; the JSON at argv[1] is rewritten after each combination.
"""
from __future__ import annotations

import argparse
import datetime
import json
import time

import torch
import triton

T0 = time.time()
COMBOS = {
    "off": (),
    "l2": ("l2norm",),
    "l2+wyf": ("l2norm", "wyf"),
    "l2+dhu": ("l2norm", "dhu"),
    "l2+wyf+dhu": ("l2norm", "wyf", "dhu"),
    "l2+fwdi": ("l2norm", "fwdi"),
    "l2+fwdi+dhu": ("l2norm", "fwdi", "dhu"),
    "l2+ifwd+wyf": ("l2norm", "ifwd", "wyf"),
    "l2+wyi": ("l2norm", "wyi"),
    "l2+ianc": ("l2norm", "ianc"),
    "l2+ianc+wyi": ("l2norm", "ianc", "wyi"),
    "l2+ianc+wyi+dhu": ("l2norm", "ianc", "wyi", "dhu"),
    "l2+ianc+dhu": ("l2norm", "ianc", "dhu"),
    "l2+dhu+dvd": ("l2norm", "dhu", "dvd"),
    "l2+dhu+dvd+gbwd": ("l2norm", "dhu", "dvd", "gbwd"),
    "l2+ianc+dhu+dvd+gbwd": ("l2norm", "ianc", "dhu", "dvd", "gbwd"),
    "l2+dhu+gbwd": ("l2norm", "dhu", "gbwd"),
    "l2+ianc+dhu+dvd": ("l2norm", "ianc", "dhu", "dvd"),
    "l2+dhu+dvd+daqk": ("l2norm", "dhu", "dvd", "daqk"),
    "l2+ianc+dhu+dvd+daqk": ("l2norm", "ianc", "dhu", "dvd", "daqk"),
    "l2+wyi+dhu": ("l2norm", "wyi", "dhu"),
    "l2+cs+dhu": ("l2norm", "dg_cumsum", "dhu"),
    "l2+cs+gate+dhu": ("l2norm", "dg_cumsum", "gate", "dhu"),
}
# the chain's boolean switches a combination turns on, by a short name
SWITCHES = {"l2norm": "FUSE_L2NORM_BWD", "dg_cumsum": "FUSE_DG_CUMSUM", "gate": "FUSE_GATE_BWD",
            "wyf": "FUSE_WY_FWD", "wyi": "FUSE_WY_INTRA_BWD", "ianc": "INTRA_BWD_ONE_ANCHOR",
            "dvd": "FUSE_DV_DHU", "daqk": "FUSE_DAQK_WY"}
# stages of ours a combination can take out (back to fla's) or put in, by a short name:
# chain.STAGES and chain.CANDIDATE_STAGES
SWITCHABLE_STAGES = {"dhu": "state_scan_bwd", "ifwd": "intra_fwd", "fwdi": "fwd_intra", "gbwd": "gate_bwd"}


def shipped_setup(chain) -> dict:
    """The chain as it ships: every switch's value by its chain name, and ``stages``."""
    return {**{n: getattr(chain, n) for n in SWITCHES.values()}, "stages": dict(chain.STAGES)}


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def set_switches(chain, shipped: dict, parts) -> None:
    """Exactly ``parts`` on (every other switch and switchable stage off); ``parts=None``: the
    chain as it ships."""
    for short, name in SWITCHES.items():
        setattr(chain, name, shipped[name] if parts is None else short in parts)
    if parts is None:
        chain.STAGES = dict(shipped["stages"])
        return
    ours = {**shipped["stages"], **chain.CANDIDATE_STAGES}
    off = {stage for short, stage in SWITCHABLE_STAGES.items() if short not in parts}
    chain.STAGES = {n: f for n, f in shipped["stages"].items() if n not in off}
    for short, stage in SWITCHABLE_STAGES.items():
        if short in parts:
            chain.STAGES[stage] = ours[stage]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out_json")
    ap.add_argument("--combos", default=",".join(COMBOS))
    for n, d in dict(B=16, T=8192, H=16, HV=16, K=128, V=256).items():
        ap.add_argument(f"--{n}", type=int, default=d)
    a = ap.parse_args()

    from kernel_fun import kda
    from kernel_fun._common.numerics import rel_rms as rel
    from kernel_fun.bench.kda import _inputs, _peak_mb
    from kernel_fun.kda import chain

    shipped = shipped_setup(chain)
    t = _inputs(a.B, a.T, a.H, a.HV, a.K, a.V)
    do = torch.randn(a.B, a.T, a.HV, a.V, device="cuda", dtype=torch.bfloat16)
    leaves = [t[n] for n in ("q", "k", "v", "g", "beta", "A_log", "dt_bias")]
    names = ("o", "dq", "dk", "dv", "dg", "dbeta", "dA_log", "ddt_bias")

    def fwd():  # as in training: the inputs require grad, so the forward saves for backward
        return kda.chunk_kda(t["q"], t["k"], t["v"], t["g"], t["beta"], A_log=t["A_log"],
                             dt_bias=t["dt_bias"], use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True)[0]

    def fwdbwd():
        o = fwd()
        return (o, *torch.autograd.grad(o, leaves, do))

    rec = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "gpu": torch.cuda.get_device_name(),
           "shape": dict(B=a.B, T=a.T, H=a.H, HV=a.HV, K=a.K, V=a.V, dtype="bfloat16"),
           "shipped": {k: v for k, v in shipped.items() if k != "stages"} | {"stages": sorted(shipped["stages"])},
           "rows": {}}
    set_switches(chain, shipped, None)
    want = dict(zip(names, fwdbwd()))
    log("shipped chain compiled")
    for name in a.combos.split(","):
        parts = COMBOS[name]
        set_switches(chain, shipped, parts)
        got = dict(zip(names, fwdbwd()))
        errs = {k: float(f"{rel(got[k], want[k]):.2e}") for k in names}
        del got
        ms = triton.testing.do_bench(fwdbwd, warmup=5, rep=400, return_mode="median")
        fms = triton.testing.do_bench(fwd, warmup=5, rep=200, return_mode="median")
        peak = _peak_mb(fwdbwd)  # as kernel-fun bench measures it (its record's peak_MB)
        rec["rows"][name] = {"fwdbwd_ms": round(ms, 4), "fwd_ms": round(fms, 4), "peak_MB": peak,
                             "rel_err_vs_shipped": errs}
        log(f"{name:16s} fwd+bwd {ms:8.3f} ms  fwd {fms:7.3f} ms  peak {peak:9.1f} MB  vs shipped {errs}")
        with open(a.out_json, "w") as f:
            json.dump(rec, f, indent=1)
    base = rec["rows"].get("off", {}).get("fwdbwd_ms")
    if base:
        fbase = rec["rows"]["off"]["fwd_ms"]
        for name, r in rec["rows"].items():
            log(f"{name:16s} saves {base - r['fwdbwd_ms']:6.3f} ms fwd+bwd, {fbase - r['fwd_ms']:6.3f} ms fwd")


if __name__ == "__main__":
    main()
