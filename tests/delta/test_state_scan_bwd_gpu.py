"""The backward state scan on the GPU, in bf16: against fla's ``chunk_gated_delta_rule_bwd_dhu``
and the torch reference. KDA inputs come from fla's own stages (cumsum, intra with qg,
recompute); do, dv and dht are random. Every configuration is forced once per case (fla
#984/#988: a delta-rule kernel can be wrong in one configuration only).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernel_fun._common.numerics import rel_rms
from kernel_fun._common.witness import launches
from kernel_fun._delta import reference as ref
from kernel_fun._delta._kernels.state_scan_bwd import CANDIDATES, CONFIGS, config_name, state_scan_bwd

from chunk_masks import above_diagonal  # noqa: E402  (tests/delta/conftest.py puts this folder on sys.path)

pytestmark = pytest.mark.gpu

BT = 64
TOL_FLA = 3e-3  # same products and rounding points as fla's kernel: summation order only
TOL_REF = 5e-3
CU = [0, 100, 611, 1000, 1500, 1507]


def _case(B=2, T=1000, H=2, HV=4, K=128, V=256, cu_seqlens=None, gate="gk", seed=0):
    from fla.ops.kda.chunk_intra import chunk_kda_fwd_intra
    from fla.ops.utils import chunk_local_cumsum, prepare_chunk_indices
    from fla.ops.utils.constant import RCP_LN2

    torch.manual_seed(seed)
    dev, dt = "cuda", torch.bfloat16
    cu = ci = None
    if cu_seqlens is not None:
        cu = torch.tensor(cu_seqlens, dtype=torch.int32, device=dev)
        ci = prepare_chunk_indices(cu, BT)
        B, T = 1, cu_seqlens[-1]
    q = F.normalize(torch.randn(B, T, H, K, device=dev), dim=-1).to(dt)
    k = F.normalize(torch.randn(B, T, H, K, device=dev), dim=-1).to(dt)
    v = torch.randn(B, T, HV, V, device=dev, dtype=dt)
    beta = torch.rand(B, T, HV, device=dev).sigmoid().to(dt)
    scale = K ** -0.5
    N = B if cu is None else len(cu_seqlens) - 1
    c = dict(do=torch.randn(B, T, HV, V, device=dev, dtype=dt), dv=torch.randn(B, T, HV, V, device=dev, dtype=dt),
             dht=torch.randn(N, HV, K, V, device=dev), h0=torch.zeros(N, HV, K, V, device=dev), scale=scale,
             cu_seqlens=cu, chunk_indices=ci)
    if gate == "gk":
        gk = chunk_local_cumsum(F.logsigmoid(torch.randn(B, T, HV, K, device=dev)), chunk_size=BT, scale=RCP_LN2,
                                cu_seqlens=cu, chunk_indices=ci)
        w, _, qg, kg, _, _ = chunk_kda_fwd_intra(q=q, k=k, v=v, gk=gk, beta=beta, scale=scale, cu_seqlens=cu,
                                                 chunk_size=BT, chunk_indices=ci, disable_recompute=True)
        c.update(q=qg, k=kg, w=w, gk=gk)
    else:
        from fla.ops.gated_delta_rule.chunk_fwd import chunk_gated_delta_rule_fwd_intra

        g = chunk_local_cumsum(F.logsigmoid(torch.randn(B, T, HV, device=dev)), chunk_size=BT, scale=RCP_LN2,
                               cu_seqlens=cu, chunk_indices=ci)
        w, _, A_wy = chunk_gated_delta_rule_fwd_intra(k=k, v=v, g=g, beta=beta, cu_seqlens=cu, chunk_size=BT,
                                                      chunk_indices=ci)
        c.update(q=q, k=k, w=w, g=g, wy=(A_wy, beta), v=v)
    return c


def _args(c):
    return dict(q=c["q"], k=c["k"], w=c["w"], do=c["do"], dv=c["dv"], g=c.get("g"), gk=c.get("gk"), h0=c["h0"],
                dht=c["dht"], scale=c["scale"], cu_seqlens=c["cu_seqlens"], chunk_size=BT,
                chunk_indices=c["chunk_indices"])


def _check(c, ours):
    from fla.ops.common.chunk_delta_h import chunk_gated_delta_rule_bwd_dhu

    fla = chunk_gated_delta_rule_bwd_dhu(**_args(c))
    r = ref.state_scan_bwd_ref(c["q"], c["k"], c["w"], c["do"], c["dv"], g=c.get("g"), gk=c.get("gk"),
                               dht=c["dht"], scale=c["scale"], cu_seqlens=c["cu_seqlens"], chunk_size=BT)
    for name, o, f, e in zip(("dh", "dh0", "dv2"), ours, fla, r):
        assert torch.isfinite(o).all(), name
        assert rel_rms(o, f) < TOL_FLA, (name, rel_rms(o, f))
        assert rel_rms(o, e) < TOL_REF, (name, rel_rms(o, e))


@pytest.mark.parametrize("name", ["kda", "kda_varlen", "gdn", "gdn_varlen"])
def test_against_fla_and_reference(name):
    c = _case(gate="gk" if name.startswith("kda") else "g", V=256 if name.startswith("kda") else 128,
              cu_seqlens=CU if name.endswith("varlen") else None)
    before = launches("delta.state_scan_bwd")
    ours = state_scan_bwd(**_args(c))
    assert launches("delta.state_scan_bwd") == before + 1
    _check(c, ours)


@pytest.mark.parametrize("config", CONFIGS + CANDIDATES, ids=config_name)
@pytest.mark.parametrize("name", ["kda", "kda_varlen"])
def test_every_config(name, config):
    c = _case(cu_seqlens=CU if name.endswith("varlen") else None)
    _check(c, state_scan_bwd(**_args(c), config=config))


@pytest.mark.parametrize("config", [None] + CONFIGS + CANDIDATES, ids=lambda c: "autotuned" if c is None else config_name(c))
@pytest.mark.parametrize("name", ["kda", "kda_varlen"])
def test_dv_from_A_against_fla_dAv_and_dhu(name, config):
    """As the KDA chain runs it: our score gradient (_delta/_kernels/score_grad.py) against the dA of
    fla's chunk_kda_bwd_dAv, and our scan with ``A=Aqk`` (dv = Aqk^T do made inside) against
    fla's dhu fed that stage's dv, and against the fp64 reference (dv not rounded to bf16 in
    ours: 5e-3 from fla)."""
    from fla.ops.common.chunk_delta_h import chunk_gated_delta_rule_bwd_dhu
    from fla.ops.kda.chunk_bwd import chunk_kda_bwd_dAv
    from fla.ops.kda.chunk_intra import chunk_kda_fwd_intra

    from kernel_fun._delta._kernels.score_grad import score_grad_bwd
    from kernel_fun.kda.reference_stages import dAv_reference

    c = _case(cu_seqlens=CU if name.endswith("varlen") else None, seed=2)
    B, T, HV, V = c["do"].shape
    torch.manual_seed(3)
    q = F.normalize(torch.randn(B, T, HV, 128, device="cuda"), dim=-1).to(torch.bfloat16)
    k = F.normalize(torch.randn(B, T, HV, 128, device="cuda"), dim=-1).to(torch.bfloat16)
    v_new = torch.randn(B, T, HV, V, device="cuda", dtype=torch.bfloat16)
    beta = torch.rand(B, T, HV, device="cuda").to(torch.bfloat16)
    *_, Aqk, _ = chunk_kda_fwd_intra(q=q, k=k, v=v_new, gk=c["gk"], beta=beta, scale=c["scale"],
                                     cu_seqlens=c["cu_seqlens"], chunk_size=BT, chunk_indices=c["chunk_indices"])
    dA_fla, dv_fla = chunk_kda_bwd_dAv(q=q, k=k, v=v_new, do=c["do"], A=Aqk, scale=c["scale"],
                                       cu_seqlens=c["cu_seqlens"], chunk_size=BT, chunk_indices=c["chunk_indices"])
    from kernel_fun._delta._kernels.score_grad import CANDIDATES as sg_candidates, CONFIGS as sg_configs

    for sg in [None] + sg_configs + sg_candidates:
        dA = score_grad_bwd(v_new, c["do"], c["scale"], cu_seqlens=c["cu_seqlens"], chunk_size=BT,
                            chunk_indices=c["chunk_indices"], config=sg)
        assert torch.isfinite(dA).all() and rel_rms(dA, dA_fla) < 1e-3, (sg, rel_rms(dA, dA_fla))
    args = {**_args(c), "dv": dv_fla}
    fla = chunk_gated_delta_rule_bwd_dhu(**args)
    _, dv_ref = dAv_reference(v_new, c["do"], Aqk, c["scale"], cu_seqlens=c["cu_seqlens"], chunk_size=BT)
    r = ref.state_scan_bwd_ref(c["q"], c["k"], c["w"], c["do"], dv_ref, gk=c["gk"], dht=c["dht"], scale=c["scale"],
                               cu_seqlens=c["cu_seqlens"], chunk_size=BT)
    ours = state_scan_bwd(**{**args, "dv": None}, A=Aqk, config=config)
    for n, o, f, e in zip(("dh", "dh0", "dv2"), ours, fla, r):
        assert torch.isfinite(o).all(), n
        assert rel_rms(o, f) < 5e-3 and rel_rms(o, e) < TOL_REF, (n, rel_rms(o, f), rel_rms(o, e))


@pytest.mark.parametrize("config", [None] + CONFIGS + CANDIDATES, ids=lambda c: "autotuned" if c is None else config_name(c))
@pytest.mark.parametrize("name", ["gdn", "gdn_varlen_scores", "gdn_varlen_scores_tril", "gdn_varlen_scores_tril_k256"])
def test_wy_every_config(name, config):
    """GDN's form without fla's recompute_w_u (``wy=(A_wy, beta)``: dv2^T w made as ((dv2^T A_wy)
    diag(beta gamma)) K): against fla's dhu fed fla's bf16 w (the rounding points differ: 5e-3),
    and against the fp64 reference fed the exact w of the same A_wy, beta, k, no worse than fla.
    ``_scores``: with the intra-chunk dv made inside from a score matrix (``A=``, as the GDN chain
    calls it), packed documents; ``_tril``: the scores zero above the diagonal and ``A_tril=True``,
    exactly the chain's call (gated_scores writes them so). A_wy, fla's, has its zeros above the
    diagonal written, as wy_inverse writes them. ``_k256``: fla's default GatedDeltaNet heads (K = 256,
    V = 512)."""
    from fla.ops.common.chunk_delta_h import chunk_gated_delta_rule_bwd_dhu

    from kernel_fun.kda.reference_stages import dAv_reference

    wide = name.endswith("k256")
    c = _case(gate="g", K=256 if wide else 128, V=512 if wide else 128, cu_seqlens=CU if "varlen" in name else None)
    scores = None
    if "scores" in name:
        B, T, HV, _ = c["do"].shape
        scores = (torch.randn(B, T, HV, BT, device="cuda") * 0.2).to(torch.bfloat16)
        if name.endswith("tril"):
            bounds = c["cu_seqlens"].tolist() if c["cu_seqlens"] is not None else [0, T]
            scores = scores.masked_fill(above_diagonal(bounds, BT).cuda()[None, :, None, :], 0.0)
        _, dv_local = dAv_reference(c["do"], c["do"], scores, c["scale"], cu_seqlens=c["cu_seqlens"], chunk_size=BT)
        c["dv"] = dv_local.to(torch.bfloat16)  # fla's dhu reads it in bf16; the reference below in fp64
    fla = chunk_gated_delta_rule_bwd_dhu(**_args(c))
    if scores is not None:
        c["dv"] = dv_local
    A_wy, beta = c["wy"]
    cu = None if c["cu_seqlens"] is None else c["cu_seqlens"].cpu()
    w_exact, _ = ref.wy_from_inverse_ref(A_wy, c["k"], c["v"], beta, c["g"], BT, cu)
    r = ref.state_scan_bwd_ref(c["q"], c["k"], w_exact, c["do"], c["dv"], g=c["g"], dht=c["dht"], scale=c["scale"],
                               cu_seqlens=c["cu_seqlens"], chunk_size=BT)
    args = {**_args(c), "w": None}
    if scores is not None:
        args.update(dv=None, A=scores, A_tril=name.endswith("tril"))
    # A_wy with its zeros above the diagonal written, as wy_inverse writes it (fla leaves those
    # blocks unwritten; the wy= form masks A_wy by rows only)
    bounds = c["cu_seqlens"].tolist() if c["cu_seqlens"] is not None else [0, c["do"].shape[1]]
    wy = (A_wy.masked_fill(above_diagonal(bounds, BT).cuda()[None, :, None, :], 0.0), beta)
    ours = state_scan_bwd(**args, wy=wy, config=config)
    for n, o, f, e in zip(("dh", "dh0", "dv2"), ours, fla, r):
        assert torch.isfinite(o).all(), n
        e_ours, e_fla = rel_rms(o, e), rel_rms(f, e)
        assert rel_rms(o, f) < 5e-3 and e_ours < TOL_REF and e_ours < 1.5 * e_fla + 1e-4, (n, rel_rms(o, f), e_ours, e_fla)

