"""The whole KDA chain on the CPU: our stage kernels through Triton's interpreter, fla's stages
as plain-torch stand-ins (``fla_standins``, NaN where fla leaves memory unwritten), end to
end through ``kda.chunk_kda`` and autograd against the fp64 recurrence. This checks the
chain's wiring (arguments, layouts, grouped heads, packed documents, the initial state, the
fused l2norm backward) before any GPU time is spent; the GPU tier checks fla's real stages
and the numerics at real shapes."""
import model_calls
import pytest
import torch

from kernel_fun import kda
from kernel_fun._common import capture
from kernel_fun._common.numerics import rel_rms as _rel
from kernel_fun._common.witness import launch_counts
from kernel_fun.bench.kda import chain_setup
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
    "one_token": dict(B=3, T=1, H=1, HV=2, K=64, V=64, h0=True),  # a decode-sized call in chunk mode
    "initial_state": dict(B=1, T=130, H=2, HV=2, K=64, V=64, h0=True),
    "beta_sigmoid_negeig": dict(B=1, T=80, H=1, HV=2, K=64, V=128, beta_logits=True, neg=True),
    "precomputed_gate": dict(B=1, T=70, H=2, HV=2, K=64, V=64, gate_in_kernel=False),
    "cu_seqlens": dict(B=1, T=150, H=1, HV=2, K=64, V=64, h0=True, N=5, cu=[0, 0, 37, 37, 38, 150]),  # empty docs, a 1-token doc
}


@pytest.mark.parametrize("name", list(CASES))
def test_chain_against_fp64_recurrence(name, _standins, monkeypatch):
    """The shipped chain end to end against the fp64 recurrence, with the launches of ours and
    the fla stages it calls checked: our forward scan, score gradient, backward scan, WY, intra
    and gate stages each once; fla's intra stage, w/u pass and h recompute; fla's l2norm
    backward only with grouped heads (HV > H: else fused into our intra stage); never fla's
    dhu, dAv, reverse cumsum of dg or gate backward. The eager call makes the same call warm for
    CUDA graph capture (the gate asks for the signature the autograd function recorded)."""
    c = dict(CASES[name])
    cu, neg = c.pop("cu", None), c.pop("neg", False)
    t = _make(**c)
    cu_t = None if cu is None else torch.tensor(cu)
    flags = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=c.get("gate_in_kernel", True),
                 output_final_state=True, cu_seqlens=cu_t)
    if c.get("beta_logits"):
        flags.update(use_beta_sigmoid_in_kernel=True, allow_neg_eigval=neg)
    aux = {k: v for k, v in t.items() if k not in ("q", "k", "v", "g", "beta")}
    assert kda.is_supported(t["q"], t["k"], t["v"], t["g"], t["beta"], **aux, **flags)[0]
    monkeypatch.setattr(capture, "_capturing", lambda: True)
    assert not kda.is_supported(t["q"], t["k"], t["v"], t["g"], t["beta"], **aux, **flags)[0]  # cold
    monkeypatch.setattr(capture, "_capturing", lambda: False)
    gen = torch.Generator().manual_seed(1)
    do = torch.randn(t["v"].shape, generator=gen).to(torch.float16)
    dht = torch.randn(len(cu) - 1 if cu else c["B"], c["HV"], c["K"], c["V"], generator=gen)
    before = launch_counts()
    dots, intra = [], chain.intra_bwd
    monkeypatch.setattr(chain, "intra_bwd", lambda *a, **kw: dots.append(kw.get("dot_precision")) or intra(*a, **kw))
    ours = _run(kda.chunk_kda, t, do, dht, **flags)
    # fp32 dots in the intra backward (with tf32, dA_log had up to 16x fla's error on an H100;
    # the interpreter's dots are exact in either mode, so the GPU tier holds the numbers)
    assert dots == ["ieee"], dots
    ran = {k: n - before.get(k, 0) for k, n in launch_counts().items() if n != before.get(k, 0)}
    monkeypatch.setattr(capture, "_capturing", lambda: True)
    assert kda.is_supported(t["q"], t["k"], t["v"], t["g"], t["beta"], **aux, **flags) == (True, "")
    assert ran == {"delta.state_scan_fwd": 1, "delta.score_grad": 1, "delta.state_scan_bwd": 1, "kda.wy_bwd": 1,
                   "kda.intra_bwd": 1, "kda.gate_bwd": 1}, ran
    assert sorted(n.split(".")[1] for n in ran) == sorted(chain_setup()["stages_ours"])  # what a bench record says
    ref = _run(chunk_kda_ref, {k: v.detach().double().requires_grad_() for k, v in t.items()},
               do.double(), dht.double(), **flags)
    errs = {k: _rel(ours[k], ref[k]) for k in ours if ours[k] is not None and k in TOL}
    assert set(errs) >= {"o", "ht", "dq", "dk", "dv", "dg", "dbeta"}
    print(name, {k: f"{e:.1e}" for k, e in errs.items()})
    bad = {k: f"{e:.2e}" for k, e in errs.items() if not e <= TOL[k]}
    assert not bad, (bad, {k: f"{e:.1e}" for k, e in errs.items()})
    H, HV, gate = c["H"], c["HV"], flags["use_gate_in_kernel"]
    called = set(_standins)
    # fla's l2norm backward only where ours cannot fuse it (grouped heads)
    assert (("fla.modules.norm.l2norm", "l2norm_bwd") in called) == (H != HV), _standins
    # with the gate in the op, chunk_local_cumsum is not called at all (our gate pass does the
    # reverse cumsum; the forward's gate cumsum is kda_gate_chunk_cumsum); without it, only
    # for the forward and backward cumsum of the precomputed gate
    cumsums = _standins.count(("fla.ops.utils.cumsum", "chunk_local_cumsum"))
    assert cumsums == (0 if gate else 2), _standins
    # the forward's intra stage is fla's whole one; the backward's w/u pass and h recompute fla's
    assert _standins.count(("fla.ops.kda.chunk_intra", "chunk_kda_fwd_intra")) == 1, _standins
    assert _standins.count(("fla.ops.kda.wy_fast", "recompute_w_u_fwd")) == 1, _standins
    assert _standins.count(("fla.ops.common.chunk_delta_h", "chunk_gated_delta_rule_fwd_h")) == 1, _standins


def test_backward_releases_each_intermediate_after_its_last_reader(monkeypatch):
    """Peak memory: by the time the WY stage runs, the backward has let go of u, w, qg, kg (the
    state scan's inputs); by the time the intra stage runs, also of h, v_new, dh and the scan's
    dv (the WY stage's inputs). Weak references to each stage's outputs are checked inside the
    next stages (a reference kept by a local or an argument dict fails this: H200, 2026-11-30,
    +1,024 MB at B=16 from one kept dv). Without a final state (dht None), and against the
    fp64 recurrence too."""
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
    monkeypatch.setattr(chain, "state_scan_bwd", keep(("dh", None, "dv_scan"), chain.state_scan_bwd))
    monkeypatch.setattr(chain, "wy_dqkg_bwd", dead_by(("w", "u", "qg", "kg"), chain.wy_dqkg_bwd))
    monkeypatch.setattr(chain, "intra_bwd", dead_by(("w", "u", "qg", "kg", "h", "v_new", "dh", "dv_scan"),
                                                    chain.intra_bwd))
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


def test_transformers_kimi_linear_call(_standins):
    """The call transformers' ``KimiLinearDeltaAttention`` makes: the per-channel gate precomputed in
    fp32 (``-exp(A_log) softplus(gate + dt_bias)``), beta activated in fp32, the l2norm in the op, no
    state. Ours engaged (our scans ran), dg and dbeta in their fp32, each output against the fp64
    recurrence (4.9e-4 and under measured, 2026-12-05)."""
    B, T, H, K, V = 2, 100, 2, 64, 64
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, T, H, K, generator=gen).half() for _ in range(3))
    A_log, dt_bias = torch.rand(H, 1, generator=gen), torch.randn(H, K, generator=gen)
    g = -A_log.exp() * torch.nn.functional.softplus(torch.randn(B, T, H, K, generator=gen).float() + dt_bias)
    beta = torch.rand(B, T, H, generator=gen)
    do = torch.randn(B, T, H, V, generator=gen).half()

    ours = model_calls.check(kda.chunk_kda, chunk_kda_ref, q, k, v, g, beta, do,
                             ("delta.state_scan_fwd", "delta.state_scan_bwd", "kda.wy_bwd", "kda.intra_bwd"))
    assert ours["dg"].dtype == ours["dbeta"].dtype == torch.float32
