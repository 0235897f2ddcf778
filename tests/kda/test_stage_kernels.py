"""KDA backward stage kernels (intra_bwd, wy_bwd) through Triton's interpreter (CPU) against
their plain-torch stage references (``kda/reference_stages.py``).

Stage inputs come from a small fp64 torch implementation of KDA's chunked forward and of the
backward stages before these two (dAv, dhu), so Akk, h, v_new, dh and the dA matrices have
the structure and magnitudes the real chain gives them. ``test_stage_references_chain``
checks that the two references, chained with that torch code, reproduce autograd through
the naive recurrence: the references are themselves right, not only consistent.

Outputs are NaN-poisoned (``_common.tuning.alloc``) so an unwritten element fails.
"""
from __future__ import annotations


import pytest
import torch

from kernel_fun._common.witness import launch_counts
from kernel_fun.kda import reference_stages as refs

RCP_LN2 = 1.4426950408889634
BT = 64


from kernel_fun._common.numerics import rel_rms as rel_err  # noqa: E402


@pytest.fixture(autouse=True)
def poison(poison_outputs):
    pass


# --------------------------------------------------------------------------------------------
# a small fp64 KDA chain: forward pieces and the backward stages that feed intra / wy
# --------------------------------------------------------------------------------------------

def _segments(B, T, cu):
    return refs._segments(T, B, cu)


def chunk_cumsum(g_raw, cu, reverse=False):
    """Chunk-local (reverse) cumsum along T, chunks counted from each sequence start."""
    out = torch.zeros_like(g_raw)
    B, T = g_raw.shape[:2]
    for b, bos, eos in _segments(B, T, cu):
        for s in range(bos, eos, BT):
            e = min(s + BT, eos)
            x = g_raw[b, s:e]
            out[b, s:e] = x.flip(0).cumsum(0).flip(0) if reverse else x.cumsum(0)
    return out


def build_chain(B, T, H, HV, K, V, cu=None, decay="normal", beta_max=1.0, seed=0, h0=False):
    """Forward + the backward up to (and including) dhu, in fp64. Returns a dict of tensors
    named as fla names them (g is the log2-space chunk-local cumsum)."""
    gen = torch.Generator().manual_seed(seed)
    f64 = torch.float64
    G = HV // H
    scale = K ** -0.5
    q = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen, dtype=f64), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen, dtype=f64), dim=-1)
    v = torch.randn(B, T, HV, V, generator=gen, dtype=f64)
    if decay == "strong":  # per-token log decay spread down to -20
        g_raw = -20.0 * torch.rand(B, T, HV, K, generator=gen, dtype=f64) ** 2
    else:
        g_raw = torch.nn.functional.logsigmoid(torch.randn(B, T, HV, K, generator=gen, dtype=f64) + 2.0)
    beta = beta_max * torch.rand(B, T, HV, generator=gen, dtype=f64)
    do = torch.randn(B, T, HV, V, generator=gen, dtype=f64)
    g = chunk_cumsum(g_raw, cu) * RCP_LN2

    segs = _segments(B, T, cu)
    NT_total = sum((e - s + BT - 1) // BT for _, s, e in segs)
    NT = NT_total if cu is not None else (T + BT - 1) // BT
    hB = 1 if cu is not None else B
    h = torch.zeros(hB, NT, HV, K, V, dtype=f64)
    dh = torch.zeros_like(h)
    Aqk = torch.zeros(B, T, HV, BT, dtype=f64)
    Akk = torch.zeros(B, T, HV, BT, dtype=f64)
    v_new = torch.zeros(B, T, HV, V, dtype=f64)
    o = torch.zeros(B, T, HV, V, dtype=f64)
    dAqk = torch.zeros(B, T, HV, BT, dtype=f64)
    dv = torch.zeros(B, T, HV, V, dtype=f64)
    state0 = torch.randn(len(segs), HV, K, V, generator=gen, dtype=f64) if h0 else None
    ci = 0
    for n, (b, bos, eos) in enumerate(segs):
        hb = 0 if cu is not None else b
        c_base = ci if cu is not None else 0
        S = state0[n].clone() if h0 else torch.zeros(HV, K, V, dtype=f64)
        chunks = list(range(bos, eos, BT))
        saved = []
        for c, s in enumerate(chunks):
            e = min(s + BT, eos)
            n_t = e - s
            qc = q[b, s:e].repeat_interleave(G, 1).transpose(0, 1)  # [HV, n, K]
            kc = k[b, s:e].repeat_interleave(G, 1).transpose(0, 1)
            gc = g[b, s:e].transpose(0, 1)
            vc = v[b, s:e].transpose(0, 1)  # [HV, n, V]
            bc = beta[b, s:e].transpose(0, 1)  # [HV, n]
            E = torch.exp2(gc[:, :, None, :] - gc[:, None, :, :])  # [HV, i, j, K]
            tri = torch.tril(torch.ones(n_t, n_t, dtype=torch.bool))
            Aq = torch.where(tri, scale * torch.einsum("hic,hjc,hijc->hij", qc, kc, E), 0)
            Lm = torch.where(torch.tril(tri, -1), bc[:, :, None] * torch.einsum("hic,hjc,hijc->hij", kc, kc, E), 0)
            Ak = torch.linalg.inv(torch.eye(n_t, dtype=f64) + Lm)
            w = Ak @ (bc[..., None] * kc * torch.exp2(gc))
            u = Ak @ (bc[..., None] * vc)
            h[hb, c_base + c] = S
            vn = u - w @ S
            gn = gc[:, -1]  # [HV, K]
            kg = kc * torch.exp2(gn[:, None, :] - gc)
            o[b, s:e] = (scale * (qc * torch.exp2(gc)) @ S + Aq @ vn).transpose(0, 1)
            S = torch.exp2(gn)[..., None] * S + kg.transpose(-1, -2) @ vn
            Aqk[b, s:e, :, :n_t] = Aq.transpose(0, 1)
            Akk[b, s:e, :, :n_t] = Ak.transpose(0, 1)
            v_new[b, s:e] = vn.transpose(0, 1)
            doc = do[b, s:e].transpose(0, 1)
            dAqk[b, s:e, :, :n_t] = (torch.where(tri, doc @ vn.transpose(-1, -2), 0) * scale).transpose(0, 1)
            saved.append((s, e, qc, gc, w, kg, gn, Aq, doc))
        # dhu: reverse over chunks; dh[c] is the gradient of the state leaving chunk c
        dS = torch.zeros(HV, K, V, dtype=f64)
        for c in range(len(chunks) - 1, -1, -1):
            s, e, qc, gc, w, kg, gn, Aq, doc = saved[c]
            dh[hb, c_base + c] = dS
            dvc = Aq.transpose(-1, -2) @ doc + kg @ dS
            dv[b, s:e] = dvc.transpose(0, 1)
            dS = torch.exp2(gn)[..., None] * dS + scale * (qc * torch.exp2(gc)).transpose(-1, -2) @ doc \
                - w.transpose(-1, -2) @ dvc
        ci += len(chunks)
    return dict(q=q, k=k, v=v, g_raw=g_raw, g=g, beta=beta, do=do, scale=scale, Aqk=Aqk, Akk=Akk,
                v_new=v_new, h=h, dh=dh, dAqk=dAqk, dv=dv, o=o, state0=state0)


def naive_kda(q, k, v, g_raw, beta, scale, cu, state0=None):
    """Token-by-token recurrence (natural-log gates), fp64, autograd-able."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    G = HV // H
    rows = [[None] * T for _ in range(B)]
    for n, (b, bos, eos) in enumerate(_segments(B, T, cu)):
        S = state0[n] if state0 is not None else q.new_zeros(HV, K, V)
        for t in range(bos, eos):
            qt = q[b, t].repeat_interleave(G, 0) * scale
            kt = k[b, t].repeat_interleave(G, 0)
            S = S * g_raw[b, t].exp()[..., None]
            S = S + (beta[b, t][:, None] * kt)[..., None] * (v[b, t] - (kt[..., None] * S).sum(-2))[:, None, :]
            rows[b][t] = torch.einsum("hk,hkv->hv", qt, S)
    return torch.stack([torch.stack(r) for r in rows])


def stage_inputs(ch, io_dtype, cu):
    """The two stages' inputs in the dtypes fla gives them (io tensors in io_dtype; g, dA and
    the fp32 gradient buffers in fp32), and the wy reference run in fp64 on those inputs."""
    c = lambda x: x.to(io_dtype)  # noqa: E731
    f = lambda x: x.to(torch.float32)  # noqa: E731
    wy_in = dict(q=c(ch["q"]), k=c(ch["k"]), v=c(ch["v"]), v_new=c(ch["v_new"]), g=f(ch["g"]),
                 beta=c(ch["beta"]), A=c(ch["Akk"]), h=c(ch["h"]), do=c(ch["do"]), dh=c(ch["dh"]),
                 dv=c(ch["dv"]), scale=ch["scale"], cu_seqlens=cu, chunk_size=BT)
    dq, dk, _, db, dg, dAkk = refs.wy_dqkg_bwd_reference(**wy_in)
    intra_in = dict(q=wy_in["q"], k=wy_in["k"], g=wy_in["g"], beta=wy_in["beta"], dAqk=f(ch["dAqk"]),
                    dAkk=f(dAkk), dq=f(dq), dk=f(dk), db=f(db), dg=f(dg), cu_seqlens=cu, chunk_size=BT)
    return wy_in, intra_in


# --------------------------------------------------------------------------------------------
# the references are right: chained, they reproduce autograd through the naive recurrence
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cu", [None, [0, 7, 70, 90]])
def test_stage_references_chain(cu):
    B, T = (2, 70) if cu is None else (1, 90)
    H, HV, K, V = 1, 2, 8, 4
    cu_t = torch.tensor(cu) if cu is not None else None
    ch = build_chain(B, T, H, HV, K, V, cu=cu_t, seed=3, beta_max=1.5, h0=True)
    leaves = {n: ch[n].clone().requires_grad_() for n in ("q", "k", "v", "g_raw", "beta")}
    o = naive_kda(leaves["q"], leaves["k"], leaves["v"], leaves["g_raw"], leaves["beta"], ch["scale"], cu_t,
                  ch["state0"])
    assert rel_err(ch["o"], o.detach()) < 1e-10  # the torch chunked forward is the recurrence
    o.backward(ch["do"])

    f64 = torch.float64
    wy_in = dict(q=ch["q"], k=ch["k"], v=ch["v"], v_new=ch["v_new"], g=ch["g"], beta=ch["beta"], A=ch["Akk"],
                 h=ch["h"], do=ch["do"], dh=ch["dh"], dv=ch["dv"], scale=ch["scale"], cu_seqlens=cu_t, chunk_size=BT)
    dq, dk, dv, db, dg, dAkk = refs.wy_dqkg_bwd_reference(**wy_in, dtype=f64)
    dq, dk, db, dg = refs.intra_bwd_reference(ch["q"], ch["k"], ch["g"], ch["beta"], ch["dAqk"], dAkk, dq, dk, db,
                                              dg, cu_seqlens=cu_t, chunk_size=BT, dtype=f64)
    G = HV // H
    dq = dq.view(B, T, H, G, K).sum(3)
    dk = dk.view(B, T, H, G, K).sum(3)
    dg = chunk_cumsum(dg, cu_t, reverse=True)
    for name, ours, auto in [("dq", dq, leaves["q"].grad), ("dk", dk, leaves["k"].grad), ("dv", dv, leaves["v"].grad),
                             ("db", db, leaves["beta"].grad), ("dg", dg, leaves["g_raw"].grad)]:
        assert rel_err(ours, auto) < 1e-9, name


# --------------------------------------------------------------------------------------------
# intra_bwd kernel vs its reference
# --------------------------------------------------------------------------------------------

CASES = [
    # (B, T, H, HV, K, V, cu_seqlens, decay)
    (2, 130, 2, 2, 32, 16, None, "normal"),
    (1, 100, 1, 2, 64, 16, None, "strong"),  # grouped values, T not a multiple of 64
    # varlen, grouped: a 1-token document, one across a chunk boundary, a short one (8 programs:
    # interpreted op by op)
    (1, 100, 1, 2, 32, 16, [0, 1, 80, 100], "strong"),
]


@pytest.mark.parametrize("case", CASES, ids=["fixed", "grouped-strong", "varlen-strong"])
@pytest.mark.parametrize("io_dtype", [torch.float32, torch.float16])
def test_intra_bwd_matches_reference(case, io_dtype):
    from kernel_fun.kda._kernels.intra_bwd import intra_bwd

    B, T, H, HV, K, V, cu, decay = case
    cu_t = torch.tensor(cu) if cu is not None else None
    ch = build_chain(B, T, H, HV, K, V, cu=cu_t, decay=decay, seed=1, beta_max=1.5)
    _, inp = stage_inputs(ch, io_dtype, cu_t)
    before = launch_counts("kda.")
    out = intra_bwd(**inp)
    after = launch_counts("kda.")
    assert after.get("kda.intra_bwd", 0) == before.get("kda.intra_bwd", 0) + 1
    assert sum(after.values()) == sum(before.values()) + 1
    ref = refs.intra_bwd_reference(**inp)
    for name, o, r, x in zip(("dq", "dk", "db", "dg"), out, ref, (inp["dq"], inp["dk"], inp["db"], inp["dg"])):
        assert o.shape == x.shape, name
        assert o.dtype == (x.dtype if name in ("dq", "dk") else torch.float32), name
        assert torch.isfinite(o).all(), f"{name}: unwritten (NaN-poisoned) or non-finite"
        err = rel_err(o, r)
        # the intra part alone (out - input) must match too, not only the sum
        err_part = rel_err(o.double() - x.double(), r - x.double())
        assert err < 1e-5 and err_part < 1e-4, f"{name}: rel err {err:.2e}, intra part {err_part:.2e}"
    # inputs untouched
    assert torch.equal(inp["dq"], stage_inputs(ch, io_dtype, cu_t)[1]["dq"])


@pytest.mark.parametrize("case", CASES, ids=["fixed", "grouped-strong", "varlen-strong"])
def test_intra_bwd_one_anchor_and_bit_levels_agree(case):
    """The diagonal blocks by one anchor (fast_range=FAST_RANGE: where the gate's spread over
    a 16-row block allows) and by the bit levels for every block (the default): both match
    the fp64 reference; with normal decay the anchor is taken (other arithmetic: not
    bit-equal), with strong decay (-20 per token at most) the levels are taken almost
    everywhere."""
    from kernel_fun.kda._kernels.intra_bwd import FAST_RANGE, intra_bwd

    B, T, H, HV, K, V, cu, decay = case
    cu_t = torch.tensor(cu) if cu is not None else None
    ch = build_chain(B, T, H, HV, K, V, cu=cu_t, decay=decay, seed=3, beta_max=1.5)
    _, inp = stage_inputs(ch, torch.float32, cu_t)
    ref = refs.intra_bwd_reference(**inp)
    auto = intra_bwd(**inp, fast_range=FAST_RANGE)
    levels = intra_bwd(**inp)
    for out in (auto, levels):
        for name, o, r in zip(("dq", "dk", "db", "dg"), out, ref):
            assert torch.isfinite(o).all() and rel_err(o, r) < 1e-5, (name, rel_err(o, r))
    if decay == "normal":
        assert not all(torch.equal(a, b) for a, b in zip(auto, levels))
    # the gate here is a cumsum of log decays <= 0: its block ranges read from the blocks' ends
    # (gate_monotone) are the reduced ones, so the same anchors and the same bits
    mono = intra_bwd(**inp, fast_range=FAST_RANGE, gate_monotone=True)
    assert all(torch.equal(a, b) for a, b in zip(auto, mono))


def test_intra_bwd_one_anchor_stays_in_range_at_the_edge_of_its_spread():
    """Every 16-row block's gate range just under FAST_RANGE (a constant step per token, 15
    steps within FAST_RANGE - 6) and score gradients scaled by 2^24: the one-anchor blocks are
    taken, and their exp2 factors (the middle of the block's range as anchor, within
    2^+-FAST_RANGE/2) keep every product finite. A first-row anchor (factors out to
    2^+-FAST_RANGE) overflows to inf here."""
    from kernel_fun.kda._kernels.intra_bwd import FAST_RANGE, intra_bwd

    B, T, H, HV, K, V = 1, 128, 1, 1, 32, 16
    ch = build_chain(B, T, H, HV, K, V, decay="normal", seed=4, beta_max=1.5)
    _, inp = stage_inputs(ch, torch.float32, None)
    gen = torch.Generator().manual_seed(5)
    per_token = (FAST_RANGE - 6.0) / 15
    step = -per_token + 0.01 * torch.rand(B, T, HV, K, generator=gen)
    inp["g"] = torch.cat([c.cumsum(1) for c in step.split(64, dim=1)], dim=1).float()
    ranges = [float((b.max(1).values - b.min(1).values).max()) for b in inp["g"].split(16, dim=1)]
    assert FAST_RANGE - 8 < max(ranges) <= FAST_RANGE, ranges
    for name in ("dAqk", "dAkk"):
        inp[name] = inp[name] * 2.0 ** 24
    ref = refs.intra_bwd_reference(**inp)
    auto = intra_bwd(**inp, fast_range=FAST_RANGE)
    levels = intra_bwd(**inp)
    for name, a, lv, r in zip(("dq", "dk", "db", "dg"), auto, levels, ref):
        assert torch.isfinite(a).all(), name
        # dg (differences of large products at this scale) is 2.6e-4 off by either path
        e_a, e_l = rel_err(a, r), rel_err(lv, r)
        assert e_a < 1e-3 and e_a <= 1.5 * e_l + 3e-5, (name, e_a, e_l)
    assert not all(torch.equal(a, b) for a, b in zip(auto, levels))  # the anchor was taken
    mono = intra_bwd(**inp, fast_range=FAST_RANGE, gate_monotone=True)  # the step is < 0: monotone
    assert all(torch.equal(a, b) for a, b in zip(auto, mono))


def _l2norm(x):
    """fla's l2norm_fwd in fp64: (y, rstd) with rstd = 1 / sqrt(sum x^2 + 1e-6)."""
    rstd = 1.0 / torch.sqrt((x * x).sum(-1) + 1e-6)
    return x * rstd[..., None], rstd


@pytest.mark.parametrize("case", [(2, 130, 2, 2, 32, 16, None), (1, 150, 2, 2, 64, 16, [0, 40, 41, 150])],
                         ids=["fixed-k32", "varlen-k64"])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16])
def test_intra_bwd_fused_l2norm_backward(case, out_dtype):
    """l2norm_rstd: dq, dk come out as the gradients of the raw q, k (autograd through the
    l2norm, fp64), db and dg as without it."""
    from kernel_fun.kda._kernels.intra_bwd import can_fuse_l2norm, intra_bwd

    B, T, H, HV, K, V, cu = case
    cu_t = torch.tensor(cu) if cu is not None else None
    ch = build_chain(B, T, H, HV, K, V, cu=cu_t, decay="strong", seed=9, beta_max=1.5)
    _, inp = stage_inputs(ch, torch.float32, cu_t)
    gen = torch.Generator().manual_seed(2)
    xq = torch.randn(B, T, H, K, generator=gen, dtype=torch.float64) * 3
    xk = torch.randn(B, T, H, K, generator=gen, dtype=torch.float64) * 3
    (yq, rq), (yk, rk) = _l2norm(xq), _l2norm(xk)
    inp["q"], inp["k"] = yq.float(), yk.float()
    assert can_fuse_l2norm(H, HV, K)
    out = intra_bwd(**inp, l2norm_rstd=(rq.float(), rk.float()), out_dtype=out_dtype)
    plain = intra_bwd(**inp)
    ref = refs.intra_bwd_reference(**inp)
    xq_, xk_ = xq.clone().requires_grad_(), xk.clone().requires_grad_()
    want_q, want_k = torch.autograd.grad((_l2norm(xq_)[0], _l2norm(xk_)[0]), (xq_, xk_), (ref[0], ref[1]))
    tol = 1e-5 if out_dtype == torch.float32 else 2e-3
    for name, o, w in (("dq", out[0], want_q), ("dk", out[1], want_k)):
        assert o.dtype == out_dtype and o.shape == (B, T, HV, K), name
        assert torch.isfinite(o).all(), name
        assert rel_err(o, w) < tol, (name, rel_err(o, w))
    assert torch.equal(out[2], plain[2]) and torch.equal(out[3], plain[3])  # db, dg untouched


def test_intra_bwd_fused_l2norm_needs_one_head_per_value_head_and_whole_k_blocks():
    from kernel_fun.kda._kernels.intra_bwd import CONFIGS, can_fuse_l2norm, intra_bwd

    assert not can_fuse_l2norm(1, 2, 32)  # grouped: dq, dk are summed over value heads first
    small = next(c for c in CONFIGS if c.kwargs["BK"] == 32)
    assert not can_fuse_l2norm(2, 2, 64, small)
    ch = build_chain(1, 70, 2, 2, 64, 16, seed=3)
    _, inp = stage_inputs(ch, torch.float32, None)
    rstd = torch.ones(1, 70, 2)
    with pytest.raises(ValueError, match="K block covering K"):
        intra_bwd(**inp, config=small, l2norm_rstd=(rstd, rstd))


def test_intra_bwd_extreme_decay_is_finite():
    """Per-token log decay down to -60 (whole chunks underflow): no inf/NaN anywhere."""
    from kernel_fun.kda._kernels.intra_bwd import intra_bwd

    ch = build_chain(1, 80, 1, 1, 32, 16, decay="normal", seed=2)
    _, inp = stage_inputs(ch, torch.float32, None)
    gen = torch.Generator().manual_seed(5)
    g_raw = -60.0 * torch.rand(1, 80, 1, 32, generator=gen, dtype=torch.float64)
    inp["g"] = (chunk_cumsum(g_raw, None) * RCP_LN2).float()
    out = intra_bwd(**inp)
    ref = refs.intra_bwd_reference(**inp)
    for name, o, r in zip(("dq", "dk", "db", "dg"), out, ref):
        assert torch.isfinite(o).all(), name
        assert rel_err(o, r) < 1e-5, name


def test_intra_bwd_chunk32():
    from kernel_fun.kda._kernels.intra_bwd import intra_bwd

    ch = build_chain(1, 90, 1, 1, 32, 16, decay="strong", seed=4)
    _, inp = stage_inputs(ch, torch.float32, None)
    # the stage math is per chunk: re-chunking only changes which pairs are intra-chunk;
    # feed the same tensors with chunk_size=32 and compare with the reference at 32
    inp["chunk_size"] = 32
    inp["dAqk"] = inp["dAqk"][..., :32].contiguous()
    inp["dAkk"] = inp["dAkk"][..., :32].contiguous()
    g32 = (chunk_cumsum_sized(ch["g_raw"], 32) * RCP_LN2).float()
    inp["g"] = g32
    out = intra_bwd(**inp)
    ref = refs.intra_bwd_reference(**inp)
    for name, o, r in zip(("dq", "dk", "db", "dg"), out, ref):
        assert rel_err(o, r) < 1e-5, name


def chunk_cumsum_sized(g_raw, size):
    out = torch.zeros_like(g_raw)
    T = g_raw.shape[1]
    for s in range(0, T, size):
        out[:, s:s + size] = g_raw[:, s:s + size].cumsum(1)
    return out


# --------------------------------------------------------------------------------------------
# wy_dqkg_bwd kernel vs its reference
# --------------------------------------------------------------------------------------------

def _small_wy_config():
    """Blocks smaller than K and V: the separate V-only pass and several K / V blocks."""
    import triton

    return triton.Config({"BK": 16, "BV": 16}, num_warps=4, num_stages=1)


@pytest.mark.parametrize("case", CASES, ids=["fixed", "grouped-strong", "varlen-strong"])
@pytest.mark.parametrize("io_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("blocks", ["default", "small"])
def test_wy_bwd_matches_reference(case, io_dtype, blocks):
    from kernel_fun.kda._kernels.wy_bwd import wy_dqkg_bwd

    B, T, H, HV, K, V, cu, decay = case
    cu_t = torch.tensor(cu) if cu is not None else None
    ch = build_chain(B, T, H, HV, K, V, cu=cu_t, decay=decay, seed=1, beta_max=1.5, h0=True)
    inp, _ = stage_inputs(ch, io_dtype, cu_t)
    before = launch_counts("kda.")
    out = wy_dqkg_bwd(**inp, config=_small_wy_config() if blocks == "small" else None)
    after = launch_counts("kda.")
    assert after.get("kda.wy_bwd", 0) == before.get("kda.wy_bwd", 0) + 1
    assert sum(after.values()) == sum(before.values()) + 1
    ref = refs.wy_dqkg_bwd_reference(**inp)
    shapes = [(B, T, HV, K), (B, T, HV, K), (B, T, HV, V), (B, T, HV), (B, T, HV, K), (B, T, HV, BT)]
    dtypes = [torch.float32, torch.float32, io_dtype, torch.float32, torch.float32, torch.float32]
    for name, o, r, shp, dt in zip(("dq", "dk", "dv", "db", "dg", "dA"), out, ref, shapes, dtypes):
        assert tuple(o.shape) == shp and o.dtype == dt, name
        assert torch.isfinite(o).all(), f"{name}: unwritten (NaN-poisoned) or non-finite"
        err = rel_err(o, r)
        tol = 1e-5 if dt == torch.float32 else 1e-3  # dv comes out in the io dtype (fp16 rounding)
        assert err < tol, f"{name}: rel err {err:.2e}"


def test_stage_kernels_chained_match_chain_references():
    """wy kernel -> intra kernel, as the lead's chain calls them (keyword arguments)."""
    from kernel_fun.kda._kernels.intra_bwd import intra_bwd
    from kernel_fun.kda._kernels.wy_bwd import wy_dqkg_bwd

    cu_t = torch.tensor([0, 50, 177])
    ch = build_chain(1, 177, 2, 4, 32, 16, cu=cu_t, decay="strong", seed=7, h0=True)
    wy_in, _ = stage_inputs(ch, torch.float32, cu_t)
    dq, dk, dv, db, dg, dAkk = wy_dqkg_bwd(**wy_in)
    dq, dk, db, dg = intra_bwd(q=wy_in["q"], k=wy_in["k"], g=wy_in["g"], beta=wy_in["beta"],
                               dAqk=ch["dAqk"].float(), dAkk=dAkk, dq=dq, dk=dk, db=db, dg=dg,
                               cu_seqlens=cu_t, chunk_size=BT)
    r = refs.wy_dqkg_bwd_reference(**wy_in)
    rq, rk, rb, rg = refs.intra_bwd_reference(wy_in["q"], wy_in["k"], wy_in["g"], wy_in["beta"], ch["dAqk"].float(),
                                              r[5], r[0], r[1], r[3], r[4], cu_seqlens=cu_t, chunk_size=BT)
    for name, o, ref in [("dq", dq, rq), ("dk", dk, rk), ("db", db, rb), ("dg", dg, rg), ("dv", dv, r[2])]:
        assert rel_err(o, ref) < 1e-5, name


# --------------------------------------------------------------------------------------------
# every configuration the autotuner may pick (block sizes and switches; warps do not interpret)
# --------------------------------------------------------------------------------------------

def _config_ids(cfgs):
    return [f"{i}:" + ",".join(f"{k}={v}" for k, v in c.kwargs.items()) for i, c in enumerate(cfgs)]


def _intra_configs():
    from kernel_fun.kda._kernels.intra_bwd import CANDIDATES, CONFIGS

    return CONFIGS + CANDIDATES


def _wy_configs():
    from kernel_fun.kda._kernels.wy_bwd import CANDIDATES, CONFIGS

    return CONFIGS + CANDIDATES


@pytest.mark.parametrize("config", _intra_configs(), ids=_config_ids(_intra_configs()))
def test_intra_bwd_every_config(config):
    from kernel_fun.kda._kernels.intra_bwd import intra_bwd

    cu_t = torch.tensor([0, 30, 150])
    ch = build_chain(1, 150, 1, 2, 64, 16, cu=cu_t, decay="strong", seed=11)
    _, inp = stage_inputs(ch, torch.float32, cu_t)
    out = intra_bwd(**inp, config=config)
    ref = refs.intra_bwd_reference(**inp)
    tol, tol_part = 1e-5, 1e-4
    for name, o, r, x in zip(("dq", "dk", "db", "dg"), out, ref, (inp["dq"], inp["dk"], inp["db"], inp["dg"])):
        assert torch.isfinite(o).all(), name
        assert rel_err(o, r) < tol, name
        assert rel_err(o.double() - x.double(), r - x.double()) < tol_part, name


@pytest.mark.parametrize("config", _wy_configs(), ids=_config_ids(_wy_configs()))
def test_wy_bwd_every_config(config):
    from kernel_fun.kda._kernels.wy_bwd import wy_dqkg_bwd

    cu_t = torch.tensor([0, 30, 150])
    ch = build_chain(1, 150, 1, 2, 64, 32, cu=cu_t, decay="strong", seed=12, h0=True)
    inp, _ = stage_inputs(ch, torch.float32, cu_t)
    out = wy_dqkg_bwd(**inp, config=config)
    ref = refs.wy_dqkg_bwd_reference(**inp)
    for name, o, r in zip(("dq", "dk", "dv", "db", "dg", "dA"), out, ref):
        assert rel_err(o, r) < 1e-5, name


# --------------------------------------------------------------------------------------------
# the reference of fla's recompute_w_u_fwd (the CPU chain's stand-in for it) is right
# --------------------------------------------------------------------------------------------

def _recompute_inputs(ch, io_dtype, cu):
    c = lambda x: x.to(io_dtype)  # noqa: E731
    gk = ch["g"] if io_dtype == torch.float64 else ch["g"].float()  # fla's gate is fp32
    return dict(k=c(ch["k"]), v=c(ch["v"]), beta=c(ch["beta"]), A=c(ch["Akk"]), gk=gk,
                q=c(ch["q"]), cu_seqlens=cu)


@pytest.mark.parametrize("case", CASES, ids=["fixed", "grouped-strong", "varlen-strong"])
def test_recompute_w_u_reference_reproduces_the_chain(case):
    """The reference's w, u, qg, kg rebuild the fp64 chain's v_new = u - w h, its next state
    exp2(g_last) h + kg^T v_new and its output scale qg h + Aqk v_new, chunk by chunk."""
    B, T, H, HV, K, V, cu, decay = case
    cu_t = torch.tensor(cu) if cu is not None else None
    ch = build_chain(B, T, H, HV, K, V, cu=cu_t, decay=decay, seed=5, beta_max=1.5, h0=True)
    w, u, qg, kg = refs.recompute_w_u_reference(**_recompute_inputs(ch, torch.float64, cu_t))
    ci = 0
    for n, (b, bos, eos) in enumerate(_segments(B, T, cu_t)):
        hb, base = (0, ci) if cu_t is not None else (b, 0)
        starts = list(range(bos, eos, BT))
        for c, s in enumerate(starts):
            e = min(s + BT, eos)
            S = ch["h"][hb, base + c]  # [HV, K, V]
            tr = lambda x: x[b, s:e].transpose(0, 1)  # noqa: E731  [HV, n, D]
            vn = tr(u) - tr(w) @ S
            torch.testing.assert_close(vn, tr(ch["v_new"]), rtol=1e-9, atol=1e-9)
            o = ch["scale"] * tr(qg) @ S + ch["Aqk"][b, s:e, :, :e - s].transpose(0, 1) @ vn
            torch.testing.assert_close(o, tr(ch["o"]), rtol=1e-9, atol=1e-9)
            if c + 1 < len(starts):
                gl = ch["g"][b, e - 1]  # [HV, K]
                S_next = torch.exp2(gl)[..., None] * S + tr(kg).transpose(-1, -2) @ vn
                torch.testing.assert_close(S_next, ch["h"][hb, base + c + 1], rtol=1e-9, atol=1e-9)
        ci += len(starts)
