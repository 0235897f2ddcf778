"""The whole KDA chain on the CPU: our stage kernels through Triton's interpreter, fla's stages
as plain-torch stand-ins (``fla_standins``, NaN where fla leaves memory unwritten), end to
end through ``kda.chunk_kda`` and autograd against the fp64 recurrence. This checks the
chain's wiring (arguments, layouts, grouped heads, packed documents, the initial state, the
fused epilogue switches) before any GPU time is spent; the GPU tier checks fla's real stages
and the numerics at real shapes."""
import pytest
import torch

from kernel_fun import kda
from kernel_fun._common.numerics import rel_rms as _rel
from kernel_fun._common.witness import launch_counts
from kernel_fun.kda import chain
from kernel_fun.kda.reference import chunk_kda_ref

import fla_standins  # noqa: E402  (tests/kda/conftest.py puts this folder on sys.path)
from chain_cases import make_inputs, run as _run  # noqa: E402

# fp16 operands, fp32 accumulation, fp64 stand-ins: measured at these shapes every error is
# 1e-5..5e-4 except dA_log (a sum over every token and channel: up to 3.2e-3), so the bounds
# are 4x that, far inside the GPU tier's (fla's) ceilings.
TOL = dict(o=2e-3, ht=2e-3, dq=2e-3, dk=2e-3, dv=2e-3, dh0=2e-3, dg=2e-3, dbeta=2e-3,
           dA_log=1.3e-2, ddt_bias=2e-3)


@pytest.fixture(autouse=True)
def _standins(monkeypatch, clean_state):
    if torch.cuda.is_available():
        pytest.skip("the CPU tier (interpreter + stand-ins); the GPU tier runs fla's stages")
    return fla_standins.install(monkeypatch)


def _make(*args, **kw):
    return make_inputs(*args, **kw, device="cpu", dtype=torch.float16)


CASES = {  # the box's smallest heads (K=64, V=64: the interpreter's cost grows with them)
    "tail_grouped": dict(B=2, T=100, H=1, HV=2, K=64, V=64),
    "initial_state": dict(B=1, T=130, H=2, HV=2, K=64, V=64, h0=True),
    "beta_sigmoid_negeig": dict(B=1, T=80, H=1, HV=2, K=64, V=128, beta_logits=True, neg=True),
    "precomputed_gate": dict(B=1, T=70, H=2, HV=2, K=64, V=64, gate_in_kernel=False),
    "cu_seqlens": dict(B=1, T=150, H=1, HV=2, K=64, V=64, h0=True, N=3, cu=[0, 37, 38, 150]),
}
# The chain with every switch off and fla's stage where ours is switchable; as it ships; with
# every switch on and every candidate stage in (the fusions measured slower stay correct and
# tested; with FUSE_WY_FWD that is our scores kernel before the scan); and each forward variant
# alone on top of the shipped chain: the WY pieces formed in our scan with fla's two score
# stages ("wyf"), our whole intra stage in place of fla's chunk_kda_fwd_intra ("fwd_intra"); and
# the backward's WY and intra stages in one kernel ("wyi"); the intra backward's diagonal
# blocks by bit levels alone, without the one anchor ("levels"); fla's dAv in place of our
# score gradient and our dhu making dv from Aqk and do ("fla_dav"), and fla's dhu as well
# ("fla_dhu_dav"); the score gradient made in our WY stage ("dvd+daqk"); fla's reverse cumsum
# of dg and gate backward in place of our one pass ("fla_gate").
# Each: switch values set over the shipped ones, stages dropped, candidate stages added.
SWITCHES = ("FUSE_L2NORM_BWD", "FUSE_DG_CUMSUM", "FUSE_GATE_BWD", "FUSE_WY_FWD", "FUSE_WY_INTRA_BWD",
            "INTRA_BWD_ONE_ANCHOR", "FUSE_DV_DHU", "FUSE_DAQK_WY")
FUSIONS = {
    "off": dict(switches=dict.fromkeys(SWITCHES, False), drop=("state_scan_bwd", "gate_bwd"), add=()),
    "shipped": dict(switches={}, drop=(), add=()),
    "all": dict(switches=dict.fromkeys(SWITCHES, True), drop=(), add=tuple(chain.CANDIDATE_STAGES)),
    "wyf": dict(switches={"FUSE_WY_FWD": True}, drop=(), add=()),
    "fwd_intra": dict(switches={}, drop=(), add=("fwd_intra",)),
    "wyi": dict(switches={"FUSE_WY_INTRA_BWD": True}, drop=(), add=()),
    "levels": dict(switches={"INTRA_BWD_ONE_ANCHOR": False}, drop=(), add=()),
    "fla_dav": dict(switches={"FUSE_DV_DHU": False}, drop=(), add=()),
    "fla_dhu_dav": dict(switches={"FUSE_DV_DHU": False}, drop=("state_scan_bwd",), add=()),
    "dvd+daqk": dict(switches={"FUSE_DV_DHU": True, "FUSE_DAQK_WY": True}, drop=(), add=()),
    "fla_gate": dict(switches={}, drop=("gate_bwd",), add=()),
}


@pytest.mark.parametrize("fusions", list(FUSIONS))
@pytest.mark.parametrize("name", list(CASES))
def test_chain_against_fp64_recurrence(name, fusions, monkeypatch, _standins):
    """The chain's variants (FUSIONS) end to end against the fp64 recurrence, with the launches
    of ours and the fla stages called checked against what each variant must run."""
    c = dict(CASES[name])
    cu, neg = c.pop("cu", None), c.pop("neg", False)
    mode = FUSIONS[fusions]
    on = {sw: mode["switches"].get(sw, getattr(chain, sw)) for sw in SWITCHES}
    for switch, value in on.items():
        monkeypatch.setattr(chain, switch, value)
    stages = {k: f for k, f in chain.STAGES.items() if k not in mode["drop"]}
    stages.update({k: chain.CANDIDATE_STAGES[k] for k in mode["add"]})
    monkeypatch.setattr(chain, "STAGES", stages)
    our_dhu = "state_scan_bwd" in chain.STAGES
    t = _make(**c)
    cu_t = None if cu is None else torch.tensor(cu)
    flags = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=c.get("gate_in_kernel", True),
                 output_final_state=True, cu_seqlens=cu_t)
    if c.get("beta_logits"):
        flags.update(use_beta_sigmoid_in_kernel=True, allow_neg_eigval=neg)
    assert kda.is_supported(t["q"], t["k"], t["v"], t["g"], t["beta"],
                            **{k: v for k, v in t.items() if k not in ("q", "k", "v", "g", "beta")}, **flags)[0]
    gen = torch.Generator().manual_seed(1)
    do = torch.randn(t["v"].shape, generator=gen).to(torch.float16)
    dht = torch.randn(len(cu) - 1 if cu else c["B"], c["HV"], c["K"], c["V"], generator=gen)
    before = launch_counts()
    ours = _run(kda.chunk_kda, t, do, dht, **flags)
    ran = {k: n - before.get(k, 0) for k, n in launch_counts().items() if n != before.get(k, 0)}
    our_scores = "intra_fwd" in chain.STAGES and on["FUSE_WY_FWD"]
    our_whole = "fwd_intra" in chain.STAGES and not on["FUSE_WY_FWD"]
    want = {"delta.state_scan_fwd": 1}
    want.update({"kda.wy_intra_bwd": 1} if on["FUSE_WY_INTRA_BWD"] else {"kda.wy_bwd": 1, "kda.intra_bwd": 1})
    if our_dhu:
        want["delta.state_scan_bwd"] = 1
    dvd = our_dhu and on["FUSE_DV_DHU"]
    if dvd and not (on["FUSE_DAQK_WY"] and not on["FUSE_WY_INTRA_BWD"]):
        want["kda.score_grad"] = 1
    if our_scores or our_whole:
        want["kda.intra_fwd"] = 1
    our_gbwd = "gate_bwd" in chain.STAGES and not on["FUSE_DG_CUMSUM"]  # else the intra epilogue has dg's cumsum
    if our_gbwd:
        want["kda.gate_bwd"] = 1
    assert ran == want, ran
    assert (("fla.ops.common.chunk_delta_h", "chunk_gated_delta_rule_bwd_dhu") in _standins) != our_dhu
    assert (("fla.ops.kda.chunk_bwd", "chunk_kda_bwd_dAv") in _standins) != dvd
    ref = _run(chunk_kda_ref, {k: v.detach().double().requires_grad_() for k, v in t.items()},
               do.double(), dht.double(), **flags)
    errs = {k: _rel(ours[k], ref[k]) for k in ours if ours[k] is not None and k in TOL}
    assert set(errs) >= {"o", "ht", "dq", "dk", "dv", "dg", "dbeta"}
    print(name, fusions, {k: f"{e:.1e}" for k, e in errs.items()})
    bad = {k: f"{e:.2e}" for k, e in errs.items() if not e <= TOL[k]}
    assert not bad, (bad, {k: f"{e:.1e}" for k, e in errs.items()})
    fused_away = {"FUSE_L2NORM_BWD": ("fla.modules.norm.l2norm", "l2norm_bwd"),
                  "FUSE_DG_CUMSUM": ("fla.ops.utils.cumsum", "chunk_local_cumsum"),
                  "FUSE_GATE_BWD": ("fla.ops.kda.gate", "kda_gate_bwd")}
    H, HV, gate = c["H"], c["HV"], flags["use_gate_in_kernel"]
    applies = {"FUSE_L2NORM_BWD": H == HV, "FUSE_DG_CUMSUM": True, "FUSE_GATE_BWD": gate}
    for switch, fla_fn in fused_away.items():
        if switch != "FUSE_L2NORM_BWD" and not gate:
            continue  # no gate backward; the forward's cumsum of a precomputed gate is the same function
        fused = (on[switch] and applies[switch]) or (our_gbwd and switch != "FUSE_L2NORM_BWD")
        assert (fla_fn in _standins) != fused, (switch, "fused" if fused else "not fused", _standins)
    # The forward's intra stage: fla's whole (scores + w/u pass), fla's two score stages alone
    # (FUSE_WY_FWD: the WY pieces made in our scan), our scores kernel (FUSE_WY_FWD), or our
    # whole stage; the backward's w/u pass is fla's in every variant.
    split = {("fla.ops.kda.chunk_intra_token_parallel", "chunk_kda_fwd_intra_token_parallel"),
             ("fla.ops.kda.chunk_intra", "chunk_kda_fwd_kernel_inter_solve_fused")}
    whole = ("fla.ops.kda.chunk_intra", "chunk_kda_fwd_intra")
    wy_pass = _standins.count(("fla.ops.kda.wy_fast", "recompute_w_u_fwd"))
    if our_scores or our_whole:  # the backward's w/u pass only
        assert not (split & set(_standins)) and whole not in _standins and wy_pass == 1, _standins
    elif on["FUSE_WY_FWD"]:
        assert split <= set(_standins) and whole not in _standins and wy_pass == 1
    else:
        assert not (split & set(_standins)) and whole in _standins and wy_pass == 1


@pytest.mark.parametrize("variant", ["shipped", "fla_dhu", "dhu", "dvd", "dvd+daqk", "fla_gate"])
def test_backward_releases_each_intermediate_after_its_last_reader(variant, monkeypatch):
    """Peak memory: by the time the WY stage runs, the backward has let go of u, w, qg, kg and
    the intra-chunk dv (the state scan's inputs); by the time the intra stage runs, also of h,
    v_new, dh and the scan's dv (the WY stage's inputs). Weak references to each stage's
    outputs are checked inside the next stages (a reference kept by a local or an argument
    dict fails this: H200, 2026-11-30, +1,024 MB at B=16 from one kept dv). Without a final
    state (dht None), and against the fp64 recurrence too."""
    import gc
    import weakref

    refs = {}

    def keep(names, fn):
        def wrapped(*a, **kw):
            out = fn(*a, **kw)
            for n, x in zip(names, out):
                if n and isinstance(x, torch.Tensor):
                    refs[n] = weakref.ref(x)
            return out
        return wrapped

    def dead_by(names, fn):
        def wrapped(*a, **kw):
            gc.collect()
            alive = [n for n in names if n in refs and refs[n]() is not None]
            assert not alive, (fn.__name__, "still referenced:", alive)
            return fn(*a, **kw)
        return wrapped

    S = fla_standins.STANDINS
    monkeypatch.setitem(S, ("fla.ops.kda.wy_fast", "recompute_w_u_fwd"),
                        keep(("w", "u", "qg", "kg"), S[("fla.ops.kda.wy_fast", "recompute_w_u_fwd")]))
    fwd_h = ("fla.ops.common.chunk_delta_h", "chunk_gated_delta_rule_fwd_h")
    monkeypatch.setitem(S, fwd_h, keep(("h", "v_new"), S[fwd_h]))
    dav = ("fla.ops.kda.chunk_bwd", "chunk_kda_bwd_dAv")
    monkeypatch.setitem(S, dav, keep((None, "dv_local"), S[dav]))
    fla_dhu = ("fla.ops.common.chunk_delta_h", "chunk_gated_delta_rule_bwd_dhu")
    stages = dict(chain.STAGES)
    if variant == "fla_dhu":
        stages.pop("state_scan_bwd")
    if variant == "fla_gate":
        stages.pop("gate_bwd")
    if variant not in ("shipped", "fla_gate"):
        monkeypatch.setattr(chain, "FUSE_DV_DHU", variant.startswith("dvd"))
        monkeypatch.setattr(chain, "FUSE_DAQK_WY", variant == "dvd+daqk")
    if "state_scan_bwd" in stages:
        stages["state_scan_bwd"] = keep(("dh", None, "dv_scan"), stages["state_scan_bwd"])
    else:
        monkeypatch.setitem(S, fla_dhu, keep(("dh", None, "dv_scan"), S[fla_dhu]))
    stages["wy_bwd"] = dead_by(("w", "u", "qg", "kg", "dv_local"), stages["wy_bwd"])
    stages["intra_bwd"] = dead_by(("w", "u", "qg", "kg", "dv_local", "h", "v_new", "dh", "dv_scan"),
                                  stages["intra_bwd"])
    monkeypatch.setattr(chain, "STAGES", stages)
    monkeypatch.setattr(chain, "FUSE_WY_INTRA_BWD", False)
    t = _make(B=1, T=100, H=1, HV=2, K=64, V=64)
    do = torch.randn(t["v"].shape, generator=torch.Generator().manual_seed(1)).to(torch.float16)
    flags = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True)  # no final state: dht is None
    out = _run(kda.chunk_kda, t, do, None, **flags)
    assert {"w", "u", "qg", "kg", "h", "v_new", "dh", "dv_scan"} <= set(refs), sorted(refs)
    ref = _run(chunk_kda_ref, {k: v.detach().double().requires_grad_() for k, v in t.items()}, do.double(), None,
               **flags)
    errs = {k: _rel(out[k], ref[k]) for k in out if out[k] is not None and k in TOL}
    assert set(errs) >= {"o", "dq", "dk", "dv", "dg", "dbeta", "dA_log"} and "ht" not in errs, errs
    assert all(e <= TOL[k] for k, e in errs.items()), errs
