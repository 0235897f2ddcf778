"""The backward state scan (fla's dhu) against the plain-torch reference.

CPU tier: the kernel runs through Triton's interpreter on CPU tensors (fp16/fp32). Inputs
come from the reference forward (w, kg, h from the WY stage and the forward scan), so they
have the structure the scan meets in the chains; do, dv and dht are random.
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

BT = 64
SCALE = 0.3
TOL = {torch.float16: 3e-3, torch.float32: 2e-5}
CU = torch.tensor([0, 37, 100, 164, 170], dtype=torch.int32)


def _inputs(gate, dtype, B=2, T=130, HQ=1, HV=2, K=32, V=64, cu_seqlens=None, decay=2.0, dht=True, seed=0):
    """The scan's inputs in ``dtype``: q (qg with the per-channel gate), k (kg), w, do, dv, the
    gate and dht."""
    gen = torch.Generator().manual_seed(seed)
    f64 = torch.float64
    q = F.normalize(torch.randn(B, T, HQ, K, generator=gen, dtype=f64), dim=-1)
    k = F.normalize(torch.randn(B, T, HQ, K, generator=gen, dtype=f64), dim=-1)
    v = torch.randn(B, T, HV, V, generator=gen, dtype=f64)
    beta = 2 * torch.rand(B, T, HV, generator=gen, dtype=f64)
    shape = (B, T, HV, K) if gate == "gk" else (B, T, HV)
    G = None
    if gate != "none":
        graw = decay * F.logsigmoid(torch.randn(*shape, generator=gen, dtype=f64))
        G = ref.chunk_local_cumsum_ref(graw, BT, cu_seqlens, dtype=torch.float32)
    gate_kw = {"gk": G} if gate == "gk" else ({"g": G} if G is not None else {})
    it = ref.intra_ref(q, k, v, beta, scale=SCALE, chunk_size=BT, cu_seqlens=cu_seqlens, **gate_kw)
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    if gate == "gk":  # KDA hands the scan the gated queries and keys
        qg = q.repeat_interleave(HV // HQ, 2) * torch.exp2(G.double())
        q_in, k_in = qg, it["kg"]
    else:
        q_in, k_in = q, k
    x = dict(q=q_in.to(dtype), k=k_in.to(dtype), w=it["w"].to(dtype),
             do=torch.randn(B, T, HV, V, generator=gen).to(dtype),
             dv=torch.randn(B, T, HV, V, generator=gen).to(dtype),
             dht=torch.randn(N, HV, K, V, generator=gen) if dht else None, **gate_kw)
    # the WY inverse and beta (the wy= form): A_wy with its zeros above the diagonal stored, as
    # wy_inverse writes them (the form's contract: the scan masks A_wy by rows only)
    bounds = [int(c) for c in cu_seqlens] if cu_seqlens is not None else [0, T]
    x["upper"] = torch.zeros(T, BT, dtype=torch.bool)  # [T, BT]: above each chunk's diagonal
    x["upper"][: bounds[-1]] = above_diagonal(bounds, BT)
    x["A_wy"] = it["Akk"].masked_fill(x["upper"][None, :, None, :], 0.0).to(dtype)
    x["beta"] = beta.to(dtype)
    return x


@pytest.fixture
def poisoned(poison_outputs):
    pass


def _check(name, out, expect, tol):
    assert tuple(out.shape) == tuple(expect.shape), (name, out.shape, expect.shape)
    assert torch.isfinite(out).all(), f"{name}: non-finite (unwritten?) elements"
    err = rel_rms(out, expect)
    assert err < tol, f"{name}: rel rms {err:.2e} >= {tol:.0e}"
    worst = float((out.double() - expect.double()).abs().max() / expect.double().abs().max().clamp_min(1e-30))
    assert worst < 20 * tol, f"{name}: max abs error {worst:.2e} of max |ref|"


def _run(gate, dtype, cu_seqlens=None, config=None, with_h0=True, **kw):
    if cu_seqlens is not None:
        kw["B"] = 1
    x = _inputs(gate, dtype, cu_seqlens=cu_seqlens, **kw)
    dh_ref, dh0_ref, dv2_ref = ref.state_scan_bwd_ref(
        x["q"], x["k"], x["w"], x["do"], x["dv"], g=x.get("g"), gk=x.get("gk"), dht=x["dht"], scale=SCALE,
        cu_seqlens=cu_seqlens, chunk_size=BT)
    N = dh0_ref.shape[0]
    h0 = torch.zeros(N, *dh0_ref.shape[1:]) if with_h0 else None
    before = launches("delta.state_scan_bwd")
    dh, dh0, dv2 = state_scan_bwd(
        x["q"], x["k"], x["w"], x["do"], x["dv"], g=x.get("g"), gk=x.get("gk"), h0=h0, dht=x["dht"],
        scale=SCALE, cu_seqlens=cu_seqlens, chunk_size=BT, config=config)
    assert launches("delta.state_scan_bwd") == before + 1
    assert dh.dtype == x["q"].dtype and dv2.dtype == x["dv"].dtype
    tol = TOL[dtype]
    _check("dh", dh, dh_ref, tol)
    _check("dv2", dv2, dv2_ref, tol)
    if with_h0:
        assert dh0.dtype == torch.float32
        _check("dh0", dh0, dh0_ref, tol)
    else:
        assert dh0 is None


@pytest.mark.parametrize("gate", ["gk", "g", "none"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_fixed_length(poisoned, gate, dtype):
    _run(gate, dtype)


@pytest.mark.parametrize("gate", ["gk", "g"])
def test_varlen(poisoned, gate):
    _run(gate, torch.float32, cu_seqlens=CU, T=170)


def test_grouped_heads_scalar_gate_k128(poisoned):
    """GDN's layout: q, k at fewer heads than v; K = 128 (KP = 128)."""
    _run("g", torch.float16, HQ=1, HV=2, K=128, V=32, T=100)


def test_strong_decay_without_dht_or_h0(poisoned):
    _run("gk", torch.float32, decay=20.0, dht=False, with_h0=False)


@pytest.mark.parametrize("config", CONFIGS + CANDIDATES, ids=config_name)
def test_each_config(poisoned, config):
    _run("gk", torch.float32, cu_seqlens=CU, T=170, V=128, config=config)


@pytest.mark.parametrize("case", ["fixed", "varlen", "fixed_no_dht"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_dv_made_from_A(poisoned, case, dtype):
    """``A=`` (KDA's Aqk, NaN above the diagonal: not to be read) in place of dv: the scan
    makes dv = tril(A)^T do per chunk itself; against the reference scan fed the reference
    dv of fla's chunk_kda_bwd_dAv (kda.reference_stages.dAv_reference)."""
    from kernel_fun.kda.reference_stages import dAv_reference

    cu = CU if case == "varlen" else None
    x = _inputs("gk", dtype, cu_seqlens=cu, dht=case != "fixed_no_dht",
                **({"B": 1, "T": 170} if cu is not None else {}))
    gen = torch.Generator().manual_seed(3)
    B, T, HV, _ = x["w"].shape
    A = (torch.randn(B, T, HV, BT, generator=gen) * 0.2).to(dtype)
    bounds = cu.tolist() if cu is not None else [0, T]
    above = above_diagonal(bounds, BT)[None, :, None, :]  # fla's Aqk leaves these unwritten
    A = A.masked_fill(above, float("nan"))
    _, dv_local = dAv_reference(x["do"], x["do"], A, SCALE, cu_seqlens=cu, chunk_size=BT)
    dh_ref, dh0_ref, dv2_ref = ref.state_scan_bwd_ref(
        x["q"], x["k"], x["w"], x["do"], dv_local, gk=x["gk"], dht=x["dht"], scale=SCALE, cu_seqlens=cu,
        chunk_size=BT)
    h0 = torch.zeros(dh0_ref.shape)
    dh, dh0, dv2 = state_scan_bwd(x["q"], x["k"], x["w"], x["do"], None, gk=x["gk"], h0=h0, dht=x["dht"],
                                  scale=SCALE, cu_seqlens=cu, chunk_size=BT, A=A)
    assert dv2.dtype == x["do"].dtype
    for name, got, want in (("dh", dh, dh_ref), ("dh0", dh0, dh0_ref), ("dv2", dv2, dv2_ref)):
        _check(name, got, want, TOL[dtype])


def test_argument_errors():
    x = _inputs("gk", torch.float32)
    with pytest.raises(TypeError, match="scale"):
        state_scan_bwd(x["q"], x["k"], x["w"], x["do"], x["dv"], gk=x["gk"])
    with pytest.raises(ValueError, match="not both"):
        state_scan_bwd(x["q"], x["k"], x["w"], x["do"], x["dv"], gk=x["gk"], g=x["gk"][..., 0], scale=SCALE)
    with pytest.raises(NotImplementedError):
        state_scan_bwd(x["q"], x["k"], x["w"], x["do"], x["dv"], gk=x["gk"], scale=SCALE, state_v_first=True)
    A = torch.zeros(*x["w"].shape[:3], BT)
    with pytest.raises(ValueError, match="one of them"):
        state_scan_bwd(x["q"], x["k"], x["w"], x["do"], x["dv"], gk=x["gk"], scale=SCALE, A=A)
    with pytest.raises(ValueError, match="one of them"):
        state_scan_bwd(x["q"], x["k"], x["w"], x["do"], None, gk=x["gk"], scale=SCALE)
    with pytest.raises(ValueError, match="must be"):
        state_scan_bwd(x["q"], x["k"], x["w"], x["do"], None, gk=x["gk"], scale=SCALE, A=A[..., :32])


def test_reference_is_autograd_of_the_forward():
    """The reference's dh0 and dv2 are the gradients of the forward reference's outputs: with
    o = scan(q, k, w, u, h0) and loss <do, o> + <dht, final>, d loss / d h0 = dh0 and
    d loss / d u (through v_new = u - w S, whose gradient flows as dv2) match."""
    x = _inputs("gk", torch.float64, B=1, T=100, V=16)
    gen = torch.Generator().manual_seed(5)
    B, T, HV, K = x["w"].shape
    V = x["do"].shape[-1]
    u = torch.randn(B, T, HV, V, generator=gen, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(1, HV, K, V, generator=gen, dtype=torch.float64, requires_grad=True)
    # the forward with qg as the query: pass q = qg and a zero gate for the output gating, the
    # real gate for the decay, i.e. o = scale qg S + Aqk v_new with Aqk = 0 (dv carries that part)
    zeros = torch.zeros(B, T, HV, 64, dtype=torch.float64)
    qg, kg, gk = x["q"], x["k"], x["gk"]
    o, ht, _, v_new = ref.state_scan_fwd_ref(qg * torch.exp2(-gk.double()), kg, x["w"], u, gk=gk, Aqk=zeros,
                                             scale=SCALE, initial_state=h0, output_final_state=True)
    (o * x["do"].double()).sum().add((ht * x["dht"].double()).sum()).backward()
    dh, dh0, dv2 = ref.state_scan_bwd_ref(qg, kg, x["w"], x["do"], torch.zeros_like(x["dv"]), gk=gk,
                                          dht=x["dht"], scale=SCALE)
    assert rel_rms(dh0, h0.grad) < 1e-10
    assert rel_rms(dv2, u.grad) < 1e-10


@pytest.mark.parametrize("case", ["fixed", "varlen", "none_gate"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_wy_in_place_of_w(poisoned, case, dtype):
    """``wy=(A_wy, beta)`` (GDN's backward without fla's recompute_w_u): dv2^T w made as
    ((dv2^T A_wy) diag(beta gamma)) K, A_wy with its zeros above the diagonal stored; against the
    reference scan fed w, with a given dv and with the gated scores made inside (``A=``, NaN above
    the diagonal, and zero there with ``A_tril``, as the GDN chain calls it: dv = tril(A)^T do)."""
    from kernel_fun.kda.reference_stages import dAv_reference

    cu = CU if case == "varlen" else None
    x = _inputs("none" if case == "none_gate" else "g", dtype, cu_seqlens=cu,
                **({"B": 1, "T": 170} if cu is not None else {}))
    B, T, HV, _ = x["w"].shape
    A = (torch.randn(B, T, HV, BT, generator=torch.Generator().manual_seed(5)) * 0.2).to(dtype)
    A = A.masked_fill(x["upper"][None, :, None, :], float("nan"))  # fla's unwritten upper triangle
    _, dv_local = dAv_reference(x["do"], x["do"], A, SCALE, cu_seqlens=cu, chunk_size=BT)
    h0 = torch.zeros(x["dht"].shape)
    # the third leg: A stored with zeros above the diagonal, as gdn's gated scores write it, and
    # A_tril=True (loaded without the triangular mask), as the GDN chain calls it
    A_zero = A.nan_to_num(0.0)
    for dv, A_in, tril, dv_ref in ((x["dv"], None, False, x["dv"]), (None, A, False, dv_local),
                                   (None, A_zero, True, dv_local)):
        dh_ref, dh0_ref, dv2_ref = ref.state_scan_bwd_ref(
            x["q"], x["k"], x["w"], x["do"], dv_ref, g=x.get("g"), dht=x["dht"], scale=SCALE, cu_seqlens=cu,
            chunk_size=BT)
        for config in (None, CONFIGS[1]):
            dh, dh0, dv2 = state_scan_bwd(x["q"], x["k"], None, x["do"], dv, g=x.get("g"), h0=h0, dht=x["dht"],
                                          scale=SCALE, cu_seqlens=cu, chunk_size=BT, A=A_in,
                                          wy=(x["A_wy"], x["beta"]), config=config, A_tril=tril)
            for name, got, want in (("dh", dh, dh_ref), ("dh0", dh0, dh0_ref), ("dv2", dv2, dv2_ref)):
                _check(name, got, want, TOL[dtype])
    # A_tril=True reaches the kernel: the entries above the diagonal are read (NaN there shows)
    _, _, dv2 = state_scan_bwd(x["q"], x["k"], None, x["do"], None, g=x.get("g"), dht=x["dht"], scale=SCALE,
                               cu_seqlens=cu, chunk_size=BT, A=A, wy=(x["A_wy"], x["beta"]), A_tril=True)
    assert torch.isnan(dv2).any()
    # A_wy's entries above the diagonal are read (the stored zeros are the contract): NaN there shows
    # (in dh0: the packed case's documents are one chunk each)
    A_wy_nan = x["A_wy"].masked_fill(x["upper"][None, :, None, :], float("nan"))
    _, dh0, _ = state_scan_bwd(x["q"], x["k"], None, x["do"], None, g=x.get("g"), h0=h0, dht=x["dht"],
                               scale=SCALE, cu_seqlens=cu, chunk_size=BT, A=A_zero, wy=(A_wy_nan, x["beta"]),
                               A_tril=True)
    assert torch.isnan(dh0).any()


def test_wy_argument_errors():
    x = _inputs("g", torch.float32)
    wy = (x["A_wy"], x["beta"])
    with pytest.raises(ValueError, match="replaces w"):
        state_scan_bwd(x["q"], x["k"], x["w"], x["do"], x["dv"], g=x["g"], scale=SCALE, wy=wy)
    with pytest.raises(ValueError, match="required"):
        state_scan_bwd(x["q"], x["k"], None, x["do"], x["dv"], g=x["g"], scale=SCALE)
    with pytest.raises(ValueError, match="must be"):
        state_scan_bwd(x["q"], x["k"], None, x["do"], x["dv"], g=x["g"], scale=SCALE, wy=(x["A_wy"][..., :32], x["beta"]))

