"""kda benchmark cases (the production call by default), peak memory, per-stage profile."""
from __future__ import annotations

import functools

from .harness import Case, Direction, stage_profile

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


# The stage probes' shapes: the check's (T not a multiple of 64, grouped values, fp32: exact
# under the interpreter) and, for `bench --stages kda` on a GPU, the production heads at B=8 in
# bf16 where the chain passes bf16 (`--shape` replaces any of them).
CHECK_SHAPE = dict(B=1, T=100, H=1, HV=2, K=32, V=32, dtype="float32")
STAGE_SHAPES = {"cpu": CHECK_SHAPE, "cuda": dict(B=8, T=8192, H=16, HV=16, K=128, V=256, dtype="bfloat16")}


def _check_inputs(device, B=1, T=100, H=1, HV=2, K=32, V=32, dtype="float32", seed=0):
    """Small structured stage inputs: log2 gates cumsummed per 64-token chunk, lower
    triangular A matrices, random states; the tensors the chain passes in bf16 in ``dtype``
    (the gates, the WY stage's fp32 gradients and dAqk/dAkk stay fp32). w is scaled so that the
    scans' per-chunk map (I - w^T k) stays contractive at the production T: at 0.1 the backward
    scan's dS grew by about 1e26 over 4096 tokens and was inf/NaN at T = 8192 (every row of
    ``bench --stages kda`` at its GPU shape, 2026-12-04); at 0.02 it stays below 4."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)

    def r(*s):
        return torch.randn(*s, generator=gen, device=device)

    g = -torch.rand(B, T, HV, K, generator=gen, device=device) * 2.0
    g = torch.cat([c.cumsum(1) for c in g.split(64, dim=1)], dim=1)
    NT = -(-T // 64)
    tri = torch.tril(torch.ones(64, 64, device=device))
    A = torch.cat([(r(B, 64, HV, 64) * tri[:, None, :] * 0.1) for _ in range(NT)], 1)[:, :T]
    t = dict(q=r(B, T, H, K), k=r(B, T, H, K) * 0.3, v=r(B, T, HV, V), v_new=r(B, T, HV, V),
             w=r(B, T, HV, K) * 0.02, u=r(B, T, HV, V), kg=r(B, T, HV, K) * 0.3, g=g,
             beta=torch.rand(B, T, HV, generator=gen, device=device), A=A, Aqk=A.clone(),
             h=r(B, NT, HV, K, V) * 0.1, dh=r(B, NT, HV, K, V) * 0.1, do=r(B, T, HV, V),
             dv=r(B, T, HV, V), dq=r(B, T, HV, K), dk=r(B, T, HV, K), db=r(B, T, HV),
             dg=r(B, T, HV, K))
    low = getattr(torch, dtype)
    for n in ("q", "k", "v", "v_new", "w", "u", "kg", "beta", "h", "dh", "do", "dv"):
        t[n] = t[n].to(low)
    t["A_lo"], t["Aqk_lo"] = A.to(low), A.to(low)  # the WY and scan stages read A in bf16
    return t


def probes(device: str, shape: dict | None = None) -> list:
    """The kda chain's kernels as ``kda.chain`` calls them (its names, its arguments), each
    beside its plain-torch stage reference (``harness.Probe``; ``check()`` and ``bench --stages
    kda`` run these). fp32 inputs compare to 1e-3 (tf32 products on a GPU; exact under the
    interpreter); bf16 ones to 2e-2, the old stage bench's threshold for a bad configuration."""
    import torch

    from .._delta._kernels import score_grad, state_scan_bwd, state_scan_fwd
    from .._delta.reference import state_scan_bwd_ref, state_scan_fwd_ref
    from ..kda import chain
    from ..kda import reference_stages as R
    from ..kda._kernels import gate_bwd, intra_bwd, wy_bwd
    from .harness import Probe

    shape = dict(CHECK_SHAPE, **(shape or {}))
    t = _check_inputs(device, **shape)
    tol = 1e-3 if shape["dtype"] == "float32" else 2e-2
    P = functools.partial(Probe, tol=tol)
    intra = dict(q=t["q"], k=t["k"], g=t["g"], beta=t["beta"], dAqk=t["A"], dAkk=t["Aqk"], dq=t["dq"], dk=t["dk"],
                 db=t["db"], dg=t["dg"], chunk_size=64)
    wy = dict(q=t["q"], k=t["k"], v=t["v"], v_new=t["v_new"], g=t["g"], beta=t["beta"], A=t["A_lo"], h=t["h"],
              do=t["do"], dh=t["dh"], dv=t["dv"], scale=0.3, chunk_size=64)
    out = [
        P("kda.intra_bwd", lambda c: chain.intra_bwd(**intra, fast_range=chain.INTRA_BWD_FAST_RANGE,
                                                      dot_precision=chain.INTRA_BWD_DOTS, config=c),
          lambda: R.intra_bwd_reference(**intra), ("dq", "dk", "db", "dg"), module=intra_bwd, label="kda intra_bwd"),
        P("kda.wy_bwd", lambda c: chain.wy_dqkg_bwd(**wy, config=c), lambda: R.wy_dqkg_bwd_reference(**wy),
          ("dq", "dk", "dv", "db", "dg", "dA"), module=wy_bwd, label="kda wy_bwd"),
    ]
    # The forward scan, as the chain calls it: the gated queries qg = q exp2(gk) (HV heads),
    # against the reference fed the raw queries.
    B, T, HV, K = t["w"].shape
    V = t["do"].shape[-1]
    qg = (t["q"].float().repeat_interleave(HV // t["q"].shape[2], 2) * torch.exp2(t["g"])).to(t["q"].dtype)
    fwd = dict(k=t["kg"], w=t["w"], u=t["u"], gk=t["g"], Aqk=t["Aqk_lo"], scale=0.3, output_final_state=True)
    out.append(P("delta.state_scan_fwd",
                 lambda c: chain.state_scan_fwd(qg, **fwd, chunk_size=64, q_gated=True, config=c)[:2],
                 lambda: state_scan_fwd_ref(t["q"], **fwd, chunk_size=64)[:2], ("o", "final_state"),
                 module=state_scan_fwd, label="kda state_scan_fwd"))
    # The score gradient, as the chain calls it: dAqk from v_new and do.
    out.append(P("delta.score_grad",
                 lambda c: (chain.score_grad_bwd(t["v_new"], t["do"], 0.3, chunk_size=64, config=c),),
                 lambda: R.dAv_reference(t["v_new"], t["do"], t["Aqk"], 0.3, chunk_size=64)[:1], ("dAqk",),
                 module=score_grad, label="kda score_grad"))
    # The backward scan, as the chain calls it: gated queries and keys, dv made inside from
    # Aqk; against the reference scan fed the reference intra-chunk dv = tril(Aqk)^T do.
    gen = torch.Generator(device=device).manual_seed(1)
    dht = torch.randn(B, HV, K, V, generator=gen, device=device) * 0.1
    h0 = torch.zeros(B, HV, K, V, device=device)  # only whether dh0 is wanted

    def bwd_ref():
        _, dv_local = R.dAv_reference(t["do"], t["do"], t["Aqk_lo"], 0.3, chunk_size=64)
        return state_scan_bwd_ref(qg, t["kg"], t["w"], t["do"], dv_local, gk=t["g"], dht=dht, scale=0.3, chunk_size=64)

    out.append(P("delta.state_scan_bwd", lambda c: chain.state_scan_bwd(
        q=qg, k=t["kg"], w=t["w"], gk=t["g"], h0=h0, dht=dht, do=t["do"], dv=None, A=t["Aqk_lo"], scale=0.3,
        chunk_size=64, config=c), bwd_ref, ("dh", "dh0", "dv"), module=state_scan_bwd, label="kda state_scan_bwd"))
    # The gate pass with the gate in the op: dg's reverse cumsum, then the gate's backward.
    g_raw = (torch.randn(B, T, HV, K, generator=gen, device=device) * 8).to(t["q"].dtype)  # some past softplus' threshold
    A_log = torch.randn(HV, generator=gen, device=device)
    dt_bias = torch.randn(HV * K, generator=gen, device=device)
    out.append(P("kda.gate_bwd", lambda c: chain.dg_cumsum_gate_bwd(t["dg"], g_raw, A_log, dt_bias, chunk_size=64, config=c),
                 lambda: R.dg_cumsum_gate_bwd_reference(t["dg"], g_raw, A_log, dt_bias, chunk_size=64),
                 ("dg", "dA_log", "ddt_bias"), module=gate_bwd, label="kda gate_bwd"))
    return out


def check(device: str = "cpu") -> list[str]:
    """Interpreted check of our KDA stage kernels against their plain-torch references at a
    small shape (T not a multiple of 64, grouped values), fp32: each stage is called through
    ``kda.chain``'s names, with the arguments the chain passes it (``probes``)."""
    from .harness import check_probes

    return check_probes(probes(device))
