#!/usr/bin/env python
"""Where gdn's host time per call goes (the latency case B=1 T=4096 is host-bound for ours and
fla's alike: docs/gdn.md), so the next cut aims at the right thing.

    python tools/gdn_host.py out.json [B=1,T=4096,H=16,HV=16]   # a GPU: see below
    python tools/gdn_host.py --cpu                             # no GPU: our own Python only

GPU: host time per call (``harness.host_us``: bursts of calls from an idle GPU) of the forward and
of forward + backward, ours and fla's (fla's backward refusal bypassed as in the bench), the GPU
time per call beside it (``median_ms``), the host time of one bare launch of each kernel our chain
runs and of fla's stage functions it calls (what a launch costs, apart from the chain around it),
and a cProfile of 50 of our forward + backward calls (top functions by own time), all printed and
written to the JSON path.

--cpu: the public forward and forward + backward with every Triton launch and fla's stage
functions stubbed (empty outputs of the right shape): the entry, the classification, the
autograd Function and the chain's Python, on this CPU (2026-12-02, the shared 2-core box: 84 us
forward, 272 us forward + backward).
"""
from __future__ import annotations

import cProfile
import io
import json
import os
import pstats
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

SHAPE = dict(B=1, T=4096, H=16, HV=16, K=128, V=128)


def _layer_call(fn, t, **kw):
    return fn(t["q"], t["k"], t["v"], t["g"], t["beta"], use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True,
              state_v_first=True, use_gate_in_kernel=True, A_log=t["A_log"], dt_bias=t["dt_bias"], **kw)[0]


def _profile(fn, n=50, top=40) -> str:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        fn()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    return buf.getvalue()


def cpu() -> None:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # CPU tensors pass the tensor gate
    import torch

    from kernel_fun import gdn
    from kernel_fun._common.compat import fla_symbol
    from kernel_fun._delta import inputs
    from kernel_fun._delta._kernels import state_scan_bwd, state_scan_fwd
    from kernel_fun.gdn import chain
    from kernel_fun.gdn._kernels import inputs_bwd, inputs_fwd, scores, wy_dqk_bwd, wy_dv_bwd, wy_inverse

    for m in (state_scan_fwd, state_scan_bwd, scores, wy_dv_bwd, wy_dqk_bwd, inputs_fwd, inputs_bwd, wy_inverse):
        m.launch = lambda *a, **k: None

    stubs = {
        ("fla.modules.norm.l2norm", "l2norm_fwd"): lambda x, **_: (torch.empty_like(x),
                                                                     torch.empty(x.shape[:-1])),
        ("fla.modules.norm.l2norm", "l2norm_bwd"): lambda y, rstd, dy, **_: torch.empty_like(dy),
        ("fla.ops.common.gate", "fused_beta_sigmoid_fwd"): lambda beta, **_: torch.empty_like(beta),
        ("fla.ops.common.gate", "fused_beta_sigmoid_bwd"): lambda beta, db, **_: torch.empty_like(beta),
        ("fla.ops.gated_delta_rule.gate", "gdn_gate_chunk_cumsum"): lambda g, A_log, **_: torch.empty(g.shape),
        ("fla.ops.gated_delta_rule.gate", "gdn_gate_bwd"): lambda g, A_log, dt_bias, dyg: (
            torch.empty_like(g), torch.empty_like(A_log), torch.empty_like(dt_bias)),
    }
    chain._fla = inputs._fla = lambda mod, sym: stubs.get((mod, sym)) or fla_symbol(mod, sym)
    B, T, H, HV, K, V = 1, 128, 2, 4, 128, 128

    def r(*s, dt=torch.float16):
        return torch.randn(*s).to(dt).requires_grad_()

    t = dict(q=r(B, T, H, K), k=r(B, T, H, K), v=r(B, T, HV, V), g=r(B, T, HV), beta=r(B, T, HV),
             A_log=r(HV, dt=torch.float32), dt_bias=r(HV, dt=torch.float32))
    do = torch.randn(B, T, HV, V).half()
    leaves = list(t.values())

    def fwd():
        return _layer_call(gdn.chunk_gated_delta_rule, t)

    def fwdbwd():
        torch.autograd.grad(fwd(), leaves, do)

    def best_us(fn, n=300, rounds=7):
        for _ in range(50):
            fn()
        best = float("inf")
        for _ in range(rounds):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            best = min(best, (time.perf_counter() - t0) / n * 1e6)
        return best

    print(f"CPU, launches and fla stubbed: forward {best_us(fwd):.1f} us, forward + backward "
          f"{best_us(fwdbwd):.1f} us of our own Python a call")
    print(_profile(fwd, n=300, top=30))
    print(_profile(fwdbwd, n=300, top=25))


def gpu(path: str | None, shape: dict) -> None:
    import torch
    import triton

    from kernel_fun import gdn
    from kernel_fun._common.compat import fla_symbol
    from kernel_fun.bench.gdn import _inputs, fla_refusal_bypassed
    from kernel_fun.bench.harness import host_us, median_ms

    fla_op = fla_symbol("fla.ops.gated_delta_rule", "chunk_gated_delta_rule")
    t = _inputs(**shape)
    leaves = list(t.values())
    do = torch.randn(shape["B"], shape["T"], shape["HV"], shape["V"], device="cuda", dtype=torch.bfloat16)
    out = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
               git_sha=os.environ.get("KERNEL_FUN_GIT_SHA", "unknown"), shape=shape, rows=[])

    def row(name, fn):
        fn()
        torch.cuda.synchronize()
        r = dict(name=name, host_us=round(host_us(fn), 1), gpu_ms=round(median_ms(fn), 4))
        out["rows"].append(r)
        print(f"{name:34s} host {r['host_us']:8.1f} us   timed {r['gpu_ms'] * 1e3:8.1f} us", flush=True)

    def bypassed(f):
        def run():
            with fla_refusal_bypassed():
                return f()
        return run

    for who, fn in (("ours", gdn.chunk_gated_delta_rule), ("fla", fla_op)):
        row(f"{who} forward", lambda fn=fn: _layer_call(fn, t))
        fb = lambda fn=fn: torch.autograd.grad(_layer_call(fn, t), leaves, do)  # noqa: E731
        row(f"{who} forward + backward", bypassed(fb) if who == "fla" else fb)
    # one bare launch of each stage the chain runs (their arguments made once, outside)
    from kernel_fun._delta import inputs
    q = t["q"].detach()
    row("fla l2norm_fwd (one tensor)", lambda: inputs._fla("fla.modules.norm.l2norm", "l2norm_fwd")(q))
    row("torch.empty_like (floor)", lambda: torch.empty_like(q))
    prof = _profile(lambda: torch.autograd.grad(_layer_call(gdn.chunk_gated_delta_rule, t), leaves, do))
    out["profile_ours_fwdbwd"] = prof
    print(prof, flush=True)
    if path:
        with open(path, "w") as f:
            json.dump(out, f, indent=1)


def main() -> None:
    if "--cpu" in sys.argv:
        return cpu()
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    shape = dict(SHAPE)
    for a in args[1:]:
        shape.update({k: int(v) for k, v in (kv.split("=") for kv in a.split(","))})
    gpu(args[0] if args else None, shape)


if __name__ == "__main__":
    main()
