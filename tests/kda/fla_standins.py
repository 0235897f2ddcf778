"""Plain-torch stand-ins for the fla stage functions the KDA chain calls (fla's kernels do not
run under Triton's interpreter), so the CPU tier can run the whole chain: fla's stages in
torch, ours through the interpreter, end to end against the fp64 recurrence.

Each stand-in has the signature and return convention of fla 0.6.0's function (shapes,
dtypes, which entries are written), computed chunk by chunk in fp64. Entries fla leaves
unwritten (the upper triangles of Aqk and dAqk) are NaN here, so a consumer that reads them
fails. ``install(monkeypatch)`` routes ``kda.chain``'s fla calls to these.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kernel_fun.kda.reference_stages import recompute_w_u_reference

BT = 64
F64 = torch.float64


def _chunks(B, T, cu_seqlens):
    """(b, bos, eos, chunk_index) for every chunk, chunk_index counting as fla's h does."""
    out, ci = [], 0
    if cu_seqlens is None:
        for b in range(B):
            for c, s in enumerate(range(0, T, BT)):
                out.append((b, s, min(s + BT, T), c))
        return out
    cu = [int(x) for x in cu_seqlens.tolist()]
    for bos, eos in zip(cu[:-1], cu[1:]):
        for s in range(bos, eos, BT):
            out.append((0, s, min(s + BT, eos), ci))
            ci += 1
    return out


def _segments(B, T, cu_seqlens):
    """(n, b, [chunks of the sequence]) per sequence."""
    chunks = _chunks(B, T, cu_seqlens)
    if cu_seqlens is None:
        return [(b, b, [c for c in chunks if c[0] == b]) for b in range(B)]
    cu = [int(x) for x in cu_seqlens.tolist()]
    return [(n, 0, [c for c in chunks if bos <= c[1] < eos]) for n, (bos, eos) in enumerate(zip(cu[:-1], cu[1:]))]


def _per_sequence(B, T, cu_seqlens):
    """(NT, [(n, b, chunks)]): the chunk count of h's layout and each sequence's chunks."""
    return max(c[3] for c in _chunks(B, T, cu_seqlens)) + 1, _segments(B, T, cu_seqlens)


def _rep(x, G):  # q/k heads to value heads
    return x.repeat_interleave(G, dim=-2)


def _cumsum(x, cu_seqlens, reverse=False):
    out = torch.zeros_like(x, dtype=F64)
    for b, s, e, _ in _chunks(x.shape[0], x.shape[1], cu_seqlens):
        c = x[b, s:e].double()
        out[b, s:e] = c.flip(0).cumsum(0).flip(0) if reverse else c.cumsum(0)
    return out


def _gate(g, A_log, dt_bias):
    HV, K = g.shape[-2:]
    x = g.double() + (dt_bias.double().view(HV, K) if dt_bias is not None else 0)
    return -A_log.double().exp()[:, None] * F.softplus(x)


def kda_gate_chunk_cumsum(g, A_log, dt_bias=None, scale=None, chunk_size=BT, cu_seqlens=None,
                          chunk_indices=None, **_):
    assert chunk_size == BT
    return (_cumsum(_gate(g, A_log, dt_bias), cu_seqlens) * (scale or 1.0)).float()


def chunk_local_cumsum(g, chunk_size=BT, reverse=False, scale=None, cu_seqlens=None, chunk_indices=None, **_):
    assert chunk_size == BT
    return (_cumsum(g, cu_seqlens, reverse) * (scale or 1.0)).float()


def kda_gate_bwd(g, A_log, dt_bias=None, dyg=None, **_):
    with torch.enable_grad():  # called from inside a backward
        gl, dyg = g.double().requires_grad_(), dyg.double()
        al = A_log.double().requires_grad_()
        db = dt_bias.double().requires_grad_() if dt_bias is not None else None
        y = -al.exp()[:, None] * F.softplus(gl + (db.view(gl.shape[-2:]) if db is not None else 0))
        grads = torch.autograd.grad(y, [t for t in (gl, al, db) if t is not None], dyg)
    return (grads[0].to(g.dtype), grads[1].to(A_log.dtype),
            grads[2].to(dt_bias.dtype) if dt_bias is not None else None)


def _chunk_mats(q, k, gk, beta, scale, b, s, e, G):
    """Per chunk, value heads first: (qc, kc, gc, bc, Aq, Ak), Aq with the scale, Ak the WY
    inverse (I + L)^-1, L strictly lower with beta on its rows."""
    n = e - s
    qc = _rep(q[b, s:e].double(), G).transpose(0, 1)
    kc = _rep(k[b, s:e].double(), G).transpose(0, 1)
    gc = gk[b, s:e].double().transpose(0, 1)
    bc = beta[b, s:e].double().transpose(0, 1)
    E = torch.exp2(gc[:, :, None, :] - gc[:, None, :, :])
    tri = torch.tril(torch.ones(n, n, dtype=torch.bool))
    Aq = torch.where(tri, scale * torch.einsum("hic,hjc,hijc->hij", qc, kc, E), 0)
    L = torch.where(torch.tril(tri, -1), bc[:, :, None] * torch.einsum("hic,hjc,hijc->hij", kc, kc, E), 0)
    Ak = torch.linalg.inv(torch.eye(n, dtype=F64) + L)
    return qc, kc, gc, bc, Aq, Ak


def _put(dst, b, s, e, x):  # x [HV, n, ...] -> dst[b, s:e] [n, HV, ...]
    dst[b, s:e, :, : x.shape[-1]] = x.transpose(0, 1).to(dst.dtype)


def recompute_w_u_fwd(k, v, beta, A, gk, q=None, cu_seqlens=None, chunk_indices=None, **_):
    w, u, qg, kg = recompute_w_u_reference(k, v, beta, A, gk, q=q, cu_seqlens=cu_seqlens)
    return w.to(k.dtype), u.to(v.dtype), None if qg is None else qg.to(k.dtype), kg.to(k.dtype)


def chunk_kda_fwd_intra(q, k, v, gk, beta, scale, cu_seqlens=None, chunk_size=BT, chunk_indices=None,
                        disable_recompute=False, **_):
    assert chunk_size == BT
    B, T, H, K = k.shape
    HV = v.shape[2]
    G = HV // H
    Aqk = torch.full((B, T, HV, BT), float("nan"), dtype=k.dtype)  # fla: torch.empty
    Akk = torch.zeros(B, T, HV, BT, dtype=k.dtype)
    for b, s, e, _ in _chunks(B, T, cu_seqlens):
        n = e - s
        _, _, _, _, Aq, Ak = _chunk_mats(q, k, gk, beta, scale, b, s, e, G)
        tri = torch.tril(torch.ones(n, n, dtype=torch.bool))
        _put(Aqk, b, s, e, torch.where(tri, Aq, float("nan")))
        _put(Akk, b, s, e, Ak)
    w, u, qg, kg = recompute_w_u_fwd(k=k, v=v, beta=beta, A=Akk, gk=gk, q=q if disable_recompute else None,
                                     cu_seqlens=cu_seqlens)
    return w, u, qg, kg, Aqk, Akk


def _score_blocks(q, k, gk, beta, scale, cu_seqlens, write):
    """Per chunk: ``write(b, s, e, Aq, Ak, diag)`` with ``diag`` [n, n] True on the 16x16
    diagonal sub-blocks (where fla's token-parallel stage writes)."""
    B, T, H, K = k.shape
    HV = gk.shape[2]
    for b, s, e, _ in _chunks(B, T, cu_seqlens):
        n = e - s
        _, _, _, _, Aq, Ak = _chunk_mats(q, k, gk, beta, scale, b, s, e, HV // H)
        i = torch.arange(n)
        write(b, s, e, Aq, Ak, (i[:, None] // 16) == (i[None, :] // 16))


def chunk_kda_fwd_intra_token_parallel(q, k, gk, beta, Aqk, Akk, scale, cu_seqlens=None, chunk_size=BT,
                                       sub_chunk_size=16, **_):
    """Aqk's diagonal 16x16 blocks (lower triangle); everything else of Aqk NaN (unwritten),
    and Akk (fla's fp32 diagonal blocks, an intermediate only the next stage reads) NaN too:
    the stand-in of the next stage recomputes what it needs."""
    assert chunk_size == BT and sub_chunk_size == 16
    Aqk.fill_(float("nan"))
    Akk.fill_(float("nan"))

    def write(b, s, e, Aq, Ak, diag):
        tri = torch.tril(torch.ones(e - s, e - s, dtype=torch.bool))
        cur = Aqk[b, s:e, :, : e - s].transpose(0, 1).double()
        _put(Aqk, b, s, e, torch.where(diag & tri, Aq, cur))

    _score_blocks(q, k, gk, beta, scale, cu_seqlens, write)
    return Aqk, Akk


class _InterSolve:
    """fla's ``chunk_kda_fwd_kernel_inter_solve_fused``, launched as ``kernel[grid](**kw)``:
    Aqk's blocks below the diagonal blocks, and Akk = (I + L)^-1."""

    def __getitem__(self, grid):
        def launch(q, k, g, beta, Aqk, Akkd, Akk, scale, cu_seqlens=None, chunk_indices=None, BT=BT, BC=16,
                   USE_SAFE_GATE=False, USE_GRAPH=False, **_):
            assert BT == 64 and BC == 16 and not USE_SAFE_GATE and not USE_GRAPH
            assert torch.isnan(Akkd).all()  # what the token-parallel stand-in left there

            def write(b, s, e, Aq, Ak, diag):
                below = torch.tril(torch.ones(e - s, e - s, dtype=torch.bool)) & ~diag
                cur = Aqk[b, s:e, :, : e - s].transpose(0, 1).double()
                _put(Aqk, b, s, e, torch.where(below, Aq, cur))
                _put(Akk, b, s, e, Ak)

            _score_blocks(q, k, g, beta, scale, cu_seqlens, write)
        return launch


chunk_kda_fwd_kernel_inter_solve_fused = _InterSolve()


def chunk_gated_delta_rule_fwd_h(k, w, u, gk, initial_state=None, output_final_state=False, cu_seqlens=None,
                                 chunk_size=BT, **_):
    B, T, HV, K = k.shape
    V = u.shape[-1]
    NT, segs = _per_sequence(B, T, cu_seqlens)
    h = torch.empty(B, NT, HV, K, V, dtype=k.dtype)
    v_new = torch.empty_like(u)
    final = torch.zeros(len(segs), HV, K, V) if output_final_state else None
    for n, b, cs in segs:
        S = initial_state[n].double() if initial_state is not None else torch.zeros(HV, K, V, dtype=F64)
        for _, s, e, ci in cs:
            h[b, ci] = S.to(h.dtype)
            wc, uc = w[b, s:e].double().transpose(0, 1), u[b, s:e].double().transpose(0, 1)
            kc, gc = k[b, s:e].double().transpose(0, 1), gk[b, s:e].double().transpose(0, 1)
            vn = uc - wc @ S.to(k.dtype).double()  # fla multiplies by the state in h's dtype
            v_new[b, s:e] = vn.transpose(0, 1).to(v_new.dtype)
            S = torch.exp2(gc[:, -1])[..., None] * S + kc.transpose(-1, -2) @ vn.to(k.dtype).double()
        if final is not None:
            final[n] = S.float()
    return h, v_new, final


def chunk_kda_bwd_dAv(q, k, v, do, A, scale, cu_seqlens=None, chunk_size=BT, chunk_indices=None, **_):
    B, T, HV, V = v.shape
    dA = torch.full((B, T, HV, BT), float("nan"), dtype=torch.float32)  # upper triangle unwritten
    dv = torch.empty_like(do)
    for b, s, e, _ in _chunks(B, T, cu_seqlens):
        n = e - s
        tri = torch.tril(torch.ones(n, n, dtype=torch.bool))
        doc, vc = do[b, s:e].double().transpose(0, 1), v[b, s:e].double().transpose(0, 1)
        Aq = torch.where(tri, A[b, s:e, :, :n].double().transpose(0, 1), 0)
        _put(dA, b, s, e, torch.where(tri, scale * doc @ vc.transpose(-1, -2), float("nan")))
        dv[b, s:e] = (Aq.transpose(-1, -2) @ doc).transpose(0, 1).to(dv.dtype)
    return dA, dv


def chunk_gated_delta_rule_bwd_dhu(q, k, w, gk, h0, dht, do, dv, scale, cu_seqlens=None, chunk_size=BT, **_):
    B, T, HV, K = q.shape
    V = do.shape[-1]
    NT, segs = _per_sequence(B, T, cu_seqlens)
    dh = torch.empty(B, NT, HV, K, V, dtype=q.dtype)
    dv2 = torch.empty_like(dv)
    dh0 = torch.empty(len(segs), HV, K, V) if h0 is not None else None
    for n, b, cs in segs:
        dS = dht[n].double() if dht is not None else torch.zeros(HV, K, V, dtype=F64)
        for _, s, e, ci in reversed(cs):
            dh[b, ci] = dS.to(dh.dtype)
            qc, kc, wc = (x[b, s:e].double().transpose(0, 1) for x in (q, k, w))
            gc = gk[b, s:e].double().transpose(0, 1)
            doc = do[b, s:e].double().transpose(0, 1)
            dvc = dv[b, s:e].double().transpose(0, 1) + kc @ dS
            dv2[b, s:e] = dvc.transpose(0, 1).to(dv2.dtype)
            dS = torch.exp2(gc[:, -1])[..., None] * dS + scale * qc.transpose(-1, -2) @ doc \
                - wc.transpose(-1, -2) @ dvc
        if dh0 is not None:
            dh0[n] = dS.float()
    return dh, dh0, dv2


def l2norm_fwd(x, eps=1e-6, output_dtype=None):
    xd = x.double()
    rstd = 1.0 / torch.sqrt((xd * xd).sum(-1) + eps)
    return (xd * rstd[..., None]).to(output_dtype or x.dtype), rstd.reshape(-1).float()


def l2norm_bwd(y, rstd, dy, eps=1e-6):
    yd, dyd = y.double(), dy.double()
    r = rstd.double().view(*y.shape[:-1], 1)
    return (dyd * r - (dyd * yd).sum(-1, keepdim=True) * yd * r).to(y.dtype)


def fused_beta_sigmoid_fwd(x, scale=1.0):
    return (scale * torch.sigmoid(x.double())).float()


def fused_beta_sigmoid_bwd(x, dy, scale=1.0):
    s = torch.sigmoid(x.double())
    return (dy.double() * scale * s * (1 - s)).to(x.dtype)


STANDINS = {
    ("fla.ops.kda.gate", "kda_gate_chunk_cumsum"): kda_gate_chunk_cumsum,
    ("fla.ops.kda.gate", "kda_gate_bwd"): kda_gate_bwd,
    ("fla.ops.utils.cumsum", "chunk_local_cumsum"): chunk_local_cumsum,
    ("fla.ops.kda.chunk_intra", "chunk_kda_fwd_intra"): chunk_kda_fwd_intra,
    ("fla.ops.kda.chunk_intra_token_parallel", "chunk_kda_fwd_intra_token_parallel"):
        chunk_kda_fwd_intra_token_parallel,
    ("fla.ops.kda.chunk_intra", "chunk_kda_fwd_kernel_inter_solve_fused"): chunk_kda_fwd_kernel_inter_solve_fused,
    ("fla.ops.kda.wy_fast", "recompute_w_u_fwd"): recompute_w_u_fwd,
    ("fla.ops.common.chunk_delta_h", "chunk_gated_delta_rule_fwd_h"): chunk_gated_delta_rule_fwd_h,
    ("fla.ops.kda.chunk_bwd", "chunk_kda_bwd_dAv"): chunk_kda_bwd_dAv,
    ("fla.ops.common.chunk_delta_h", "chunk_gated_delta_rule_bwd_dhu"): chunk_gated_delta_rule_bwd_dhu,
    ("fla.modules.norm.l2norm", "l2norm_fwd"): l2norm_fwd,
    ("fla.modules.norm.l2norm", "l2norm_bwd"): l2norm_bwd,
    ("fla.ops.common.gate", "fused_beta_sigmoid_fwd"): fused_beta_sigmoid_fwd,
    ("fla.ops.common.gate", "fused_beta_sigmoid_bwd"): fused_beta_sigmoid_bwd,
}


def install(monkeypatch):
    """Route kda.chain's fla stage calls to the stand-ins (fla's index helpers stay fla's: they
    are torch code). Returns the list of (module, symbol) called, in order."""
    from kernel_fun._common.compat import fla_symbol
    from kernel_fun.kda import chain

    called = []

    def fake(module, symbol):
        called.append((module, symbol))
        return STANDINS.get((module, symbol)) or fla_symbol(module, symbol)

    monkeypatch.setattr(chain, "_fla", fake)
    return called
