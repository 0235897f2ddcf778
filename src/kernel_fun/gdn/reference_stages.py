"""Plain-torch fp64 references of gdn's own stage kernels, chunk by chunk, for the interpreted
stage tests (``tests/gdn/test_kernels.py``).

The fused backward's reference is not a transcription of the kernel's algebra: it rebuilds one
chunk's forward (the gated WY inverse, w, u, v_new's dependence on them, the output and the
state update) in torch and lets autograd differentiate it, with v_new and the state before the
chunk held fixed (their gradients are the backward state scan's).
"""
from __future__ import annotations

import math

import torch

BT = 64
F64 = torch.float64
LN2 = math.log(2.0)


def chunks(B, T, cu_seqlens):
    """(b, bos, eos, c) for every chunk, ``h[b, c]`` its state (fla's chunk axis of h)."""
    out = []
    if cu_seqlens is None:
        for b in range(B):
            for c, s in enumerate(range(0, T, BT)):
                out.append((b, s, min(s + BT, T), c))
        return out
    cu = [int(x) for x in cu_seqlens.tolist()]
    ci = 0
    for bos, eos in zip(cu[:-1], cu[1:]):
        for s in range(bos, eos, BT):
            out.append((0, s, min(s + BT, eos), ci))
            ci += 1
    return out


def _gate_ref(g, A_log, dt_bias, gate_in_kernel):
    """The per-token natural-log gate: ``-exp(A_log) softplus(g + dt_bias)`` in the op, else g."""
    return -A_log.exp() * torch.nn.functional.softplus(g + dt_bias) if gate_in_kernel else g


def inputs_fwd_ref(q, k, g, beta, A_log, dt_bias, gate_in_kernel, beta_scale=2.0, cu_seqlens=None, eps=1e-6):
    """fp64 (q and k l2-normalized, beta_scale * sigmoid(beta), the gate's chunk-local cumsum in
    log2 units): what ``_kernels/inputs_fwd.py`` makes. Differentiable (``inputs_bwd_ref``)."""
    from .._delta.reference import chunk_local_cumsum_ref

    qn = q / torch.sqrt((q ** 2).sum(-1, keepdim=True) + eps)
    kn = k / torch.sqrt((k ** 2).sum(-1, keepdim=True) + eps)
    gc = chunk_local_cumsum_ref(_gate_ref(g, A_log, dt_bias, gate_in_kernel), BT, cu_seqlens=cu_seqlens)
    return qn, kn, beta_scale * torch.sigmoid(beta), gc


def inputs_bwd_ref(q, k, g, beta, A_log, dt_bias, gate_in_kernel, dq, dk, dbeta, dg, beta_scale=2.0,
                   cu_seqlens=None):
    """fp64 gradients ``(dq, dk, dbeta, dg, dA_log, ddt_bias)`` of the raw q, k, beta, gate input,
    A_log and dt_bias through ``inputs_fwd_ref``, from those of the normalized q, k, the activated
    beta and the per-token natural-log gate (dg); without the gate in the op dg is returned as
    given and dA_log, ddt_bias are None."""
    x = {n: t.detach().double().requires_grad_() for n, t in
         dict(q=q, k=k, g=g, beta=beta, A_log=A_log, dt_bias=dt_bias).items()}
    qn, kn, b, _ = inputs_fwd_ref(x["q"], x["k"], x["g"], x["beta"], x["A_log"], x["dt_bias"], gate_in_kernel,
                                  beta_scale, cu_seqlens)
    outs, gos, wrt = [qn, kn, b], [dq, dk, dbeta], ["q", "k", "beta"]
    if gate_in_kernel:
        outs, gos = outs + [_gate_ref(x["g"], x["A_log"], x["dt_bias"], True)], gos + [dg]
        wrt = wrt + ["g", "A_log", "dt_bias"]
    got = dict(zip(wrt, torch.autograd.grad(outs, [x[n] for n in wrt], [t.double() for t in gos])))
    if not gate_in_kernel:
        got.update(g=dg.double(), A_log=None, dt_bias=None)
    return tuple(got[n] for n in ("q", "k", "beta", "g", "A_log", "dt_bias"))


def gated_scores_ref(q, k, g, scale, cu_seqlens=None):
    """``[B, T, HV, BT]`` fp64: scale * q_t . k_j * exp2(G_t - G_j) for j <= t in the chunk, else 0."""
    B, T, H, K = q.shape
    HV = g.shape[2]
    G = HV // H
    A = torch.zeros(B, T, HV, BT, dtype=F64)
    for b, s, e, _ in chunks(B, T, cu_seqlens):
        n = e - s
        qc = q[b, s:e].double().repeat_interleave(G, 1).transpose(0, 1)  # [HV, n, K]
        kc = k[b, s:e].double().repeat_interleave(G, 1).transpose(0, 1)
        gc = g[b, s:e].double().transpose(0, 1)  # [HV, n]
        m = torch.tril(torch.ones(n, n, dtype=torch.bool))
        gam = torch.where(m, torch.exp2(torch.where(m, gc[:, :, None] - gc[:, None, :], 0.0)), 0.0)
        A[b, s:e, :, :n] = (scale * (qc @ kc.transpose(-1, -2)) * gam).transpose(0, 1)
    return A


def _inverse(kc, gc_nat, bc, kk=None):
    """(I + StrictLower(diag(beta) K K^T * Gamma))^-1 per head: kc [HV, n, K], gc_nat [HV, n];
    ``kk`` stands for K K^T where given (a leaf, to take its gradient)."""
    n = kc.shape[1]
    gam = torch.exp(gc_nat[:, :, None] - gc_nat[:, None, :])
    kk = kc @ kc.transpose(-1, -2) if kk is None else kk
    L = torch.tril(bc[:, :, None] * kk * torch.where(
        torch.tril(torch.ones(n, n, dtype=torch.bool), -1), gam, torch.zeros_like(gam)), -1)
    eye = torch.eye(n, dtype=kc.dtype)
    return torch.linalg.solve_triangular(eye + L, eye.expand_as(L), upper=False)


def lower_blocks(A, B, T, cu_seqlens=None):
    """A ``[B, T, HV, BT]`` with its 16-row blocks above the diagonal zeroed (as the WY inverse kernel
    writes them, and ``wy_inverse_ref`` has them). A row's block is its place in its chunk (chunks
    restart at each document)."""
    row = torch.zeros(B, T, dtype=torch.long)
    for b, s, e, _ in chunks(B, T, cu_seqlens):
        row[b, s:e] = torch.arange(e - s) // 16
    keep = (row[:, :, None, None] >= torch.arange(A.shape[-1]) // 16).to(A.device)
    return torch.where(keep, A, torch.zeros((), dtype=A.dtype, device=A.device))


def wy_inverse_ref(k, g, beta, cu_seqlens=None):
    """fla's forward intra stage's A ``[B, T, HV, BT]`` fp64 (zero outside the chunk's rows and
    above the diagonal) from k ``[B, T, H, K]``, g ``[B, T, HV]`` (chunk-local cumulative log2
    gate) and beta."""
    B, T, H, K = k.shape
    HV = g.shape[2]
    A = torch.zeros(B, T, HV, BT, dtype=F64)
    for b, s, e, _ in chunks(B, T, cu_seqlens):
        n = e - s
        kc = k[b, s:e].double().repeat_interleave(HV // H, 1).transpose(0, 1)
        A[b, s:e, :, :n] = _inverse(kc, g[b, s:e].double().T * LN2, beta[b, s:e].double().T).transpose(0, 1)
    return A


def _wy_bwd_chunks(q, k, v, v_new, g, beta, h, dh, do, dv2, scale, cu_seqlens):
    """Per chunk, (b, s, e, leaves' gradients): autograd of the chunk's forward in fp64 w.r.t.
    q, k [H, n, K], v [HV, n, V], beta, the per-token gate [HV, n], and the two gate-free score
    matrices Q K^T and K K^T [HV, n, n] (leaves of their own, so their gradients are the first
    backward half's dAqk and dAkk)."""
    B, T, H, K = q.shape
    G = v.shape[2] // H
    for b, s, e, ci in chunks(B, T, cu_seqlens):
        n = e - s
        qc = q[b, s:e].double().transpose(0, 1).clone().requires_grad_(True)  # [H, n, K]
        kc = k[b, s:e].double().transpose(0, 1).clone().requires_grad_(True)
        vc = v[b, s:e].double().transpose(0, 1).clone().requires_grad_(True)  # [HV, n, V]
        bc = beta[b, s:e].double().T.clone().requires_grad_(True)  # [HV, n]
        Gc = g[b, s:e].double().T * LN2
        gtok = torch.cat([Gc[:, :1], Gc[:, 1:] - Gc[:, :-1]], 1).clone().requires_grad_(True)
        Gn = gtok.cumsum(1)
        qe, ke = qc.repeat_interleave(G, 0), kc.repeat_interleave(G, 0)  # [HV, n, K]
        qk = (qe @ ke.transpose(-1, -2)).detach().requires_grad_(True)
        kk = (ke @ ke.transpose(-1, -2)).detach().requires_grad_(True)
        vn = v_new[b, s:e].double().transpose(0, 1)
        S, dS = h[b, ci].double(), dh[b, ci].double()  # [HV, K, V]
        A = _inverse(ke, Gn, bc, kk)
        eg = Gn.exp()
        w = A @ (ke * (bc * eg)[..., None])
        u = A @ (vc * bc[..., None])
        m = torch.tril(torch.ones(n, n, dtype=torch.bool))
        gam = torch.where(m, torch.exp(torch.where(m, Gn[:, :, None] - Gn[:, None, :], 0.0)), 0.0)
        o = scale * (eg[..., None] * (qe @ S) + (qk * gam) @ vn)
        dec = torch.exp(Gn[:, -1:] - Gn)
        S1 = Gn[:, -1].exp()[:, None, None] * S + ke.transpose(-1, -2) @ (vn * dec[..., None])
        vnw = u - w @ S
        loss = (o * do[b, s:e].double().transpose(0, 1)).sum() + (S1 * dS).sum() \
            + (vnw * dv2[b, s:e].double().transpose(0, 1)).sum()
        # the score leaves stand in for q k^T and k k^T; chain their gradients into q, k
        gqk, gkk = torch.autograd.grad(loss, [qk, kk], retain_graph=True)
        loss = loss + (qe @ ke.transpose(-1, -2) * gqk).sum() + (ke @ ke.transpose(-1, -2) * gkk).sum()
        yield b, s, e, torch.autograd.grad(loss, [qc, kc, vc, bc, gtok]), gqk, gkk


def wy_dqkwg_bwd_ref(q, k, v, v_new, g, beta, h, dh, do, dv2, scale, cu_seqlens=None):
    """What ``wy_dqkwg_bwd`` returns, by autograd of each chunk's forward in fp64:
    ``(dq, dk [B, T, H, K], dv [B, T, HV, V], dbeta, dg [B, T, HV])``, dg the gradient of the
    per-token natural-log gate (the reverse cumsum of the cumulative gate's)."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    dq = torch.zeros(B, T, H, K, dtype=F64)
    dk = torch.zeros(B, T, H, K, dtype=F64)
    dv = torch.zeros(B, T, HV, V, dtype=F64)
    db = torch.zeros(B, T, HV, dtype=F64)
    dg = torch.zeros(B, T, HV, dtype=F64)
    for b, s, e, (gq, gk, gv, gb, gg), _, _ in _wy_bwd_chunks(q, k, v, v_new, g, beta, h, dh, do, dv2, scale,
                                                              cu_seqlens):
        dq[b, s:e] = gq.transpose(0, 1)
        dk[b, s:e] = gk.transpose(0, 1)
        dv[b, s:e] = gv.transpose(0, 1)
        db[b, s:e] = gb.T
        dg[b, s:e] = gg.T
    return dq, dk, dv, db, dg


def wy_dv_bwd_ref(q, k, v, v_new, g, beta, h, dh, do, dv2, scale, cu_seqlens=None):
    """What ``wy_dv_bwd`` (the first backward half) returns, by the same autograd:
    ``(dv [B, T, HV, V], dbeta [B, T, HV], dAqk, dAkk [B, T, HV, BT])``, dAqk and dAkk the
    gradients of the gate-free Q K^T and K K^T of each chunk (row t, column j of its chunk)."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    dv = torch.zeros(B, T, HV, V, dtype=F64)
    db = torch.zeros(B, T, HV, dtype=F64)
    dAqk = torch.zeros(B, T, HV, BT, dtype=F64)
    dAkk = torch.zeros(B, T, HV, BT, dtype=F64)
    for b, s, e, (_, _, gv, gb, _), gqk, gkk in _wy_bwd_chunks(q, k, v, v_new, g, beta, h, dh, do, dv2, scale,
                                                               cu_seqlens):
        dv[b, s:e] = gv.transpose(0, 1)
        db[b, s:e] = gb.T
        dAqk[b, s:e, :, :e - s] = gqk.transpose(0, 1)
        dAkk[b, s:e, :, :e - s] = gkk.transpose(0, 1)
    return dv, db, dAqk, dAkk


def chunk_output_ref(q, h, v_new, Aqk, g, scale, cu_seqlens=None):
    """``[B, T, HV, V]`` fp64: per chunk, scale * diag(exp2(G)) Q S + Aqk v_new (S = ``h[b, c]``);
    zero on tokens in no chunk (after ``cu_seqlens[-1]``)."""
    B, T, H, K = q.shape
    HV, V = v_new.shape[2], v_new.shape[3]
    G = HV // H
    o = torch.zeros(B, T, HV, V, dtype=F64)
    for b, s, e, c in chunks(B, T, cu_seqlens):
        n = e - s
        qc = q[b, s:e].double().repeat_interleave(G, 1).transpose(0, 1)  # [HV, n, K]
        gc = g[b, s:e].double().transpose(0, 1)  # [HV, n]
        inter = scale * torch.exp2(gc)[:, :, None] * (qc @ h[b, c].double())  # [HV, n, V]
        intra = Aqk[b, s:e, :, :n].double().transpose(0, 1) @ v_new[b, s:e].double().transpose(0, 1)
        o[b, s:e] = (inter + intra).transpose(0, 1)
    return o
