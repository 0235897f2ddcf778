"""kda benchmark cases (the production call by default), peak memory, per-stage profile."""
from __future__ import annotations

import functools

from .harness import Case, Direction

PROD = dict(T=8192, H=16, HV=16, K=128, V=256)
# `--shape` keys (a custom case: the production shape at B=8 with these replaced)
SHAPE_KEYS = {"B": "batch (8)", "T": "tokens (8192)", "H": "q/k heads (16)", "HV": "v heads (16)",
              "K": "key dim (128)", "V": "value dim (256)"}


KERNELS = {
    "kda.intra_bwd": "the intra-chunk backward (l2norm backward fused when HV == H)",
    "kda.wy_bwd": "the WY backward: dq, dk, dv, dbeta, dg, dAkk",
    "kda.gate_bwd": "dg's reverse cumsum and the gate's backward in one pass",
    "delta.state_scan_fwd": "the forward state scan making o",
    "delta.state_scan_bwd": "the backward state scan making dv",
    "delta.score_grad": "the score gradient dAqk",
}


def _inputs(B, T, H, HV, K, V, seed=0):
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)

    def r(*s, dt=torch.bfloat16):
        return torch.randn(*s, device="cuda", generator=gen).to(dt).requires_grad_()

    return dict(q=r(B, T, H, K), k=r(B, T, H, K), v=r(B, T, HV, V), g=r(B, T, HV, K),
                beta=torch.rand(B, T, HV, device="cuda", generator=gen).to(torch.bfloat16).requires_grad_(),
                A_log=r(HV, dt=torch.float32), dt_bias=r(HV * K, dt=torch.float32))


def _peak_mb(fn) -> float:
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return round((torch.cuda.max_memory_allocated() - base) / 2**20, 1)


def stage_profile(fn, reps: int = 3) -> dict:
    """Kernel time per kernel name (ms per call) over ``reps`` calls, from torch.profiler."""
    import torch

    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    table = {}
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t:
            table[e.key] = round(t / 1e3 / reps, 4)
    return dict(sorted(table.items(), key=lambda kv: -kv[1]))


# The stages of the shipped KDA chain that are ours (kda/chain.py), so a record says what it measured.
OUR_STAGES = ("gate_bwd", "intra_bwd", "score_grad", "state_scan_bwd", "state_scan_fwd", "wy_bwd")


def chain_setup() -> dict:
    """Which stages of the KDA chain are ours (kda/chain.py runs one fixed pipeline)."""
    return {"stages_ours": list(OUR_STAGES)}


def _case(name, B, T, H, HV, K, V, cu_seqlens=None, profile=False):
    import torch

    from .. import kda
    from .._common.compat import fla_symbol
    from .._common.numerics import rel_rms as rel

    fla_kda = fla_symbol("fla.ops.kda", "chunk_kda")
    t = _inputs(B, T, H, HV, K, V)
    do = torch.randn(B, T, HV, V, device="cuda", dtype=torch.bfloat16)
    leaves = [t[n] for n in ("q", "k", "v", "g", "beta", "A_log", "dt_bias")]

    def call(fn):
        return fn(t["q"], t["k"], t["v"], t["g"], t["beta"], A_log=t["A_log"], dt_bias=t["dt_bias"],
                  use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, cu_seqlens=cu_seqlens)[0]

    def fwdbwd(fn):
        return lambda: torch.autograd.grad(call(fn), leaves, do)

    import sys
    import time

    t0 = time.perf_counter()

    def say(what):
        print(f"  [{name} {time.perf_counter() - t0:6.1f}s] {what}", file=sys.stderr, flush=True)

    # parity with fla on this shape (relative RMS of o and of each gradient)
    o_ours, o_fla = call(kda.chunk_kda), call(fla_kda)
    g_ours = torch.autograd.grad(o_ours, leaves, do)
    g_fla = torch.autograd.grad(o_fla, leaves, do)
    say("compiled, autotuned, parity computed")

    parity = {"o": rel(o_ours, o_fla)}
    for n, a, b in zip(("dq", "dk", "dv", "dg", "dbeta", "dA_log", "ddt_bias"), g_ours, g_fla):
        parity[n] = rel(a, b)
    del o_ours, o_fla, g_ours, g_fla
    extra = {"rel_err_vs_fla": {k: float(f"{v:.3e}") for k, v in parity.items()},
             "peak_MB": {"ours": _peak_mb(fwdbwd(kda.chunk_kda)), "fla": _peak_mb(fwdbwd(fla_kda))},
             "chain": chain_setup()}
    say(f"peak memory {extra['peak_MB']}")
    if profile:
        extra["stages_ms"] = {"ours": stage_profile(fwdbwd(kda.chunk_kda)),
                              "fla": stage_profile(fwdbwd(fla_kda))}
        extra["stages_ms_fwd"] = {"ours": stage_profile(lambda: call(kda.chunk_kda)),
                                  "fla": stage_profile(lambda: call(fla_kda))}
    # fwd is timed as in training (inputs require grad, so the forward saves for backward)
    dirs = [Direction("fwd", lambda: call(kda.chunk_kda), lambda: call(fla_kda)), Direction("fwdbwd", fwdbwd(kda.chunk_kda), fwdbwd(fla_kda), extra=extra)]
    shape = dict(B=B, T=T, H=H, HV=HV, K=K, V=V, dtype="bfloat16", use_qk_l2norm_in_kernel=True,
                 use_gate_in_kernel=True)
    if cu_seqlens is not None:
        shape["cu_seqlens"] = cu_seqlens.tolist()
    return Case("kda", name, shape, dirs, witness=("kda.", "delta."))


def cases(overrides: dict | None = None):
    """(name, build) pairs: the production cases, or one ``custom`` case for ``--shape``."""
    from .cconv import _random_cu_seqlens

    if overrides:
        p = dict(PROD, B=8)
        p.update({k: int(v) for k, v in overrides.items()})
        return [("custom", lambda: _case("custom", **p))]
    return [
        ("prod_b16", lambda: _case("prod_b16", B=16, **PROD, profile=True)),
        ("prod_b8", lambda: _case("prod_b8", B=8, **PROD, profile=True)),
        ("varlen_16docs", lambda: _case("varlen_16docs", 1, 65536, 16, 16, 128, 256,
                                        cu_seqlens=_random_cu_seqlens(65536, 16))),
        ("grouped_h8_hv16", lambda: _case("grouped_h8_hv16", 8, 8192, 8, 16, 128, 256)),
        ("latency_b1_t4096", lambda: _case("latency_b1_t4096", 1, 4096, 16, 16, 128, 256)),
    ]


def _check_inputs(device, B=1, T=100, H=1, HV=2, K=32, V=32, seed=0):
    """Small structured stage inputs: log2 gates cumsummed per 64-token chunk, lower
    triangular A matrices, random states."""
    import torch

    gen = torch.Generator().manual_seed(seed)

    def r(*s):
        return torch.randn(*s, generator=gen)

    g = -torch.rand(B, T, HV, K, generator=gen) * 2.0
    g = torch.cat([c.cumsum(1) for c in g.split(64, dim=1)], dim=1)
    NT = -(-T // 64)
    tri = torch.tril(torch.ones(64, 64))
    A = torch.cat([(r(B, 64, HV, 64) * tri[:, None, :] * 0.1) for _ in range(NT)], 1)[:, :T]
    t = dict(q=r(B, T, H, K), k=r(B, T, H, K) * 0.3, v=r(B, T, HV, V), v_new=r(B, T, HV, V),
             w=r(B, T, HV, K) * 0.1, u=r(B, T, HV, V), kg=r(B, T, HV, K) * 0.3, g=g,
             beta=torch.rand(B, T, HV, generator=gen), A=A, Aqk=A.clone(),
             h=r(B, NT, HV, K, V) * 0.1, dh=r(B, NT, HV, K, V) * 0.1, do=r(B, T, HV, V),
             dv=r(B, T, HV, V), dq=r(B, T, HV, K), dk=r(B, T, HV, K), db=r(B, T, HV),
             dg=r(B, T, HV, K))
    return {k: v.to(device) for k, v in t.items()}


def _compare(failures: list, label: str, pairs, tol: float = 1e-3) -> None:
    """Append ``"<label>: <name> relative error <e>"`` for each (name, ours, reference) whose
    relative RMS error is not below ``tol`` (a NaN fails too)."""
    from .._common.numerics import rel_rms

    for name, a, b in pairs:
        err = rel_rms(a.cpu(), b.cpu())
        if not err < tol:
            failures.append(f"{label}: {name} relative error {err:.2e}")


def _witnessed(failures: list, label: str, kernel: str, fn):
    """Run ``fn()``; a failure line when the launch counter ``kernel`` did not move."""
    from .._common.witness import launches

    before = launches(kernel)
    out = fn()
    if launches(kernel) == before:
        failures.append(f"{label}: our kernel did not run")
    return out


def check(device: str = "cpu") -> list[str]:
    """Interpreted check of our KDA stage kernels against their plain-torch references at a
    small shape (T not a multiple of 64, grouped values), fp32: each stage is called through
    ``kda.chain``'s names, with the arguments the chain passes it."""
    import torch

    from .._common.numerics import rel_rms as rel
    from .._common.witness import launches
    from .._delta.reference import state_scan_bwd_ref, state_scan_fwd_ref
    from ..kda import chain
    from ..kda.reference_stages import (dAv_reference, dg_cumsum_gate_bwd_reference, intra_bwd_reference,
                                        wy_dqkg_bwd_reference)

    t = _check_inputs(device)
    failures = []
    runs = {
        "intra_bwd": (functools.partial(chain.intra_bwd, fast_range=chain.INTRA_BWD_FAST_RANGE), intra_bwd_reference,
                      dict(q=t["q"], k=t["k"], g=t["g"], beta=t["beta"], dAqk=t["A"], dAkk=t["Aqk"],
                           dq=t["dq"], dk=t["dk"], db=t["db"], dg=t["dg"], chunk_size=64)),
        "wy_bwd": (chain.wy_dqkg_bwd, wy_dqkg_bwd_reference,
                   dict(q=t["q"], k=t["k"], v=t["v"], v_new=t["v_new"], g=t["g"], beta=t["beta"],
                        A=t["A"], h=t["h"], do=t["do"], dh=t["dh"], dv=t["dv"], scale=0.3,
                        chunk_size=64)),
    }
    for name, (ours, ref, kw) in runs.items():
        before = launches("kda.")
        got, exp = ours(**kw), ref(**kw)
        if launches("kda.") == before:
            failures.append(f"kda {name}: our kernel did not run")
        for i, (a, b) in enumerate(zip(got, exp)):
            err = rel(a, b)
            if not err < 1e-3:  # tf32 products on the GPU; fp32 exact under the interpreter
                failures.append(f"kda {name}: output {i} relative error {err:.2e}")

    # The forward scan, as the chain calls it: the gated queries qg = q exp2(gk) (HV heads),
    # against the reference fed the raw queries.
    B, T, HV, K = t["w"].shape
    V = t["do"].shape[-1]
    qg = t["q"].repeat_interleave(HV // t["q"].shape[2], 2) * torch.exp2(t["g"])
    kw = dict(k=t["kg"], w=t["w"], u=t["u"], gk=t["g"], Aqk=t["Aqk"], scale=0.3, output_final_state=True)
    o, ht, _, _ = _witnessed(failures, "kda state_scan_fwd", "delta.state_scan_fwd",
                             lambda: chain.state_scan_fwd(qg, **kw, chunk_size=64, q_gated=True))
    o_ref, ht_ref = state_scan_fwd_ref(t["q"], **kw, chunk_size=64)[:2]
    _compare(failures, "kda state_scan_fwd", (("o", o, o_ref), ("final_state", ht, ht_ref)))

    # The score gradient, as the chain calls it: dAqk from v_new and do.
    dA = _witnessed(failures, "kda score_grad", "delta.score_grad",
                    lambda: chain.score_grad_bwd(t["v_new"], t["do"], 0.3, chunk_size=64))
    dA_ref, _ = dAv_reference(t["v_new"], t["do"], t["Aqk"], 0.3, chunk_size=64)
    _compare(failures, "kda score_grad", (("dAqk", dA, dA_ref),))

    # The backward scan, as the chain calls it: gated queries and keys, dv made inside from
    # Aqk; against the reference scan fed the reference intra-chunk dv = tril(Aqk)^T do.
    gen = torch.Generator().manual_seed(1)
    dht = (torch.randn(B, HV, K, V, generator=gen) * 0.1).to(device)
    h0 = torch.zeros(B, HV, K, V, device=device)  # only whether dh0 is wanted
    dh, dh0, dv2 = _witnessed(failures, "kda state_scan_bwd", "delta.state_scan_bwd", lambda: chain.state_scan_bwd(
        q=qg, k=t["kg"], w=t["w"], gk=t["g"], h0=h0, dht=dht, do=t["do"], dv=None, A=t["Aqk"], scale=0.3,
        chunk_size=64))
    _, dv_local = dAv_reference(t["do"], t["do"], t["Aqk"], 0.3, chunk_size=64)
    exp = state_scan_bwd_ref(qg, t["kg"], t["w"], t["do"], dv_local, gk=t["g"], dht=dht, scale=0.3, chunk_size=64)
    _compare(failures, "kda state_scan_bwd", zip(("dh", "dh0", "dv"), (dh, dh0, dv2), exp))

    # The gate pass with the gate in the op: dg's reverse cumsum, then the gate's backward.
    g_raw = (torch.randn(B, T, HV, K, generator=gen) * 8).to(device)  # some past softplus' threshold
    A_log = torch.randn(HV, generator=gen).to(device)
    dt_bias = torch.randn(HV * K, generator=gen).to(device)
    got = _witnessed(failures, "kda gate_bwd", "kda.gate_bwd", lambda: chain.dg_cumsum_gate_bwd(
        t["dg"], g_raw, A_log, dt_bias, chunk_size=64))
    exp = dg_cumsum_gate_bwd_reference(t["dg"], g_raw, A_log, dt_bias, chunk_size=64)
    _compare(failures, "kda gate_bwd", zip(("dg", "dA_log", "ddt_bias"), got, exp))
    return failures
