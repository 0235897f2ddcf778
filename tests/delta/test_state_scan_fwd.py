"""The forward state scan (o inside the scan) against the plain-torch reference.

CPU tier: the kernel runs through Triton's interpreter on CPU tensors (fp16/fp32; the
interpreter's bf16 dot is wrong, bf16 is checked on the GPU). Inputs are built from raw
q, k, v, beta and gates by the reference intra stage, so they have the structure the scan
meets in the chains (w, u from the WY inverse, kg, Aqk with the gate and scale inside).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernel_fun._common.witness import launches
from kernel_fun._delta import reference as ref
from kernel_fun._common.numerics import rel_rms
from kernel_fun._delta._kernels.state_scan_fwd import CANDIDATES, CONFIGS, config_name, state_scan_fwd

from chunk_masks import above_diagonal  # noqa: E402  (tests/delta/conftest.py puts this folder on sys.path)

ALL_CONFIGS = CONFIGS + CANDIDATES

BT = 64
SCALE = 0.3


def _raw(B, T, HQ, HV, K, V, gate, decay=2.0, seed=0):
    """Raw inputs: l2-normalized q/k, beta in (0, 2), natural-log gates (<= 0)."""
    gen = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(B, T, HQ, K, generator=gen, dtype=torch.float64), dim=-1)
    k = F.normalize(torch.randn(B, T, HQ, K, generator=gen, dtype=torch.float64), dim=-1)
    v = torch.randn(B, T, HV, V, generator=gen, dtype=torch.float64)
    beta = 2 * torch.rand(B, T, HV, generator=gen, dtype=torch.float64)
    graw = None
    if gate == "gk":
        graw = decay * F.logsigmoid(torch.randn(B, T, HV, K, generator=gen, dtype=torch.float64))
    elif gate in ("g", "g_aqk"):
        graw = decay * F.logsigmoid(torch.randn(B, T, HV, generator=gen, dtype=torch.float64))
    return q, k, v, beta, graw, gen


def _stage_inputs(gate, dtype, B=2, T=130, HQ=1, HV=2, K=32, V=64, cu_seqlens=None, decay=2.0,
                  with_h0=True, seed=0):
    """The scan's inputs (in ``dtype``) and the same values in fp64 for the reference."""
    q, k, v, beta, graw, gen = _raw(B, T, HQ, HV, K, V, gate, decay, seed)
    G = None if graw is None else ref.chunk_local_cumsum_ref(graw, BT, cu_seqlens, dtype=torch.float32)
    gate_kw = {"gk": G} if gate == "gk" else ({"g": G} if G is not None else {})
    it = ref.intra_ref(q, k, v, beta, scale=SCALE, chunk_size=BT, cu_seqlens=cu_seqlens, **gate_kw)
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    h0 = torch.randn(N, HV, K, V, generator=gen, dtype=torch.float32) if with_h0 else None
    # fla leaves Aqk's upper triangle unwritten: make it NaN, the scan must never read it.
    bounds = [int(c) for c in cu_seqlens] if cu_seqlens is not None else [0, T]
    upper = above_diagonal(bounds, BT)  # [T, BT]
    it["Aqk"][:, : bounds[-1]].masked_fill_(upper[None, :, None, :], float("nan"))
    # the wy= form's A: its zeros above the diagonal stored, as wy_inverse writes them (the contract)
    it["Akk"][:, : bounds[-1]].masked_fill_(upper[None, :, None, :], 0.0)
    x = {
        "q": q.to(dtype),
        "k": (it["kg"] if gate == "gk" else k).to(dtype),
        "w": it["w"].to(dtype),
        "u": it["u"].to(dtype),
        "Aqk": it["Aqk"].to(dtype) if gate in ("gk", "g_aqk") else None,
        "A": it["Akk"].to(dtype), "v": v.to(dtype), "beta": beta.to(dtype),
        **gate_kw,
    }
    return x, h0


def _reference(x, h0, cu_seqlens, state_v_first=False):
    o, ht, h, vn = ref.state_scan_fwd_ref(
        x["q"], x["k"], x["w"], x["u"], g=x.get("g"), gk=x.get("gk"), Aqk=x["Aqk"], scale=SCALE,
        initial_state=h0, output_final_state=True, cu_seqlens=cu_seqlens, chunk_size=BT)
    if state_v_first:
        ht, h = ht.transpose(-1, -2), h.transpose(-1, -2)
    return o, ht, h, vn


@pytest.fixture
def poisoned(poison_outputs):
    """Every output the launcher allocates starts as NaN: an unwritten element fails."""


def _check(name, out, expect, tol, rows=None):
    assert out is not None, name
    assert tuple(out.shape) == tuple(expect.shape), (name, out.shape, expect.shape)
    if rows is not None:  # only these tokens are defined (varlen v_new)
        out, expect = out[:, rows], expect[:, rows]
    assert torch.isfinite(out).all(), f"{name}: non-finite (unwritten?) elements"
    err = rel_rms(out, expect)
    assert err < tol, f"{name}: rel rms {err:.2e} >= {tol:.0e}"
    # and element-wise, so that a few wrong elements cannot hide in the norm
    worst = float((out.double() - expect.double()).abs().max() / expect.double().abs().max().clamp_min(1e-30))
    assert worst < 20 * tol, f"{name}: max abs error {worst:.2e} of max |ref|"


TOL = {torch.float16: 3e-3, torch.float32: 2e-5}
CU = torch.tensor([0, 37, 100, 164, 170], dtype=torch.int32)


def _run(gate, dtype, cu_seqlens=None, T=130, B=2, state_v_first=False, config=None, **kw):
    if cu_seqlens is not None:
        B = 1
    x, h0 = _stage_inputs(gate, dtype, B=B, T=T, cu_seqlens=cu_seqlens, **kw)
    o_ref, ht_ref, h_ref, vn_ref = _reference(x, h0, cu_seqlens, state_v_first)
    if state_v_first and h0 is not None:
        h0 = h0.transpose(-1, -2).contiguous()
    before = launches("delta.state_scan_fwd")
    o, ht, h, vn = state_scan_fwd(
        x["q"], x["k"], x["w"], x["u"], g=x.get("g"), gk=x.get("gk"), Aqk=x["Aqk"], scale=SCALE,
        initial_state=h0, output_final_state=True, cu_seqlens=cu_seqlens, chunk_size=BT,
        save_h=True, save_v_new=True, state_v_first=state_v_first, config=config)
    assert launches("delta.state_scan_fwd") == before + 1
    assert o.dtype == x["u"].dtype and ht.dtype == torch.float32
    assert h.dtype == x["k"].dtype and vn.dtype == x["u"].dtype
    tol = TOL[dtype]
    _check("o", o, o_ref, tol)
    _check("final_state", ht, ht_ref, tol)
    _check("h", h, h_ref, tol)
    rows = None if cu_seqlens is None else slice(0, int(cu_seqlens[-1]))
    _check("v_new", vn, vn_ref, tol, rows=rows)
    return o


@pytest.mark.parametrize("gate", ["gk", "g", "g_aqk", "none"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_fixed_length(poisoned, gate, dtype):
    """T = 130 (two full chunks and a partial one), grouped values (HQ = 1, HV = 2)."""
    _run(gate, dtype)


@pytest.mark.parametrize("gate", ["gk", "g"])
def test_varlen_with_padding_tail(poisoned, gate):
    """Four documents (one shorter than a chunk, one of 6 tokens) and 10 padding tokens."""
    o = _run(gate, torch.float16, cu_seqlens=CU, T=180)
    assert (o[:, int(CU[-1]):] == 0).all(), "padding tokens after the last sequence must be zero"


@pytest.mark.parametrize("gate", ["gk", "g"])
def test_strong_decay(poisoned, gate):
    """Per-token log-gates down to about -20: exp2 of the cumulative gate underflows."""
    _run(gate, torch.float16, decay=8.0, seed=3)


@pytest.mark.parametrize("gate", ["gk", "g"])
def test_state_v_first(poisoned, gate):
    """fla's ``state_v_first``: h0, the final state and h stored as [V, K]."""
    _run(gate, torch.float16, state_v_first=True, cu_seqlens=CU[:4], T=164)


@pytest.mark.parametrize("bv", sorted({c.kwargs["BV"] for c in ALL_CONFIGS if not c.kwargs["VK"]}))
def test_each_v_block_width(poisoned, bv):
    """Every BV of the autotune space (the interpreter otherwise runs only the first)."""
    config = next(c for c in ALL_CONFIGS if c.kwargs["BV"] == bv and not c.kwargs["VK"])
    _run("gk", torch.float16, config=config, K=64, V=64)


def test_forced_config_with_maxnreg(poisoned):
    config = next(c for c in ALL_CONFIGS if c.maxnreg is not None and not c.kwargs["VK"])
    _run("g", torch.float16, config=config, V=32)


def test_k64_v128_ungrouped(poisoned):
    _run("gk", torch.float16, B=1, HQ=2, HV=2, K=64, V=128, T=100)


@pytest.mark.parametrize("gate", ["gk", "g"])
def test_k128_two_state_slices(poisoned, gate):
    """K = 128: the state is held as two 64-row slices."""
    _run(gate, torch.float16, B=1, K=128, V=32, T=100)


@pytest.mark.parametrize("gate", ["gk", "g"])
def test_k256_key_major_two_wide_slices(poisoned, gate):
    """K = 256 in the key-major layout: the state as two 128-row slices (the output too, which the
    chain makes in its own kernel there); the recompute's form from A, packed, in test_wy_from_A_at_k256."""
    _run(gate, torch.float16, B=1, K=256, V=32, T=100, config=KM32)


def test_q_gated(poisoned):
    """KDA with qg = q * exp2(gk) precomputed ([B, T, HV, K]): same o, gk read at chunk ends only."""
    x, h0 = _stage_inputs("gk", torch.float16, K=128, V=32)
    o_ref, ht_ref, _, _ = _reference(x, h0, None)
    HV = x["w"].shape[2]
    qg = (x["q"].float().repeat_interleave(HV // x["q"].shape[2], dim=2) * torch.exp2(x["gk"])).to(x["q"].dtype)
    o, ht, _, _ = state_scan_fwd(qg, x["k"], x["w"], x["u"], gk=x["gk"], Aqk=x["Aqk"], scale=SCALE,
                                 initial_state=h0, output_final_state=True, q_gated=True)
    _check("o", o, o_ref, TOL[torch.float16])
    _check("final_state", ht, ht_ref, TOL[torch.float16])
    with pytest.raises(ValueError, match="q_gated"):
        state_scan_fwd(x["q"], x["k"], x["w"], x["u"], gk=x["gk"], Aqk=x["Aqk"], scale=SCALE, q_gated=True)


def test_without_optional_outputs():
    """No initial state, no final state, nothing saved: only o comes back."""
    x, _ = _stage_inputs("gk", torch.float16, with_h0=False)
    o_ref, *_ = _reference(x, None, None)
    o, ht, h, vn = state_scan_fwd(x["q"], x["k"], x["w"], x["u"], gk=x["gk"], Aqk=x["Aqk"], scale=SCALE)
    assert ht is None and h is None and vn is None
    _check("o", o, o_ref, TOL[torch.float16])


@pytest.mark.parametrize("config", [None, "VK32"], ids=["key_major", "value_major"])
@pytest.mark.parametrize("varlen", [False, True])
def test_recompute_without_output(poisoned, config, varlen):
    """GDN's backward recompute (``store_o=False``): h, v_new and the final state as with the
    output, no o allocated; the queries are never read (passed as NaN)."""
    cu = CU if varlen else None
    x, h0 = _stage_inputs("g", torch.float16, B=1 if varlen else 2, T=180 if varlen else 130, cu_seqlens=cu)
    _, ht_ref, h_ref, vn_ref = _reference(x, h0, cu)
    before = launches("delta.state_scan_fwd")
    o, ht, h, vn = state_scan_fwd(
        torch.full_like(x["q"], float("nan")), x["k"], x["w"], x["u"], g=x["g"], scale=SCALE, initial_state=h0,
        output_final_state=True, cu_seqlens=cu, save_h=True, save_v_new=True, store_o=False,
        config=VK32 if config else None)
    assert launches("delta.state_scan_fwd") == before + 1
    assert o is None
    _check("final_state", ht, ht_ref, TOL[torch.float16])
    _check("h", h, h_ref, TOL[torch.float16])
    rows = None if cu is None else slice(0, int(cu[-1]))
    _check("v_new", vn, vn_ref, TOL[torch.float16], rows=rows)
    with pytest.raises(ValueError, match="nothing else"):
        state_scan_fwd(x["q"], x["k"], x["w"], x["u"], g=x["g"], scale=SCALE, store_o=False)


def test_argument_errors():
    x, _ = _stage_inputs("gk", torch.float16)
    with pytest.raises(ValueError, match="needs Aqk"):
        state_scan_fwd(x["q"], x["k"], x["w"], x["u"], gk=x["gk"], scale=SCALE)
    with pytest.raises(ValueError, match="not both"):
        state_scan_fwd(x["q"], x["k"], x["w"], x["u"], g=x["gk"][..., 0], gk=x["gk"], Aqk=x["Aqk"], scale=SCALE)
    with pytest.raises(TypeError, match="scale"):
        state_scan_fwd(x["q"], x["k"], x["w"], x["u"], gk=x["gk"], Aqk=x["Aqk"])
    with pytest.raises(ValueError, match="B == 1"):
        state_scan_fwd(x["q"], x["k"], x["w"], x["u"], gk=x["gk"], Aqk=x["Aqk"], scale=SCALE, cu_seqlens=CU)


# The value-major layout (VK: the state held as S^T [BV, K]) is a second code path of the same
# kernel; the interpreter runs the first configuration (key-major) unless one is forced.
VK32 = next(c for c in ALL_CONFIGS if c.kwargs["VK"] and c.kwargs["BV"] == 32)
KM32 = next(c for c in ALL_CONFIGS if not c.kwargs["VK"] and c.kwargs["BV"] == 32 and c.maxnreg is None)


@pytest.mark.parametrize("gate", ["gk", "g", "g_aqk", "none"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_value_major_fixed_length(poisoned, gate, dtype):
    _run(gate, dtype, config=VK32)


@pytest.mark.parametrize("gate", ["gk", "g"])
def test_value_major_varlen_state_v_first(poisoned, gate):
    o = _run(gate, torch.float16, cu_seqlens=CU, T=180, config=VK32, state_v_first=True)
    assert (o[:, int(CU[-1]):] == 0).all()


@pytest.mark.parametrize("gate", ["gk", "g"])
def test_value_major_k128_strong_decay(poisoned, gate):
    _run(gate, torch.float16, B=1, K=128, V=64, T=100, decay=8.0, seed=3, config=VK32)


@pytest.mark.parametrize("config", [c for c in ALL_CONFIGS if c.kwargs["VK"]], ids=config_name)
def test_value_major_each_config(poisoned, config):
    _run("gk", torch.float16, B=1, K=64, V=64, T=70, config=config)


def test_value_major_q_gated(poisoned):
    x, h0 = _stage_inputs("gk", torch.float16, K=128, V=64)
    o_ref, ht_ref, _, _ = _reference(x, h0, None)
    HV = x["w"].shape[2]
    qg = (x["q"].float().repeat_interleave(HV // x["q"].shape[2], dim=2) * torch.exp2(x["gk"])).to(x["q"].dtype)
    o, ht, _, _ = state_scan_fwd(qg, x["k"], x["w"], x["u"], gk=x["gk"], Aqk=x["Aqk"], scale=SCALE,
                                 initial_state=h0, output_final_state=True, q_gated=True, config=VK32)
    _check("o", o, o_ref, TOL[torch.float16])
    _check("final_state", ht, ht_ref, TOL[torch.float16])


# The reference itself: the chunked stages agree with the token-by-token recurrence.

@pytest.mark.parametrize("gate", ["gk", "g", "none"])
@pytest.mark.parametrize("varlen", [False, True])
def test_chunked_reference_matches_recurrence(gate, varlen):
    cu = CU if varlen else None
    B, T = (1, 170) if varlen else (2, 130)
    q, k, v, beta, graw, gen = _raw(B, T, 1, 2, 16, 8, gate, decay=4.0)
    G = None if graw is None else ref.chunk_local_cumsum_ref(graw, BT, cu)
    gkw = {"gk": G} if gate == "gk" else ({"g": G} if G is not None else {})
    N = B if cu is None else cu.numel() - 1
    h0 = torch.randn(N, 2, 16, 8, generator=gen, dtype=torch.float64)
    it = ref.intra_ref(q, k, v, beta, scale=SCALE, chunk_size=BT, cu_seqlens=cu, **gkw)
    o, ht, _, _ = ref.state_scan_fwd_ref(
        q, it["kg"] if gate == "gk" else k, it["w"], it["u"], Aqk=it["Aqk"] if gate == "gk" else None,
        scale=SCALE, initial_state=h0, output_final_state=True, cu_seqlens=cu, chunk_size=BT, **gkw)
    rkw = {"gk": graw} if gate == "gk" else ({"g": graw} if graw is not None else {})
    o2, ht2 = ref.naive_recurrence_ref(q, k, v, beta, scale=SCALE, initial_state=h0,
                                      output_final_state=True, cu_seqlens=cu, **rkw)
    assert rel_rms(o, o2) < 1e-10 and rel_rms(ht, ht2) < 1e-10


@pytest.mark.parametrize("layout", ["key_major", "value_major"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("gate", ["g", "none"])
def test_wy_from_A(poisoned, layout, dtype, gate):
    """``wy=(A, v, beta)`` (GDN's forward: fla's recompute_w_u never runs) gives what w, u give:
    o, h, v_new and the final state against the reference, A with its zeros above the diagonal
    stored as wy_inverse writes them, T = 130 (a partial chunk), grouped values; then packed
    documents, and the backward's recompute (no output, queries NaN). A is masked by its rows only:
    with NaN above its diagonal, NaN shows."""
    config = VK32 if layout == "value_major" else None
    for cu, T, store_o in ((None, 130, True), (CU, 180, True), (CU, 180, False)):
        B = 1 if cu is not None else 2
        x, h0 = _stage_inputs(gate, dtype, B=B, T=T, cu_seqlens=cu)
        o_ref, ht_ref, h_ref, vn_ref = _reference(x, h0, cu)
        q = x["q"] if store_o else torch.full_like(x["q"], float("nan"))
        o, ht, h, vn = state_scan_fwd(
            q, x["k"], None, None, g=x.get("g"), scale=SCALE, initial_state=h0, output_final_state=True,
            cu_seqlens=cu, save_h=True, save_v_new=True, store_o=store_o, wy=(x["A"], x["v"], x["beta"]),
            config=config)
        tol = TOL[dtype]
        if store_o:
            _check("o", o, o_ref, tol)
        else:
            assert o is None
        _check("final_state", ht, ht_ref, tol)
        _check("h", h, h_ref, tol)
        _check("v_new", vn, vn_ref, tol, rows=None if cu is None else slice(0, int(cu[-1])))
    # the entries above the diagonal are read (the stored zeros are the contract): NaN there shows
    x, h0 = _stage_inputs(gate, dtype)
    A_nan = x["A"].masked_fill(above_diagonal([0, x["A"].shape[1]], BT)[None, :, None, :], float("nan"))
    _, ht, _, _ = state_scan_fwd(x["q"], x["k"], None, None, g=x.get("g"), scale=SCALE, initial_state=h0,
                                 output_final_state=True, wy=(A_nan, x["v"], x["beta"]), config=config)
    assert torch.isnan(ht).any()


@pytest.mark.parametrize("layout", ["key_major", "value_major"])
def test_wy_from_A_at_k256(poisoned, layout):
    """The scan as the chain runs it at fla's default GatedDeltaNet heads (K = 256): from A, v, beta,
    packed documents, h and v_new written, no output (the split forward's and the recompute's form)."""
    x, h0 = _stage_inputs("g", torch.float16, B=1, T=180, K=256, V=32, cu_seqlens=CU)
    _, ht_ref, h_ref, vn_ref = _reference(x, h0, CU)
    o, ht, h, vn = state_scan_fwd(
        torch.full_like(x["q"], float("nan")), x["k"], None, None, g=x["g"], scale=SCALE, initial_state=h0,
        output_final_state=True, cu_seqlens=CU, save_h=True, save_v_new=True, store_o=False,
        wy=(x["A"], x["v"], x["beta"]), config=KM32 if layout == "key_major" else VK32)
    assert o is None
    tol = TOL[torch.float16]
    _check("final_state", ht, ht_ref, tol)
    _check("h", h, h_ref, tol)
    _check("v_new", vn, vn_ref, tol, rows=slice(0, int(CU[-1])))


def test_wy_from_A_argument_errors():
    x, _ = _stage_inputs("g", torch.float16)
    wy = (x["A"], x["v"], x["beta"])
    with pytest.raises(ValueError, match="not both"):
        state_scan_fwd(x["q"], x["k"], x["w"], x["u"], g=x["g"], scale=SCALE, wy=wy)
    with pytest.raises(ValueError, match="required"):
        state_scan_fwd(x["q"], x["k"], None, None, g=x["g"], scale=SCALE)
    with pytest.raises(ValueError, match="must be"):
        state_scan_fwd(x["q"], x["k"], None, None, g=x["g"], scale=SCALE, wy=(x["A"][..., :32], x["v"], x["beta"]))
    gx, _ = _stage_inputs("gk", torch.float16)
    with pytest.raises(ValueError, match="not gk"):
        state_scan_fwd(gx["q"], gx["k"], None, None, gk=gx["gk"], Aqk=gx["Aqk"], scale=SCALE,
                       wy=(gx["A"], gx["v"], gx["beta"]))


def test_autotune_sets_by_k():
    """The scans' autotune sets: at K <= 128 exactly the configurations measured there; at K = 256
    (fla's default GatedDeltaNet heads) the forward's narrow key-major ones (two [128, BV] slices, no
    stack, timed on an H100 there), the backward's narrow ones the sm_90a compile left without stack."""
    from kernel_fun._delta._kernels import state_scan_bwd as b
    from kernel_fun._delta._kernels import state_scan_fwd as f

    def fwd(K, V):
        return [f.config_name(c) for c in f._prune(f.CONFIGS, {}, K=K, V=V)]

    def bwd(K, V):
        return [b.config_name(c) for c in b._prune(b.CONFIGS, {}, K=K, V=V)]

    assert fwd(128, 128) == ["BV64-w4-s2-rNone", "BV128-w8-s2-rNone", "VK-BV128-w8-s2-rNone", "VK-BV64-w4-s2-rNone"]
    assert fwd(256, 512) == ["BV32-w4-s2-rNone", "BV64-w8-s2-rNone", "BV16-w4-s1-rNone"]
    # with the output above K = 128 only the configuration whose shared memory holds it
    assert [f.config_name(c) for c in f._prune(f.CONFIGS, {}, K=256, V=512, STORE_O=True)] == ["BV16-w4-s1-rNone"]
    assert fwd(128, 128) == [f.config_name(c) for c in f._prune(f.CONFIGS, {}, K=128, V=128, STORE_O=True)]
    assert bwd(128, 128) == ["BV32-w4-s2", "BV64-w4-s2", "BV128-w8-s2"]
    assert bwd(256, 512) == ["BV64-w8-s2", "BV16-w4-s2"]
