"""gdn benchmark cases (fla's GatedDeltaNet layer's call), peak memory, per-stage profile.

fla 0.6.0 refuses its own GDN backward on Hopper with Triton >= 3.4 and < 3.7.1
(``fla.ops.common.chunk_o.chunk_bwd_dqkwg`` raises, reading the module constant
``TRITON_ABOVE_3_7_1``, fla #640). To time fla's Triton backward anyway, as
shared/baselines/h200-2026-11-30.md did, ``fla_refusal_bypassed()`` sets that constant to True
for the duration of fla's timed calls, only here, and every case's record says so
(``fla_backward_refusal_bypassed``): those fla rows are fla's speed, not a usable result.
"""
from __future__ import annotations

import contextlib

from .harness import Case, Direction, stage_profile
from .kda import _peak_mb

PROD = dict(T=8192, H=16, HV=16, K=128, V=128)


@contextlib.contextmanager
def fla_refusal_bypassed():
    """fla's chunk_bwd_dqkwg refusal turned off while inside (restored after); yields whether
    fla would have refused here (the value recorded)."""
    import fla.ops.common.chunk_o as chunk_o

    old = chunk_o.TRITON_ABOVE_3_7_1
    refused = bool(chunk_o.IS_NVIDIA_HOPPER and chunk_o.TRITON_ABOVE_3_4_0 and not old)
    chunk_o.TRITON_ABOVE_3_7_1 = True
    try:
        yield refused
    finally:
        chunk_o.TRITON_ABOVE_3_7_1 = old


KERNELS = {
    "gdn.wy_inverse": "K K^T gated and its WY inverse A, once per qk head for the group's value heads",
    "delta.state_scan_fwd": "the forward state scan (scalar gate) making o; h and v_new for the backward",
    "delta.state_scan_bwd": "the backward state scan (scalar gate) making dv",
    "gdn.gated_scores": "the gated scores the backward scan makes dv from (and, above K = 128, the split forward's o)",
    "gdn.chunk_output": "the split forward's o from h, v_new and the scores (above K = 128)",
    "gdn.wy_dv_bwd": "the WY backward's dv/dbeta/dA half",
    "gdn.wy_dqk_bwd": "the dq/dk/dg half, group sum in fp32",
    "gdn.inputs_fwd": "l2norm of q, k, beta's sigmoid, the gate and its chunk cumsum, v copied (the layer's slices)",
    "gdn.inputs_bwd": "their backward, dq and dk written into the fused q/k/v gradient's slices",
}


def _inputs(B, T, H, HV, K, V, seed=0):
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)

    def r(*s, dt=torch.bfloat16):
        return torch.randn(*s, device="cuda", generator=gen).to(dt).requires_grad_()

    return dict(q=r(B, T, H, K), k=r(B, T, H, K), v=r(B, T, HV, V), g=r(B, T, HV), beta=r(B, T, HV),
                A_log=(torch.rand(HV, device="cuda", generator=gen) * 2.0).requires_grad_(),
                dt_bias=r(HV, dt=torch.float32))


def chain_setup() -> dict:
    from ..gdn import chain

    return {"module": chain.__name__, "ours": ["gdn.wy_inverse", "delta.state_scan_fwd", "delta.state_scan_bwd", "gdn.gated_scores",
                                                 "gdn.chunk_output", "gdn.wy_dv_bwd", "gdn.wy_dqk_bwd"]}


def _case(name, B, T, H, HV, K, V, cu_seqlens=None, profile=False):
    import torch

    from .. import gdn
    from .._common.compat import fla_symbol
    from .._common.numerics import rel_rms as rel

    fla_op = fla_symbol("fla.ops.gated_delta_rule", "chunk_gated_delta_rule")
    t = _inputs(B, T, H, HV, K, V)
    do = torch.randn(B, T, HV, V, device="cuda", dtype=torch.bfloat16)
    leaves = [t[n] for n in ("q", "k", "v", "g", "beta", "A_log", "dt_bias")]

    def call(fn):  # the call fla's GatedDeltaNet layer makes in training
        return fn(t["q"], t["k"], t["v"], t["g"], t["beta"], use_qk_l2norm_in_kernel=True,
                  use_beta_sigmoid_in_kernel=True, state_v_first=True, cu_seqlens=cu_seqlens,
                  use_gate_in_kernel=True, A_log=t["A_log"], dt_bias=t["dt_bias"])[0]

    def fwdbwd(fn):
        return lambda: torch.autograd.grad(call(fn), leaves, do)

    def fla_bypassed(f):
        def run():
            with fla_refusal_bypassed():
                return f()
        return run

    with fla_refusal_bypassed() as refused:
        pass
    o_ours, o_fla = call(gdn.chunk_gated_delta_rule), call(fla_op)
    g_ours = torch.autograd.grad(o_ours, leaves, do)
    g_fla = fla_bypassed(lambda: torch.autograd.grad(o_fla, leaves, do))()
    parity = {"o": rel(o_ours, o_fla)}
    for n, a, b in zip(("dq", "dk", "dv", "dg", "dbeta", "dA_log", "ddt_bias"), g_ours, g_fla):
        parity[n] = rel(a, b)
    del o_ours, o_fla, g_ours, g_fla
    extra = {"rel_err_vs_fla": {k: float(f"{v:.3e}") for k, v in parity.items()},
             "peak_MB": {"ours": _peak_mb(fwdbwd(gdn.chunk_gated_delta_rule)),
                         "fla": _peak_mb(fla_bypassed(fwdbwd(fla_op)))},
             "chain": chain_setup(),
             "fla_backward_refusal_bypassed": refused,
             "note": ("fla's backward timed with its Hopper/Triton<3.7.1 refusal bypassed "
                      "(fla.ops.common.chunk_o.TRITON_ABOVE_3_7_1 forced True): fla's Triton speed, "
                      "not a usable result") if refused else ""}
    if profile:
        extra["stages_ms"] = {"ours": stage_profile(fwdbwd(gdn.chunk_gated_delta_rule)),
                              "fla": stage_profile(fla_bypassed(fwdbwd(fla_op)))}
        extra["stages_ms_fwd"] = {"ours": stage_profile(lambda: call(gdn.chunk_gated_delta_rule)),
                                  "fla": stage_profile(lambda: call(fla_op))}
    dirs = [Direction("fwd", lambda: call(gdn.chunk_gated_delta_rule), lambda: call(fla_op)),
            Direction("fwdbwd", fwdbwd(gdn.chunk_gated_delta_rule), fla_bypassed(fwdbwd(fla_op)), extra=extra)]
    shape = dict(B=B, T=T, H=H, HV=HV, K=K, V=V, dtype="bfloat16", use_qk_l2norm_in_kernel=True,
                 use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, state_v_first=True)
    if cu_seqlens is not None:
        shape["cu_seqlens"] = cu_seqlens.tolist()
    return Case("gdn", name, shape, dirs, witness=("gdn.", "delta."))


@contextlib.contextmanager
def flashqla_off():
    """``FLA_FLASH_QLA=0`` inside the block: fla's dispatch (and so ours, ops.py's box) leaves
    FlashQLA's calls alone, so that our op runs our chain beside an installed FlashQLA."""
    import os

    before = os.environ.get("FLA_FLASH_QLA")
    os.environ["FLA_FLASH_QLA"] = "0"
    try:
        yield
    finally:
        if before is None:
            del os.environ["FLA_FLASH_QLA"]
        else:
            os.environ["FLA_FLASH_QLA"] = before


def _flashqla_case(name, B, T, H, HV, K, V):
    """Ours against FlashQLA (QwenLM's TileLang GDN, the ``flash_qla`` package; in the record's
    ``fla`` column) on the call FlashQLA supports: the gate precomputed in log space and beta
    already activated (FlashQLA has neither in its kernels: fla's FlashQLA backend refuses
    ``use_gate_in_kernel`` and ``use_beta_sigmoid_in_kernel``), l2norm in the op, the state V-first.
    Both sides get the same leaf tensors; the gate and sigmoid are made once, outside the timing.
    With ``flash_qla`` installed, fla's dispatch hands this call to FlashQLA and so would ours
    (ops.py's box routes it to fla): the ours column sets ``FLA_FLASH_QLA=0`` around each call
    (two environment writes, ~1 us of its host time) so it runs our chain; FlashQLA's column
    calls ``flash_qla`` directly."""
    import importlib.metadata

    import flash_qla
    import torch
    import torch.nn.functional as F

    from .. import gdn
    from .._common.numerics import rel_rms as rel

    t = _inputs(B, T, H, HV, K, V)
    with torch.no_grad():
        g = -t["A_log"].exp() * F.softplus(t["g"].float() + t["dt_bias"])  # fla's layer's gate, fp32
        beta = t["beta"].sigmoid()
    g.requires_grad_()
    beta.requires_grad_()
    do = torch.randn(B, T, HV, V, device="cuda", dtype=torch.bfloat16)
    leaves = [t["q"], t["k"], t["v"], g, beta]

    def call(fn):
        return fn(t["q"], t["k"], t["v"], g, beta, use_qk_l2norm_in_kernel=True, state_v_first=True)[0]

    def fwdbwd(fn):
        return lambda: torch.autograd.grad(call(fn), leaves, do)

    def ours(*args, **kwargs):
        with flashqla_off():
            return gdn.chunk_gated_delta_rule(*args, **kwargs)

    fq = flash_qla.chunk_gated_delta_rule
    o_ours, o_fq = call(ours), call(fq)
    parity = {"o": rel(o_ours, o_fq)}
    for n, a, b in zip(("dq", "dk", "dv", "dg", "dbeta"), torch.autograd.grad(o_ours, leaves, do),
                       torch.autograd.grad(o_fq, leaves, do)):
        parity[n] = rel(a, b)
    del o_ours, o_fq
    extra = {"rel_err_vs_baseline": {k: float(f"{v:.3e}") for k, v in parity.items()},
             "peak_MB": {"ours": _peak_mb(fwdbwd(ours)), "baseline": _peak_mb(fwdbwd(fq))},
             "stages_ms": {"ours": stage_profile(fwdbwd(ours)),
                           "baseline": stage_profile(fwdbwd(fq))},
             "chain": chain_setup(),
             "note": "the fla column is FlashQLA (flash_qla.chunk_gated_delta_rule, auto_cp default), not fla"}
    dirs = [Direction("fwd", lambda: call(ours), lambda: call(fq)),
            Direction("fwdbwd", fwdbwd(ours), fwdbwd(fq), extra=extra)]
    shape = dict(B=B, T=T, H=H, HV=HV, K=K, V=V, dtype="bfloat16", use_qk_l2norm_in_kernel=True,
                 use_gate_in_kernel=False, gate="precomputed fp32", beta="activated", state_v_first=True,
                 baseline=f"flash_qla {importlib.metadata.version('flash_qla')}")
    return Case("gdn", name, shape, dirs, witness=("gdn.", "delta."))


def cases(overrides: dict | None = None):
    """(name, build) pairs: issue 17's cases (with FlashQLA's beside them where ``flash_qla`` is
    importable), or one ``custom`` case for ``--shape``."""
    import importlib.util

    from .cconv import _random_cu_seqlens

    if overrides:
        p = dict(PROD, B=8)
        p.update({k: int(v) for k, v in overrides.items()})
        return [("custom", lambda: _case("custom", **p))]
    return [
        ("prod_b8", lambda: _case("prod_b8", B=8, **PROD, profile=True)),
        ("grouped_h16_hv32_b4", lambda: _case("grouped_h16_hv32_b4", 4, 8192, 16, 32, 128, 128, profile=True)),
        ("varlen_16docs", lambda: _case("varlen_16docs", 1, 65536, 16, 16, 128, 128,
                                        cu_seqlens=_random_cu_seqlens(65536, 16), profile=True)),
        ("latency_b1_t4096", lambda: _case("latency_b1_t4096", 1, 4096, 16, 16, 128, 128)),
        # fla's default GatedDeltaNet (GatedDeltaNetConfig: 6 heads, head_dim 256, expand_v 2)
        ("fla_default_heads_b8", lambda: _case("fla_default_heads_b8", 8, 8192, 6, 6, 256, 512, profile=True)),
    ] + ([  # FlashQLA (issue 17's anchor), only where it is installed: K = V = 128 only
        ("prod_b8_vs_flashqla", lambda: _flashqla_case("prod_b8_vs_flashqla", 8, **PROD)),
        ("grouped_h16_hv32_b4_vs_flashqla",
         lambda: _flashqla_case("grouped_h16_hv32_b4_vs_flashqla", 4, 8192, 16, 32, 128, 128)),
    ] if importlib.util.find_spec("flash_qla") is not None else [])


# The stage probes' shapes: the check's (T not a multiple of 64, grouped values, fp32) and, for
# `bench --stages gdn` on a GPU, the production heads at B=8 in bf16 (`--shape` replaces any;
# docs=N packs B=1's T tokens into N documents of random lengths, as `cu_seqlens`).
CHECK_SHAPE = dict(B=1, T=100, H=1, HV=2, K=32, V=32, dtype="float32", docs=0)
STAGE_SHAPES = {"cpu": CHECK_SHAPE, "cuda": dict(B=8, T=8192, H=16, HV=16, K=128, V=128, dtype="bfloat16", docs=0)}


def probes(device: str, shape: dict | None = None) -> list:
    """The kernels of gdn's chain as gdn/chain.py calls them, each beside its fp64 stage
    reference (``harness.Probe``; ``check()`` and ``bench --stages gdn`` run these): the
    scalar-gate state scans, the gated scores and the WY backward's two halves (the second fed
    the first's outputs). fp32 inputs compare to 1e-3, bf16 ones to 2e-2."""
    import functools
    import math

    import torch

    from .._delta import chunking
    from .._delta._kernels import state_scan_bwd as scan_bwd_mod
    from .._delta._kernels import state_scan_fwd as scan_fwd_mod
    from .._delta._kernels.state_scan_bwd import state_scan_bwd
    from .._delta._kernels.state_scan_fwd import state_scan_fwd
    from .._delta.reference import chunk_local_cumsum_ref, intra_ref, state_scan_bwd_ref, state_scan_fwd_ref
    from ..gdn import reference_stages as R
    from ..gdn._kernels import inputs_bwd, inputs_fwd, output, scores, wy_dqk_bwd, wy_dv_bwd, wy_inverse
    from ..kda.reference_stages import dAv_reference
    from .harness import Probe, UsageError

    shape = dict(CHECK_SHAPE, **(shape or {}))
    B, T, H, HV, K, V = (shape[k] for k in ("B", "T", "H", "HV", "K", "V"))
    docs = int(shape.get("docs", 0))
    cu_cpu = cu = idx = offs = None  # packed documents: cu_seqlens (CPU for the fp64 references)
    if docs:
        if B != 1 or not 1 <= docs <= T:
            raise UsageError(f"--shape: docs={docs} packs one sequence (B=1) of T >= docs tokens; got B={B}, T={T}")
        from .cconv import _random_cu_seqlens

        cu_cpu = _random_cu_seqlens(T, docs, seed=1, device="cpu")
        cu = cu_cpu.to(device)
        idx, offs = chunking.chunk_meta(cu, 64, cu_cpu)
    N = docs or B  # sequences: the states' leading dimension
    var = dict(cu_seqlens=cu, chunk_indices=idx)  # what each chunk-parallel kernel takes
    scan_var = dict(var, chunk_offsets=offs)  # and the scans
    low = getattr(torch, shape["dtype"])
    P = functools.partial(Probe, tol=1e-3 if low == torch.float32 else 2e-2)
    gen = torch.Generator(device=device).manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=gen, device=device)  # noqa: E731
    a = -torch.rand(B, T, HV, generator=gen, device=device).double() * 0.5
    if docs:  # chunks restart at each document
        g = chunk_local_cumsum_ref(a.cpu(), 64, cu_seqlens=cu_cpu).float().to(device)
    else:
        g = torch.cat([c.cumsum(1) for c in a.split(64, dim=1)], 1).float() / math.log(2.0)
    q = torch.nn.functional.normalize(r(B, T, H, K), dim=-1)
    k = torch.nn.functional.normalize(r(B, T, H, K), dim=-1)
    beta = torch.rand(B, T, HV, generator=gen, device=device)
    NT = len(R.chunks(B, T, cu_cpu)) // (1 if docs else B)  # chunks a sequence (all of them with docs)
    t = dict(q=q, k=k, v=r(B, T, HV, V), v_new=r(B, T, HV, V), g=g, beta=beta,
             h=r(B, NT, HV, K, V) * 0.5, dh=r(B, NT, HV, K, V) * 0.5, do=r(B, T, HV, V), dv2=r(B, T, HV, V))
    t = {n: x if n in ("g", "beta") else x.to(low) for n, x in t.items()}  # gate and beta fp32, as the chain's
    # gdn/reference_stages.py computes on the CPU (fp64, per chunk): it gets CPU copies
    cpu = {n: x.cpu() for n, x in t.items()}
    A64 = R.wy_inverse_ref(cpu["k"], cpu["g"], cpu["beta"], cu_seqlens=cu_cpu)
    A = A64.to(device, low)
    scale = K ** -0.5
    ref_in = {n: x.double() for n, x in cpu.items()}
    wy_ref = functools.cache(lambda: R.wy_dqkwg_bwd_ref(**ref_in, scale=scale, cu_seqlens=cu_cpu))
    Aqk_o = R.gated_scores_ref(cpu["q"], cpu["k"], cpu["g"], scale, cu_seqlens=cu_cpu).to(device, low)  # chunk_output's
    dv_in = dict(k=t["k"], v=t["v"], v_new=t["v_new"], g=g, beta=beta, A=A, h=t["h"], do=t["do"], dv2=t["dv2"])
    dv, db, dAqk, dAkk, dgz = wy_dv_bwd.wy_dv_bwd(**dv_in, scale=scale, NT=NT, **var)  # the second half's inputs
    dqk_in = dict(q=t["q"], k=t["k"], v_new=t["v_new"], g=g, h=t["h"], dh=t["dh"], do=t["do"], dv=dv, dAqk=dAqk,
                  dAkk=dAkk, dgz=dgz)
    out = [
        P("gdn.wy_dv_bwd", lambda c: wy_dv_bwd.wy_dv_bwd(**dv_in, scale=scale, NT=NT, **var, config=c)[:4],
          lambda: R.wy_dv_bwd_ref(**ref_in, scale=scale, cu_seqlens=cu_cpu), ("dv", "dbeta", "dAqk", "dAkk"),
          module=wy_dv_bwd,
          label="gdn wy_dv_bwd"),
        P("gdn.wy_dqk_bwd", lambda c: wy_dqk_bwd.wy_dqk_bwd(**dqk_in, scale=scale, NT=NT, **var, config=c),
          lambda: [wy_ref()[i] for i in (0, 1, 4)], ("dq", "dk", "dg"), module=wy_dqk_bwd, label="gdn wy_dqk_bwd"),
        P("gdn.wy_inverse", lambda c: (wy_inverse.wy_inverse(t["k"], g, beta, **var, config=c),),  # (zeros above)
          lambda: (A64,), ("A",), module=wy_inverse, label="gdn wy_inverse"),
        P("gdn.gated_scores", lambda c: (scores.gated_scores(t["q"], t["k"], g, 0.3, **var, config=c),),
          lambda: (R.gated_scores_ref(cpu["q"], cpu["k"], cpu["g"], 0.3, cu_seqlens=cu_cpu),), ("A",), module=scores,
          label="gdn gated_scores"),
        P("gdn.chunk_output", lambda c: (output.chunk_output(t["q"], t["h"], t["v_new"], Aqk_o, g, scale, **var, config=c),),
          lambda: (R.chunk_output_ref(cpu["q"], cpu["h"], cpu["v_new"], Aqk_o.cpu(), cpu["g"], scale, cu_seqlens=cu_cpu),),
          ("o",), module=output, label="gdn chunk_output"),
    ]
    # The inputs' two kernels as the layer's call meets them: q, k, v column slices of one fused
    # [B, T, 2 H K + HV V] buffer (v copied in the launch), the gate and beta sigmoid in the op
    # (beta times 2: allow_neg_eigval), dq and dk written into the fused gradient's slices.
    width = 2 * H * K + HV * V
    buf = r(B, T, width).to(low)
    qr, kr = (buf[..., i * H * K:(i + 1) * H * K].unflatten(-1, (H, K)) for i in (0, 1))
    vr = buf[..., 2 * H * K:].unflatten(-1, (HV, V))
    raw = dict(g=r(B, T, HV).to(low), beta=r(B, T, HV).to(low), A_log=torch.rand(HV, generator=gen, device=device),
               dt_bias=r(HV))
    in_fwd = (qr, kr, vr, raw["g"], raw["beta"], raw["A_log"], raw["dt_bias"], True, True, 2.0, 1 / math.log(2.0))
    in_ref = {n: x.cpu().double() for n, x in dict(q=qr, k=kr, **raw).items()}
    in_ref_fwd = functools.cache(lambda: R.inputs_fwd_ref(*(in_ref[n] for n in ("q", "k", "g", "beta", "A_log",
                                                                                  "dt_bias")), True, 2.0, cu_cpu))
    yq, rq, yk, rk = (x.to(device) for x in (in_ref_fwd()[0].to(low), (1 / in_ref["q"].norm(dim=-1)).float(),
                                             in_ref_fwd()[1].to(low), (1 / in_ref["k"].norm(dim=-1)).float()))
    d_up = dict(dq=r(B, T, H, K).to(low), dk=r(B, T, H, K).to(low), dbeta=r(B, T, HV), dg=r(B, T, HV))
    dqkv = torch.empty(B, T, width, device=device, dtype=low)
    dq_out, dk_out = (dqkv[..., i * H * K:(i + 1) * H * K].unflatten(-1, (H, K)) for i in (0, 1))
    out += [
        P("gdn.inputs_fwd", lambda c: [x for i, x in enumerate(inputs_fwd.inputs_fwd(*in_fwd, **var, config=c))
                                       if i in (0, 2, 4, 5, 6)],
          lambda: [*in_ref_fwd()[:2], vr.cpu().double(), in_ref_fwd()[3], in_ref_fwd()[2]], ("q", "k", "v", "gc", "beta"),
          module=inputs_fwd, label="gdn inputs_fwd"),
        P("gdn.inputs_bwd", lambda c: inputs_bwd.inputs_bwd(
            yq, rq, d_up["dq"], yk, rk, d_up["dk"], raw["beta"], d_up["dbeta"], True, 2.0, raw["g"], raw["A_log"],
            raw["dt_bias"], d_up["dg"], True, **var, dq_out=dq_out, dk_out=dk_out, config=c),
          lambda: R.inputs_bwd_ref(*(in_ref[n] for n in ("q", "k", "g", "beta", "A_log", "dt_bias")), True,
                                   *(d_up[n].cpu() for n in ("dq", "dk", "dbeta", "dg")), 2.0, cu_cpu),
          ("dq", "dk", "dbeta", "dg", "dA_log", "ddt_bias"), module=inputs_bwd, label="gdn inputs_bwd"),
    ]
    # The state scans with the scalar gate, as gdn/chain.py calls them (the forward twice: for o,
    # then again writing h and v_new for the backward; both from A, v, beta: w, u never formed);
    # A from the fp64 reference intra stage, so the scans meet the structure they meet in the
    # chain (zeros above the diagonal, as wy_inverse writes them);
    # its w, u feed the references.
    it = intra_ref(t["q"], t["k"], t["v"], beta, g=g, scale=scale, chunk_size=64, cu_seqlens=cu)
    w, u = it["w"].to(low), it["u"].to(low)
    wy = (it["Akk"].to(low), t["v"], beta)
    h0 = r(N, HV, K, V) * 0.5
    dht = r(N, HV, K, V) * 0.5
    fwd = dict(g=g, scale=scale, initial_state=h0, chunk_size=64)
    fwd_ref = functools.cache(lambda: state_scan_fwd_ref(t["q"], t["k"], w, u, **fwd, output_final_state=True,
                                                         cu_seqlens=cu))
    out += [
        P("delta.state_scan_fwd", lambda c: state_scan_fwd(t["q"], t["k"], None, None, **fwd, output_final_state=True,
                                                           wy=wy, **scan_var, config=c)[:2],
          lambda: fwd_ref()[:2], ("o", "final_state"), module=scan_fwd_mod, label="gdn state_scan_fwd"),
        P("delta.state_scan_fwd", lambda c: state_scan_fwd(t["q"], t["k"], None, None, **fwd, save_h=True,
                                                           save_v_new=True, store_o=False, wy=wy, **scan_var,
                                                           config=c)[2:],
          lambda: fwd_ref()[2:], ("h", "v_new"), module=scan_fwd_mod, label="gdn state_scan_fwd",
          note="saving h and v_new, no output (the backward's recompute)"),
    ]
    # The backward scan making dv from the gated scores (the reference's, zero above the diagonal
    # as the kernel's, so only the scan is under test; A_tril=True as the chain passes it) and
    # dv2^T w from A and beta, against the reference scan fed w and dv = tril(Aqk)^T do.
    Aqk = R.gated_scores_ref(cpu["q"], cpu["k"], cpu["g"], scale, cu_seqlens=cu_cpu)
    Aqk_dev = Aqk.to(device, low)  # once: a copy inside the timed call would time the host link

    def bwd_ref():  # on the CPU, beside Aqk
        _, dv_local = dAv_reference(cpu["do"], cpu["do"], Aqk, scale, cu_seqlens=cu_cpu, chunk_size=64)
        return state_scan_bwd_ref(cpu["q"], cpu["k"], w.cpu(), cpu["do"], dv_local, g=cpu["g"], dht=dht.cpu(),
                                  scale=scale, cu_seqlens=cu_cpu, chunk_size=64)

    out.append(P("delta.state_scan_bwd", lambda c: state_scan_bwd(
        t["q"], t["k"], None, t["do"], None, g=g, h0=h0, dht=dht, scale=scale, chunk_size=64, A=Aqk_dev,
        wy=(wy[0], beta), A_tril=True, **scan_var, config=c),
        bwd_ref, ("dh", "dh0", "dv"), module=scan_bwd_mod, label="gdn state_scan_bwd"))
    return out


def check(device: str = "cpu") -> list[str]:
    """Interpreted check of the kernels of gdn's chain against their fp64 stage references at a
    small shape (T not a multiple of 64, grouped values), fp32 (``probes``)."""
    from .harness import check_probes

    return check_probes(probes(device))
