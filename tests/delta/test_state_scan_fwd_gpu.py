"""The forward state scan on the GPU, in bf16: against fla's pairs and the torch reference.

KDA: fla's ``chunk_gated_delta_rule_fwd_h`` + ``chunk_gla_fwd_o_gk``; GDN: fla's
``chunk_gated_delta_rule_fwd_h`` + ``chunk_fwd_o``. The scan's inputs come from fla's own
intra stages (``chunk_kda_fwd_intra``, ``chunk_gated_delta_rule_fwd_intra``), so they are
what the scan meets in the chains. Every autotune configuration is forced once per gate
kind (fla #984/#988: a delta-rule kernel can be wrong in one configuration only).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernel_fun._common.witness import launches
from kernel_fun._delta import reference as ref
from kernel_fun._delta._kernels.state_scan_fwd import (_WIDE, _WIDE_WITH_O, CANDIDATES, CONFIGS, config_name, state_scan_fwd,
                                                       state_scan_fwd_kernel_tuned)

ALL_CONFIGS = CONFIGS + CANDIDATES
from kernel_fun._common.numerics import rel_rms

from chunk_masks import above_diagonal  # noqa: E402  (tests/delta/conftest.py puts this folder on sys.path)

pytestmark = pytest.mark.gpu

BT = 64
# fla's own ceiling for o is 5e-3 against its reference. Against fla's pair the math and the
# rounding points are the same (the state enters the products in bf16, as fla's h does), so
# only fp32 summation order and the bf16 flips it causes differ.
TOL_FLA = {"o": 3e-3, "final_state": 2e-3, "h": 3e-3, "v_new": 3e-3}
# GDN's forward form (wy=(A, v, beta)) rounds one product input, diag(beta) (v - diag(gamma) K S), to
# bf16 where fla rounds w and u: against fla's pair it differs by the two roundings (final state
# 2.13e-3 in every config on the H200, 2026-12-02), and against the exact math of the same A, v,
# beta it must be no worse than fla (below).
TOL_FLA_WY = {"o": 4e-3, "final_state": 4e-3, "h": 4e-3, "v_new": 4e-3}
TOL_REF = 5e-3
CU = [0, 100, 611, 1000, 1500, 1507]  # five documents: 100, 511, 389, 500 and 7 tokens


def _cu(cu_list):
    from fla.ops.utils import prepare_chunk_indices
    cu = torch.tensor(cu_list, dtype=torch.int32, device="cuda")
    return cu, prepare_chunk_indices(cu, BT)


def _kda_case(B=2, T=1000, H=2, HV=4, K=128, V=256, cu_seqlens=None, decay=1.0, seed=0):
    """Raw KDA inputs through fla's cumsum and intra stage; returns the stage tensors."""
    from fla.ops.kda.chunk_intra import chunk_kda_fwd_intra
    from fla.ops.utils import chunk_local_cumsum
    from fla.ops.utils.constant import RCP_LN2

    torch.manual_seed(seed)
    dev, dt = "cuda", torch.bfloat16
    if cu_seqlens is not None:
        cu, ci = _cu(cu_seqlens)
        B, T = 1, cu_seqlens[-1] + 13  # 13 padding tokens after the last document
    else:
        cu, ci = None, None
    q = F.normalize(torch.randn(B, T, H, K, device=dev), dim=-1).to(dt)
    k = F.normalize(torch.randn(B, T, H, K, device=dev), dim=-1).to(dt)
    v = torch.randn(B, T, HV, V, device=dev, dtype=dt)
    beta = torch.rand(B, T, HV, device=dev).sigmoid().to(dt)
    g_raw = decay * F.logsigmoid(torch.randn(B, T, HV, K, device=dev))
    scale = K ** -0.5
    gk = chunk_local_cumsum(g_raw, chunk_size=BT, scale=RCP_LN2, cu_seqlens=cu, chunk_indices=ci)
    w, u, _, kg, Aqk, _ = chunk_kda_fwd_intra(q=q, k=k, v=v, gk=gk, beta=beta, scale=scale,
                                               cu_seqlens=cu, chunk_size=BT, chunk_indices=ci)
    N = B if cu is None else len(cu_seqlens) - 1
    h0 = torch.randn(N, HV, K, V, device=dev, dtype=torch.float32)
    return dict(q=q, k=kg, w=w, u=u, gk=gk, Aqk=Aqk, scale=scale, initial_state=h0,
                cu_seqlens=cu, chunk_indices=ci)


def _gdn_case(B=2, T=1000, H=2, HV=4, K=128, V=128, cu_seqlens=None, decay=1.0, seed=0):
    from fla.ops.gated_delta_rule.chunk_fwd import chunk_gated_delta_rule_fwd_intra
    from fla.ops.utils import chunk_local_cumsum
    from fla.ops.utils.constant import RCP_LN2

    torch.manual_seed(seed)
    dev, dt = "cuda", torch.bfloat16
    if cu_seqlens is not None:
        cu, ci = _cu(cu_seqlens)
        B, T = 1, cu_seqlens[-1] + 13
    else:
        cu, ci = None, None
    q = F.normalize(torch.randn(B, T, H, K, device=dev), dim=-1).to(dt)
    k = F.normalize(torch.randn(B, T, H, K, device=dev), dim=-1).to(dt)
    v = torch.randn(B, T, HV, V, device=dev, dtype=dt)
    beta = torch.rand(B, T, HV, device=dev).sigmoid().to(dt)
    g_raw = decay * F.logsigmoid(torch.randn(B, T, HV, device=dev))
    scale = K ** -0.5
    g = chunk_local_cumsum(g_raw, chunk_size=BT, scale=RCP_LN2, cu_seqlens=cu, chunk_indices=ci)
    w, u, A = chunk_gated_delta_rule_fwd_intra(k=k, v=v, g=g, beta=beta, cu_seqlens=cu,
                                               chunk_size=BT, chunk_indices=ci)
    N = B if cu is None else len(cu_seqlens) - 1
    h0 = torch.randn(N, HV, K, V, device=dev, dtype=torch.float32)
    # A, v, beta: the gdn chain's forward form (wy=), compared with fla's pair on w, u; A with its
    # zeros above the diagonal written, as wy_inverse writes them (fla leaves those blocks
    # unwritten; the wy= form masks A by rows only)
    bounds = (list(cu_seqlens) + [T]) if cu_seqlens is not None else [0, T]
    A = A.masked_fill(above_diagonal(bounds, BT).to(dev)[None, :, None, :], 0.0)
    return dict(q=q, k=k, w=w, u=u, g=g, Aqk=None, scale=scale, initial_state=h0,
                cu_seqlens=cu, chunk_indices=ci, wy=(A, v, beta))


def _fla_pair(c):
    """fla's two kernels on the same stage inputs: (o, final_state, h, v_new)."""
    from fla.ops.common.chunk_delta_h import chunk_gated_delta_rule_fwd_h
    h, v_new, ht = chunk_gated_delta_rule_fwd_h(
        k=c["k"], w=c["w"], u=c["u"], g=c.get("g"), gk=c.get("gk"), initial_state=c["initial_state"],
        output_final_state=True, cu_seqlens=c["cu_seqlens"], chunk_indices=c["chunk_indices"],
        chunk_size=BT)
    if c.get("gk") is not None:
        from fla.ops.gla.chunk import chunk_gla_fwd_o_gk
        o = chunk_gla_fwd_o_gk(q=c["q"], v=v_new, g=c["gk"], A=c["Aqk"], h=h, scale=c["scale"],
                               cu_seqlens=c["cu_seqlens"], chunk_size=BT, chunk_indices=c["chunk_indices"])
    else:
        from fla.ops.common.chunk_o import chunk_fwd_o
        o = chunk_fwd_o(q=c["q"], k=c["k"], v=v_new, h=h, g=c["g"], scale=c["scale"],
                        cu_seqlens=c["cu_seqlens"], chunk_size=BT, chunk_indices=c["chunk_indices"])
    return o, ht, h, v_new


def _ours(c, **kw):
    if c.get("use_wy"):
        return state_scan_fwd(
            c["q"], c["k"], None, None, g=c["g"], wy=c["wy"], scale=c["scale"],
            initial_state=c["initial_state"], output_final_state=True, cu_seqlens=c["cu_seqlens"],
            chunk_indices=c["chunk_indices"], chunk_size=BT, **kw)
    return state_scan_fwd(
        c["q"], c["k"], c["w"], c["u"], g=c.get("g"), gk=c.get("gk"), Aqk=c["Aqk"], scale=c["scale"],
        initial_state=c["initial_state"], output_final_state=True, cu_seqlens=c["cu_seqlens"],
        chunk_indices=c["chunk_indices"], chunk_size=BT, **kw)


def _wu_exact(c):
    """w, u in fp64 from the bf16 A, k, v, beta that both sides start from (fla's recompute_w_u
    rounds them to bf16; the wy form never forms them)."""
    A, v, beta = c["wy"]
    cu = None if c["cu_seqlens"] is None else c["cu_seqlens"].cpu()
    return ref.wy_from_inverse_ref(A, c["k"], v, beta, c["g"], BT, cu)


def _reference(c):
    if c.get("use_wy"):
        w, u = _wu_exact(c)
        return ref.state_scan_fwd_ref(
            c["q"], c["k"], w, u, g=c["g"], scale=c["scale"], initial_state=c["initial_state"],
            output_final_state=True, cu_seqlens=c["cu_seqlens"], chunk_size=BT)
    return ref.state_scan_fwd_ref(
        c["q"], c["k"], c["w"], c["u"], g=c.get("g"), gk=c.get("gk"), Aqk=c["Aqk"], scale=c["scale"],
        initial_state=c["initial_state"], output_final_state=True, cu_seqlens=c["cu_seqlens"],
        chunk_size=BT)


def _rows(c):
    """The tokens that belong to a sequence (fla leaves the padding tail to its allocator)."""
    return slice(None) if c["cu_seqlens"] is None else slice(0, int(c["cu_seqlens"][-1]))


def _compare(c, ours, check_saved=True, with_o=True):
    """o (``with_o``), the final state and (``check_saved``) h and v_new against fla's pair; o and the
    final state against the fp64 reference, within fla's tolerance and no worse than fla. Without the
    output (the recompute form) o must be None."""
    fla = _fla_pair(c)
    o_ref, ht_ref, _, _ = _reference(c)
    rows = _rows(c)
    o, ht, h, vn = ours
    assert ht.dtype == torch.float32
    if with_o:
        assert o.dtype == c["u"].dtype
    else:
        assert o is None
    for name, a, b in ([("o", o[:, rows], fla[0][:, rows])] if with_o else []) + [("final_state", ht, fla[1])] + (
            [("h", h, fla[2]), ("v_new", vn[:, rows], fla[3][:, rows])] if check_saved else []):
        assert torch.isfinite(a).all(), name
        err = rel_rms(a, b)
        assert err < (TOL_FLA_WY if c.get("use_wy") else TOL_FLA)[name], f"{name} vs fla: {err:.2e}"
    # against the fp64 reference: within fla's tolerance and no worse than fla itself
    if with_o:
        e_ours, e_fla = rel_rms(o[:, rows], o_ref[:, rows]), rel_rms(fla[0][:, rows], o_ref[:, rows])
        assert e_ours < TOL_REF and e_ours < 1.5 * e_fla + 1e-4, (e_ours, e_fla)
    s_ours, s_fla = rel_rms(ht, ht_ref), rel_rms(fla[1], ht_ref)
    assert s_ours < TOL_REF and s_ours < 1.5 * s_fla + 1e-4, (s_ours, s_fla)
    if with_o and c["cu_seqlens"] is not None:
        assert (o[:, int(c["cu_seqlens"][-1]):] == 0).all(), "padding tail must be zero"


CASES = {"kda": _kda_case, "gdn": _gdn_case, "gdn_wy": lambda **kw: dict(_gdn_case(**kw), use_wy=True)}


@pytest.mark.parametrize("kind", ["kda", "gdn", "gdn_wy"])
@pytest.mark.parametrize("config", ALL_CONFIGS, ids=config_name)
def test_every_config(kind, config):
    """Each configuration once, varlen with grouped values, against fla and the reference."""
    c = CASES[kind](cu_seqlens=CU)
    _compare(c, _ours(c, save_h=True, save_v_new=True, config=config))


@pytest.mark.parametrize("kind", ["kda", "gdn", "gdn_wy"])
def test_autotuned(kind):
    """The autotuned path at a production head shape, fixed length T = 1000 (partial chunk)."""
    c = CASES[kind](K=128, V=256 if kind == "kda" else 128)
    before = launches("delta.state_scan_fwd")
    _compare(c, _ours(c, save_h=True, save_v_new=True))
    assert launches("delta.state_scan_fwd") == before + 1


@pytest.mark.parametrize("config", [c for c in ALL_CONFIGS if (c.kwargs["VK"] and c.kwargs["BV"] <= 128)
                                    or config_name(c) in _WIDE], ids=config_name)
def test_every_wide_config_at_fla_default_gdn_heads(config):
    """fla's default GatedDeltaNet heads (K = 256, V = 512): each value-major configuration and each
    key-major one of the set above K = 128 (two [128, BV] state slices) against fla and the reference,
    packed, with h and v_new saved and the output; the key-major s2 ones, whose shared memory does not
    hold the output's operands there (237-265 KB), in the form the chain runs them: no output."""
    c = CASES["gdn_wy"](K=256, V=512, cu_seqlens=CU)
    if config_name(config) in _WIDE and config.num_stages > 1:
        _compare(c, _ours(c, save_h=True, save_v_new=True, store_o=False, config=config), with_o=False)
    else:
        _compare(c, _ours(c, save_h=True, save_v_new=True, config=config))


_KEY_MAJOR_RECOMPUTE = ([(c, 128, 128) for c in ALL_CONFIGS if not c.kwargs["VK"]]
                        + [(c, 256, 512) for c in ALL_CONFIGS if config_name(c) in _WIDE])


@pytest.mark.parametrize("config,K,V", _KEY_MAJOR_RECOMPUTE,
                         ids=[f"{config_name(c)}-K{K}" for c, K, _ in _KEY_MAJOR_RECOMPUTE])
def test_every_key_major_config_recompute_form(config, K, V):
    """gdn's recompute form (from A, v, beta; no output) in every key-major configuration at K = 128 and
    in the set above it at K = 256, where the key-major layout loads k once a chunk and takes its
    transpose (K_ONCE): packed, h and v_new saved, against fla's fwd_h and the fp64 reference."""
    c = CASES["gdn_wy"](K=K, V=V, cu_seqlens=CU)
    _compare(c, _ours(c, save_h=True, save_v_new=True, store_o=False, config=config), with_o=False)


def test_output_above_k128_runs_the_fixed_config():
    """With the output above K = 128 the autotuner is left BV16-w4-s1 (the s2 ones do not fit): its pick,
    and the result equal to the forced call's, bit for bit, on the documents' tokens."""
    c = CASES["gdn_wy"](K=256, V=512, cu_seqlens=CU)
    a = _ours(c, save_h=True, save_v_new=True)
    assert config_name(state_scan_fwd_kernel_tuned.best_config) in _WIDE_WITH_O
    b = _ours(c, save_h=True, save_v_new=True, config=next(x for x in ALL_CONFIGS if config_name(x) in _WIDE_WITH_O))
    rows = _rows(c)  # v_new past the last document (the case's 13 tokens outside every one) is never written
    differ = {n: (x.float() - y.float()).abs().max().item()
              for n, x, y in zip(("o", "final_state", "h", "v_new"), (a[0][:, rows], a[1], a[2], a[3][:, rows]),
                                 (b[0][:, rows], b[1], b[2], b[3][:, rows])) if not torch.equal(x, y)}
    assert not differ, differ
    _compare(c, a)


SHAPES = [("kda", 64, 64), ("kda", 64, 128), ("kda", 128, 128), ("gdn", 64, 64), ("gdn", 64, 256), ("gdn", 128, 256),
          ("gdn_wy", 64, 64), ("gdn_wy", 128, 256)]


@pytest.mark.parametrize("i", range(len(SHAPES)), ids=[f"{k}-K{K}-V{V}" for k, K, V in SHAPES])
def test_head_shapes(i):
    """K in {64, 128}, V in {64, 128, 256}; each with a different forced configuration (one
    compile per shape instead of a whole autotune)."""
    kind, K, V = SHAPES[i]
    fitting = [cf for cf in ALL_CONFIGS if cf.kwargs["BV"] <= V]
    c = CASES[kind](K=K, V=V)
    _compare(c, _ours(c, save_h=True, save_v_new=True, config=fitting[(3 * i + 1) % len(fitting)]))


@pytest.mark.parametrize("kind", ["kda", "gdn", "gdn_wy"])
def test_strong_decay_no_saves(kind):
    """Strong decay; the production variant (nothing saved) against fla's o and state."""
    c = CASES[kind](decay=8.0, H=4, HV=4, seed=1)
    o, ht, h, vn = _ours(c)
    assert h is None and vn is None
    _compare(c, (o, ht, None, None), check_saved=False)


def test_state_v_first():
    c = _kda_case(cu_seqlens=CU[:4])
    from fla.ops.common.chunk_delta_h import chunk_gated_delta_rule_fwd_h
    from fla.ops.gla.chunk import chunk_gla_fwd_o_gk
    h0t = c["initial_state"].transpose(-1, -2).contiguous()
    h, v_new, ht = chunk_gated_delta_rule_fwd_h(
        k=c["k"], w=c["w"], u=c["u"], gk=c["gk"], initial_state=h0t, output_final_state=True,
        cu_seqlens=c["cu_seqlens"], chunk_indices=c["chunk_indices"], chunk_size=BT, state_v_first=True)
    o = chunk_gla_fwd_o_gk(q=c["q"], v=v_new, g=c["gk"], A=c["Aqk"], h=h, scale=c["scale"], state_v_first=True,
                           cu_seqlens=c["cu_seqlens"], chunk_size=BT, chunk_indices=c["chunk_indices"])
    c = dict(c, initial_state=h0t)
    o2, ht2, h2, _ = _ours(c, save_h=True, state_v_first=True)
    rows = _rows(c)
    assert rel_rms(o2[:, rows], o[:, rows]) < TOL_FLA["o"]
    assert rel_rms(ht2, ht) < TOL_FLA["final_state"]
    assert rel_rms(h2, h) < TOL_FLA["h"]


def test_profiler_witness():
    """Ours ran, and neither of the fla kernels it replaces did."""
    c = _kda_case()
    _ours(c)  # compile and autotune outside the profile
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        _ours(c)
        torch.cuda.synchronize()
    names = [e.key for e in prof.key_averages()]
    assert any("state_scan_fwd_kernel" in n for n in names), names
    assert not any("chunk_gated_delta_rule_fwd_kernel_h" in n or "chunk_gla_fwd_kernel_o" in n for n in names)
