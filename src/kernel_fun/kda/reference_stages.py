"""Plain-torch references of KDA's backward stages, written from the math.

They are the oracles for ``kda/_kernels/intra_bwd.py``, ``kda/_kernels/wy_bwd.py``,
``_delta/_kernels/score_grad.py`` and ``kda/_kernels/gate_bwd.py`` and take the arguments of fla
0.6.0's ``chunk_kda_bwd_intra``, ``chunk_kda_bwd_wy_dqkg_fused``, ``chunk_kda_bwd_dAv`` and
``chunk_local_cumsum`` + ``kda_gate_bwd``. Everything is computed in ``dtype`` (fp64 by default) and
returned in that dtype; nothing here is fast.

Conventions (fla's): one chunk = ``BT`` tokens counted from the start of each sequence; the
gate ``g`` is the chunk-local cumsum of the per-token log decay in log2 units, so
``exp2(g_i - g_j)`` is the decay from token ``j`` to token ``i`` of the same chunk. q/k live
at ``H`` heads and are shared by the ``G = HV / H`` value heads of their group. In a chunk,
``Aqk_ij = scale * sum_c q_ic k_jc exp2(g_ic - g_jc)`` (``j <= i``) and
``L_ij = beta_i * sum_c k_ic k_jc exp2(g_ic - g_jc)`` (``j < i``); fla stores
``Akk = (I + L)^-1``, and ``w = Akk (beta k exp2(g))``, ``u = Akk (beta v)``,
``v_new = u - w h``, ``h_next = exp2(g_last) h + (k exp2(g_last - g))^T v_new``,
``o = scale (q exp2(g)) h + Aqk v_new``.
"""
from __future__ import annotations

import torch

from kernel_fun._delta.reference import _segments  # (batch row, first token, end token) per sequence


def _chunked(x: torch.Tensor, n_chunks: int, BT: int, dtype) -> torch.Tensor:
    """``[L, heads, ...]`` -> ``[N, heads, BT, ...]`` zero-padded to ``N * BT`` tokens."""
    L = x.shape[0]
    x = x.to(dtype)
    pad = n_chunks * BT - L
    if pad:
        x = torch.cat([x, x.new_zeros(pad, *x.shape[1:])], 0)
    x = x.view(n_chunks, BT, *x.shape[1:])
    return x.transpose(1, 2)


def _unchunk(x: torch.Tensor, L: int) -> torch.Tensor:
    """``[N, heads, BT, ...]`` -> ``[L, heads, ...]``."""
    x = x.transpose(1, 2)
    return x.reshape(-1, *x.shape[2:])[:L]


def intra_bwd_reference(q, k, g, beta, dAqk, dAkk, dq, dk, db, dg, cu_seqlens=None,
                        chunk_indices=None, chunk_size: int = 64, dtype=torch.float64, **unused):
    """Reference of fla's ``chunk_kda_bwd_intra``.

    Args:
        q, k: ``[B, T, H, K]``; g: ``[B, T, HV, K]`` (chunk-local cumsum, log2 units);
        beta: ``[B, T, HV]``; dAqk, dAkk: ``[B, T, HV, BT]`` (row ``t`` holds the chunk row of
        token ``t``; entries on and below the diagonal are used, as fla does);
        dq, dk, dg: ``[B, T, HV, K]``; db: ``[B, T, HV]``.

    Returns:
        ``(dq, dk, db, dg)`` in ``dtype``: the inputs plus, per chunk with
        ``E_ijc = exp2(g_ic - g_jc)`` (``j <= i``)::

            dq_i += sum_j dAqk_ij k_j E_ij
            dkr_i = sum_j dAkk_ij k_j E_ij
            dkt_j = sum_i (dAqk_ij q_i + dAkk_ij beta_i k_i) E_ij
            dk   += beta dkr + dkt;  db += sum_c dkr k;  dg += q dq_intra + (beta dkr - dkt) k
    """
    B, T, H, K = k.shape
    HV = g.shape[2]
    G = HV // H
    BT = chunk_size
    dq_o, dk_o, db_o, dg_o = (x.to(dtype).clone() for x in (dq, dk, db, dg))
    tri = torch.tril(torch.ones(BT, BT, dtype=torch.bool, device=k.device))
    for b, bos, eos in _segments(T, B, cu_seqlens):
        L = eos - bos
        if L <= 0:
            continue
        N = (L + BT - 1) // BT
        qc = _chunked(q[b, bos:eos].repeat_interleave(G, dim=1), N, BT, dtype)  # [N, HV, BT, K]
        kc = _chunked(k[b, bos:eos].repeat_interleave(G, dim=1), N, BT, dtype)
        gc = _chunked(g[b, bos:eos], N, BT, dtype)
        bc = _chunked(beta[b, bos:eos], N, BT, dtype)  # [N, HV, BT]
        valid = (torch.arange(N * BT, device=k.device) < L).view(N, BT)
        m = tri[None] & valid[:, :, None] & valid[:, None, :]  # [N, BT(i), BT(j)]
        m = m[:, None]  # [N, 1, BT, BT]
        Xq = torch.where(m, _chunked(dAqk[b, bos:eos], N, BT, dtype), 0)  # [N, HV, BT, BT]
        Xk = torch.where(m, _chunked(dAkk[b, bos:eos], N, BT, dtype), 0)
        m5 = m[..., None]
        diff = gc[:, :, :, None, :] - gc[:, :, None, :, :]  # [N, HV, BT(i), BT(j), K]
        E = torch.where(m5, torch.exp2(torch.where(m5, diff, 0)), 0)
        dq_i = torch.einsum("nhij,nhijc,nhjc->nhic", Xq, E, kc)
        dkr = torch.einsum("nhij,nhijc,nhjc->nhic", Xk, E, kc)
        dkt = (torch.einsum("nhij,nhijc,nhic->nhjc", Xq, E, qc)
               + torch.einsum("nhij,nhijc,nhic->nhjc", Xk, E, bc[..., None] * kc))
        db_i = (dkr * kc).sum(-1)
        dkr = dkr * bc[..., None]
        dq_o[b, bos:eos] += _unchunk(dq_i, L)
        dk_o[b, bos:eos] += _unchunk(dkr + dkt, L)
        db_o[b, bos:eos] += _unchunk(db_i, L)
        dg_o[b, bos:eos] += _unchunk(qc * dq_i + (dkr - dkt) * kc, L)
    return dq_o, dk_o, db_o, dg_o


def wy_dqkg_bwd_reference(q, k, v, v_new, g, beta, A, h, do, dh, dv, scale=None,
                          state_v_first: bool = False, cu_seqlens=None, chunk_size: int = 64,
                          chunk_indices=None, chunk_offsets=None, dtype=torch.float64, **unused):
    """Reference of fla's ``chunk_kda_bwd_wy_dqkg_fused`` (``state_v_first=False``).

    Args:
        q, k: ``[B, T, H, K]``; v, v_new, do: ``[B, T, HV, V]``; g: ``[B, T, HV, K]``;
        beta: ``[B, T, HV]``; A: ``[B, T, HV, BT]`` (``Akk = (I + L)^-1`` rows);
        h, dh: ``[B, NT, HV, K, V]`` (``[1, NT_total, ...]`` with cu_seqlens): ``h[c]`` the
        state entering chunk ``c``, ``dh[c]`` the gradient of the state leaving it;
        dv: ``[B, T, HV, V]`` the full gradient of ``v_new``.

    Returns:
        ``(dq, dk, dv, db, dg, dA)`` in ``dtype``, per chunk (``E = exp2(g)``, ``gn`` the gate
        of the chunk's last token, ``A^T`` the transpose of the chunk's ``Akk``)::

            dq  = scale (do h^T) E
            dks = (v_new dh^T) exp2(gn - g);        dw = -(dv h^T)
            dkw = A^T dw;                            dvw = A^T dv
            dv_out = beta dvw;   db = sum_V dvw v + sum_K dkw k E
            dk  = dks + beta dkw E
            dg  = q dq - k dks + beta dkw k E + [t = last] (exp2(gn) sum_V h dh + sum_t k dks)
            dA  = -A^T (strict_lower((dv v^T + dw (k E)^T) diag(beta))) A^T, strictly lower
    """
    if state_v_first:
        raise NotImplementedError("state_v_first=True is not covered")
    B, T, H, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    G = HV // H
    BT = chunk_size
    if scale is None:
        scale = K ** -0.5
    dev = k.device
    dq_o = torch.zeros(B, T, HV, K, dtype=dtype, device=dev)
    dk_o = torch.zeros_like(dq_o)
    dg_o = torch.zeros_like(dq_o)
    dv_o = torch.zeros(B, T, HV, V, dtype=dtype, device=dev)
    db_o = torch.zeros(B, T, HV, dtype=dtype, device=dev)
    dA_o = torch.zeros(B, T, HV, BT, dtype=dtype, device=dev)
    strict = torch.tril(torch.ones(BT, BT, dtype=torch.bool, device=dev), -1)
    c0 = 0  # global chunk index of the segment's first chunk (varlen h layout)
    for b, bos, eos in _segments(T, B, cu_seqlens):
        L = eos - bos
        N = (L + BT - 1) // BT
        if L <= 0:
            continue
        hb = 0 if cu_seqlens is not None else b
        hc = h[hb, c0:c0 + N].to(dtype)  # [N, HV, K, V]
        dhc = dh[hb, c0:c0 + N].to(dtype)
        if cu_seqlens is not None:
            c0 += N
        qc = _chunked(q[b, bos:eos].repeat_interleave(G, dim=1), N, BT, dtype)  # [N, HV, BT, K]
        kc = _chunked(k[b, bos:eos].repeat_interleave(G, dim=1), N, BT, dtype)
        gc = _chunked(g[b, bos:eos], N, BT, dtype)
        vc, vnc, doc, dvc = (_chunked(x[b, bos:eos], N, BT, dtype) for x in (v, v_new, do, dv))
        bc = _chunked(beta[b, bos:eos], N, BT, dtype)  # [N, HV, BT]
        Ac = _chunked(A[b, bos:eos], N, BT, dtype)  # [N, HV, BT, BT]
        valid = (torch.arange(N * BT, device=dev) < L).view(N, BT)
        vt = valid[:, None, :, None]  # [N, 1, BT, 1]
        last = torch.clamp(L - torch.arange(N, device=dev) * BT, max=BT) - 1  # [N]
        gn = gc[torch.arange(N, device=dev), :, last]  # [N, HV, K]
        E = torch.where(vt, torch.exp2(torch.where(vt, gc, 0)), 0)
        Edec = torch.where(vt, torch.exp2(torch.where(vt, gn[:, :, None] - gc, 0)), 0)
        At = Ac.transpose(-1, -2)
        dq = scale * (doc @ hc.transpose(-1, -2)) * E
        dks = (vnc @ dhc.transpose(-1, -2)) * Edec
        dw = -(dvc @ hc.transpose(-1, -2))
        kE = kc * E
        dkw = At @ dw
        dvw = At @ dvc
        db = (dvw * vc).sum(-1) + (dkw * kE).sum(-1)
        dgk = (hc * dhc).sum(-1) * torch.exp2(gn) + (kc * dks).sum(-2)  # [N, HV, K]
        onehot = (torch.arange(BT, device=dev)[None, :] == last[:, None]).to(dtype)  # [N, BT]
        dg = qc * dq - kc * dks + bc[..., None] * dkw * kE + onehot[:, None, :, None] * dgk[:, :, None, :]
        dk = dks + bc[..., None] * dkw * E
        ms = (strict[None] & valid[:, :, None] & valid[:, None, :])[:, None]  # [N, 1, BT, BT]
        dAt = torch.where(ms, (dvc @ vc.transpose(-1, -2) + dw @ kE.transpose(-1, -2)) * bc[:, :, None, :], 0)
        dL = torch.where(ms, -(At @ dAt @ At), 0)
        dq_o[b, bos:eos] = _unchunk(dq, L)
        dk_o[b, bos:eos] = _unchunk(dk, L)
        dg_o[b, bos:eos] = _unchunk(dg, L)
        dv_o[b, bos:eos] = _unchunk(bc[..., None] * dvw, L)
        db_o[b, bos:eos] = _unchunk(db, L)
        dA_o[b, bos:eos] = _unchunk(dL, L)
    return dq_o, dk_o, dv_o, db_o, dg_o, dA_o


def recompute_w_u_reference(k, v, beta, A, gk, q=None, cu_seqlens=None, chunk_size: int = 64,
                            dtype=torch.float64, **unused):
    """Reference of fla's ``recompute_w_u_fwd`` (the backward's recompute), per chunk::

        u = A (beta v);  w = A (beta k exp2(g));  qg = q exp2(g);  kg = k exp2(g_last - g)

    with ``A`` the chunk's ``Akk`` rows and ``g_last`` the gate of the chunk's last token.
    Returns ``(w, u, qg, kg)`` in ``dtype`` (qg None without q); grouped heads broadcast q, k."""
    B, T, H, K = k.shape
    HV = v.shape[2]
    G = HV // H
    BT = chunk_size
    c = lambda x: x.to(dtype)  # noqa: E731
    kk, vv, bb, AA, gg = c(k).repeat_interleave(G, 2), c(v), c(beta), c(A), c(gk)
    qq = c(q).repeat_interleave(G, 2) if q is not None else None
    w, u = torch.zeros_like(kk), torch.zeros_like(vv)
    qg = torch.zeros_like(kk) if q is not None else None
    kg = torch.zeros_like(kk)
    for b, bos, eos in _segments(T, B, cu_seqlens):
        for s in range(bos, eos, BT):
            e = min(s + BT, eos)
            n = e - s
            Ac = AA[b, s:e, :, :n].transpose(0, 1)  # [HV, n, n]
            E = torch.exp2(gg[b, s:e])  # [n, HV, K]
            u[b, s:e] = (Ac @ (bb[b, s:e, :, None] * vv[b, s:e]).transpose(0, 1)).transpose(0, 1)
            w[b, s:e] = (Ac @ (bb[b, s:e, :, None] * kk[b, s:e] * E).transpose(0, 1)).transpose(0, 1)
            if q is not None:
                qg[b, s:e] = qq[b, s:e] * E
            kg[b, s:e] = kk[b, s:e] * torch.exp2(gg[b, e - 1] - gg[b, s:e])
    return w, u, qg, kg


def dAv_reference(v, do, A, scale, cu_seqlens=None, chunk_size: int = 64, dtype=torch.float64):
    """Reference of fla's ``chunk_kda_bwd_dAv`` (v is v_new, A is Aqk): per chunk
    ``dAqk = scale * tril(do v^T)`` (diagonal included, zero above it) and
    ``dv = tril(A)^T do`` (A's entries above the diagonal are not read).

    Returns ``(dA [B, T, HV, BT], dv [B, T, HV, V])`` in ``dtype``."""
    B, T, HV, V = do.shape
    BT = chunk_size
    dA = torch.zeros(B, T, HV, BT, dtype=dtype, device=do.device)
    dv = torch.zeros(B, T, HV, V, dtype=dtype, device=do.device)
    for b, bos, eos in _segments(T, B, cu_seqlens):
        for s in range(bos, eos, BT):
            e = min(s + BT, eos)
            n = e - s
            tri = torch.tril(torch.ones(n, n, dtype=torch.bool, device=do.device))
            dob, vb = do[b, s:e].to(dtype), v[b, s:e].to(dtype)                 # [n, HV, V]
            Ab = torch.where(tri, A[b, s:e, :, :n].to(dtype).permute(1, 0, 2), 0)  # [HV, n, n]; NaN above unread
            dA[b, s:e, :, :n] = (scale * torch.einsum("ihv,jhv->hij", dob, vb) * tri).permute(1, 0, 2)
            dv[b, s:e] = torch.einsum("hij,ihv->jhv", Ab, dob)
    return dA, dv


def dg_cumsum_gate_bwd_reference(dg, g=None, A_log=None, dt_bias=None, cu_seqlens=None, chunk_size: int = 64,
                                 dtype=torch.float64):
    """Reference of fla's ``chunk_local_cumsum(dg, reverse=True)`` followed, with ``g`` (the raw
    gate input), by ``kda_gate_bwd(g, A_log, dt_bias, dyg=...)``: per chunk the reverse cumsum
    ``dyg_t = sum_{s >= t} dg_s``, then autograd through ``-exp(A_log) softplus(g + dt_bias)``.

    Returns ``(dg_out, dA_log, ddt_bias)`` in ``dtype`` (the last two None without ``g``;
    ddt_bias None without ``dt_bias``)."""
    B, T, HV, K = dg.shape
    dyg = torch.zeros(B, T, HV, K, dtype=dtype, device=dg.device)
    for b, bos, eos in _segments(T, B, cu_seqlens):
        for s in range(bos, eos, chunk_size):
            e = min(s + chunk_size, eos)
            dyg[b, s:e] = dg[b, s:e].to(dtype).flip(0).cumsum(0).flip(0)
    if g is None:
        return dyg, None, None
    leaves = [g.to(dtype).requires_grad_(), A_log.to(dtype).requires_grad_()]
    if dt_bias is not None:
        leaves.append(dt_bias.to(dtype).requires_grad_())
    with torch.enable_grad():
        x = leaves[0] + (leaves[2].view(HV, K) if dt_bias is not None else 0)
        y = -leaves[1].exp()[:, None] * torch.nn.functional.softplus(x)
        grads = torch.autograd.grad(y, leaves, dyg)
    return grads[0], grads[1], grads[2] if dt_bias is not None else None
