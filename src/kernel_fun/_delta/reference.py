"""Plain-torch references of the delta-rule engine, written from the math (fp64 by default).

Conventions (fla 0.6.0's):

- ``q [B, T, HQ, K]``, ``k [B, T, HK, K]``, ``v [B, T, HV, V]``, ``beta [B, T, HV]`` with
  ``HV`` a multiple of ``HQ`` and ``HK`` (grouped values: value head ``i`` reads query/key
  head ``i // (HV // HQ)``).
- Raw gates are per-token natural-log decays: ``g [B, T, HV]`` (GDN, scalar per head) or
  ``gk [B, T, HV, K]`` (KDA, per key channel). The chunked stages take them cumsummed within
  each chunk and multiplied by ``RCP_LN2 = 1/ln 2`` so that kernels use ``exp2``.
- ``cu_seqlens [N + 1]`` (varlen): ``B == 1`` and sequence ``n`` is tokens
  ``cu_seqlens[n]:cu_seqlens[n+1]``; chunks never straddle two sequences. States are
  ``[N, HV, K, V]``; the per-chunk states ``h`` are ``[B, NT, HV, K, V]`` with the chunks of
  all sequences concatenated (sequence ``n`` starts at chunk ``chunk_offsets[n]``).

The chunked form, for one chunk with start state ``S0 [K, V]`` and in-chunk cumulative
log2 gate ``G [BT, K]`` (``gam = exp2(G)``; broadcast over ``K`` for the scalar gate):

    T_   = (I + StrictLower(diag(beta) ((k * gam) (k / gam)^T)))^-1      [BT, BT]
    w    = T_ diag(beta) (k * gam)                                         [BT, K]
    u    = T_ diag(beta) v                                                 [BT, V]
    v'   = u - w S0                  ("v_new")                             [BT, V]
    Aqk  = scale * Lower((q * gam) (k / gam)^T)  (diagonal included)       [BT, BT]
    o    = scale * (q * gam) S0 + Aqk v'                                   [BT, V]
    kg   = k * exp2(G_last - G)                                            [BT, K]
    S1   = diag(exp2(G_last)) S0 + kg^T v'                                 [K, V]

(``(k * gam)(k / gam)^T`` is written here literally for clarity; it is evaluated as
``sum_c k_ic k_jc exp2(G_ic - G_jc)`` so that no factor overflows.)
"""
from __future__ import annotations

import math

import torch

RCP_LN2 = 1.0 / math.log(2.0)


def _segments(T: int, B: int, cu_seqlens: torch.Tensor | None) -> list[tuple[int, int, int]]:
    """(batch index, start, end) of every sequence."""
    if cu_seqlens is None:
        return [(b, 0, T) for b in range(B)]
    if B != 1:
        raise ValueError("varlen (cu_seqlens) needs B == 1")
    cu = [int(x) for x in cu_seqlens.tolist()]
    return [(0, cu[n], cu[n + 1]) for n in range(len(cu) - 1)]


def chunk_offsets_ref(cu_seqlens: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """``[N + 1]``: index of each sequence's first chunk in the concatenated chunk axis."""
    lens = torch.diff(cu_seqlens.long())
    return torch.nn.functional.pad((lens + chunk_size - 1) // chunk_size, (1, 0)).cumsum(0)


def chunk_local_cumsum_ref(
    g: torch.Tensor,
    chunk_size: int = 64,
    cu_seqlens: torch.Tensor | None = None,
    scale: float = RCP_LN2,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """Cumulative sum of a raw log-gate within each chunk, times ``scale``.

    g: ``[B, T, HV]`` or ``[B, T, HV, K]`` natural-log per-token decays (<= 0).
    Returns the same shape in ``dtype``: the log2-space cumulative gate the stages take.
    """
    out = torch.empty_like(g, dtype=dtype)
    B, T = g.shape[:2]
    for b, bos, eos in _segments(T, B, cu_seqlens):
        for s in range(bos, eos, chunk_size):
            e = min(s + chunk_size, eos)
            out[b, s:e] = g[b, s:e].to(dtype).cumsum(0) * scale
    return out


def _expand_heads(x: torch.Tensor, HV: int) -> torch.Tensor:
    """``[B, T, H, D] -> [B, T, HV, D]`` (value head i reads head i // (HV // H))."""
    return x.repeat_interleave(HV // x.shape[2], dim=2)


def _gate_channels(g: torch.Tensor | None, gk: torch.Tensor | None, shape, dtype) -> torch.Tensor:
    """The cumulative log2 gate broadcast to ``[B, T, HV, K]`` (zeros when ungated)."""
    if gk is not None:
        return gk.to(dtype)
    if g is not None:
        return g.to(dtype)[..., None].expand(shape)
    return torch.zeros(shape, dtype=dtype)


def intra_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor | None = None,
    gk: torch.Tensor | None = None,
    scale: float | None = None,
    chunk_size: int = 64,
    cu_seqlens: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float64,
) -> dict[str, torch.Tensor]:
    """The intra-chunk stage: everything the state scan consumes, from raw inputs.

    q ``[B, T, HQ, K]``, k ``[B, T, HK, K]``, v ``[B, T, HV, V]``, beta ``[B, T, HV]``;
    g ``[B, T, HV]`` or gk ``[B, T, HV, K]``: cumulative log2 gates (``chunk_local_cumsum_ref``),
    at most one of them.
    Returns (in ``dtype``) ``w [B, T, HV, K]``, ``u [B, T, HV, V]``,
    ``kg [B, T, HV, K]`` (= k * exp2(G_last - G), what fla's KDA passes to fwd_h as ``k``) and
    ``Aqk [B, T, HV, BT]`` (row t of a chunk holds its causal scores, scale and gate included,
    zero above the diagonal and beyond the sequence end) and ``Akk [B, T, HV, BT]`` (row t of a
    chunk holds its row of ``(I + L)^-1``, fla's ``Akk``, with ``L = Lower(beta_i k_i k_j E)``;
    zero above the diagonal and beyond the sequence end).
    """
    B, T, HQ, K = q.shape
    HV = v.shape[2]
    BT = chunk_size
    if scale is None:
        scale = K ** -0.5
    qe = _expand_heads(q.to(dtype), HV)
    ke = _expand_heads(k.to(dtype), HV)
    ve, be = v.to(dtype), beta.to(dtype)
    G = _gate_channels(g, gk, (B, T, HV, K), dtype).to(q.device)
    w = torch.zeros(B, T, HV, K, dtype=dtype, device=q.device)
    u = torch.zeros(B, T, HV, v.shape[-1], dtype=dtype, device=q.device)
    kg = torch.zeros_like(w)
    Aqk = torch.zeros(B, T, HV, BT, dtype=dtype, device=q.device)
    Akk_inv = torch.zeros(B, T, HV, BT, dtype=dtype, device=q.device)
    for b, bos, eos in _segments(T, B, cu_seqlens):
        for s in range(bos, eos, BT):
            e = min(s + BT, eos)
            n = e - s
            for h in range(HV):
                kc, qc, vc, bc, Gc = ke[b, s:e, h], qe[b, s:e, h], ve[b, s:e, h], be[b, s:e, h], G[b, s:e, h]
                # D[i, j, c] = G_ic - G_jc ; masked to i >= j before exponentiating
                D = Gc[:, None, :] - Gc[None, :, :]
                lower = torch.tril(torch.ones(n, n, dtype=torch.bool, device=q.device))
                E = torch.where(lower[..., None], torch.exp2(torch.where(lower[..., None], D, 0)), 0)
                kk = torch.einsum("ic,jc,ijc->ij", kc, kc, E)
                qk = torch.einsum("ic,jc,ijc->ij", qc, kc, E)
                Akk = torch.tril(bc[:, None] * kk, -1)
                Tm = torch.linalg.inv(torch.eye(n, dtype=dtype, device=q.device) + Akk)
                w[b, s:e, h] = Tm @ (bc[:, None] * kc * torch.exp2(Gc))
                u[b, s:e, h] = Tm @ (bc[:, None] * vc)
                kg[b, s:e, h] = kc * torch.exp2(Gc[-1:] - Gc)
                Aqk[b, s:e, h, :n] = scale * qk
                Akk_inv[b, s:e, h, :n] = Tm
    return {"w": w, "u": u, "kg": kg, "Aqk": Aqk, "Akk": Akk_inv}


def wy_from_inverse_ref(
    A: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor | None = None,
    chunk_size: int = 64,
    cu_seqlens: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(w, u)`` from a given WY inverse, exactly (in ``dtype``): per chunk w = A diag(beta
    exp2(g)) K and u = A diag(beta) V, A ``[B, T, HV, BT]`` read below and on its diagonal only,
    k ``[B, T, H, K]``, v ``[B, T, HV, V]``, beta and g (the chunk-local cumulative log2 gate, or
    None) ``[B, T, HV]``. The scans' ``wy=`` form computes with these without forming them."""
    B, T, HV = beta.shape
    BT = chunk_size
    ke = _expand_heads(k.to(dtype), HV)
    A, v, beta = A.to(dtype), v.to(dtype), beta.to(dtype)
    eg = torch.exp2(g.to(dtype)) if g is not None else torch.ones_like(beta)
    w = torch.zeros(ke.shape, dtype=dtype, device=k.device)
    u = torch.zeros(v.shape, dtype=dtype, device=k.device)
    for b, bos, eos in _segments(T, B, cu_seqlens):
        for s in range(bos, eos, BT):
            e = min(s + BT, eos)
            Ac = torch.tril(A[b, s:e, :, : e - s].transpose(0, 1))  # [HV, n, n]
            bc = beta[b, s:e].T[..., None]
            w[b, s:e] = (Ac @ (ke[b, s:e].transpose(0, 1) * bc * eg[b, s:e].T[..., None])).transpose(0, 1)
            u[b, s:e] = (Ac @ (v[b, s:e].transpose(0, 1) * bc)).transpose(0, 1)
    return w, u


def state_scan_fwd_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    w: torch.Tensor,
    u: torch.Tensor,
    g: torch.Tensor | None = None,
    gk: torch.Tensor | None = None,
    Aqk: torch.Tensor | None = None,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    chunk_size: int = 64,
    dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """The forward state scan with ``o`` (what fla's fwd_h + fwd_o compute), chunk by chunk.

    q ``[B, T, HQ, K]``: raw queries (never pre-gated).
    k ``[B, T, HK, K]``: with ``gk`` (KDA) the chunk-end-gated keys ``kg``
    (``HK == HV``); with ``g`` (GDN) or no gate, the raw keys.
    w ``[B, T, HV, K]``, u ``[B, T, HV, V]``: the WY factors of the intra stage.
    g ``[B, T, HV]`` / gk ``[B, T, HV, K]``: cumulative log2 gates (at most one).
    Aqk ``[B, T, HV, BT]``: intra-chunk scores, scale included (required with ``gk``); when
    None it is formed here as fla's ``chunk_fwd_o`` does: ``scale * Lower(q k^T * exp2(g_i - g_j))``.
    initial_state ``[N, HV, K, V]``.
    Returns ``o [B, T, HV, V]``, ``final_state [N, HV, K, V]`` (or None),
    ``h [B, NT, HV, K, V]`` (the state before each chunk) and ``v_new [B, T, HV, V]``
    (``u - w S``, before any gating), all in ``dtype``.
    """
    B, T, HQ, K = q.shape
    HV, V = u.shape[2], u.shape[-1]
    BT = chunk_size
    if scale is None:
        scale = K ** -0.5
    if gk is not None and Aqk is None:
        raise ValueError("a per-channel gate needs Aqk")
    dev = q.device
    qe = _expand_heads(q.to(dtype), HV)
    ke = _expand_heads(k.to(dtype), HV)
    we, ue = w.to(dtype), u.to(dtype)
    segs = _segments(T, B, cu_seqlens)
    N = len(segs)
    NT = sum((e - s + BT - 1) // BT for _, s, e in segs) if cu_seqlens is not None else (T + BT - 1) // BT
    o = torch.zeros(B, T, HV, V, dtype=dtype, device=dev)
    v_new = torch.zeros(B, T, HV, V, dtype=dtype, device=dev)
    h = torch.zeros(B, NT, HV, K, V, dtype=dtype, device=dev)
    final = torch.zeros(N, HV, K, V, dtype=dtype, device=dev)
    ic = 0  # global chunk index (varlen)
    for n, (b, bos, eos) in enumerate(segs):
        S = torch.zeros(HV, K, V, dtype=dtype, device=dev)
        if initial_state is not None:
            S = S + initial_state[n].to(dtype)
        for c, s in enumerate(range(bos, eos, BT)):
            e = min(s + BT, eos)
            nn = e - s
            hi = ic if cu_seqlens is not None else c
            h[b, hi] = S
            vn = ue[b, s:e] - torch.einsum("thk,hkv->thv", we[b, s:e], S)
            v_new[b, s:e] = vn
            if gk is not None:
                Gc = gk[b, s:e].to(dtype)                                  # [nn, HV, K]
                o_inter = torch.einsum("thk,hkv->thv", qe[b, s:e] * torch.exp2(Gc), S)
                decay = torch.exp2(Gc[-1])[:, :, None]                     # [HV, K, 1]
                v_upd = vn
            elif g is not None:
                Gc = g[b, s:e].to(dtype)                                   # [nn, HV]
                o_inter = torch.einsum("thk,hkv->thv", qe[b, s:e], S) * torch.exp2(Gc)[..., None]
                decay = torch.exp2(Gc[-1])[:, None, None]
                v_upd = vn * torch.exp2(Gc[-1:] - Gc)[..., None]
            else:
                o_inter = torch.einsum("thk,hkv->thv", qe[b, s:e], S)
                decay = 1.0
                v_upd = vn
            if Aqk is not None:
                A = Aqk[b, s:e, :, :nn].to(dtype).permute(1, 0, 2)          # [HV, nn, nn]
                A = torch.where(torch.ones(nn, nn, dtype=torch.bool, device=dev).tril(), A, 0)
            else:
                A = torch.einsum("ihk,jhk->hij", qe[b, s:e], ke[b, s:e])
                if g is not None:
                    lower = torch.tril(torch.ones(nn, nn, dtype=torch.bool, device=dev))
                    Gh = Gc.T                                              # [HV, nn]
                    D = torch.where(lower, Gh[:, :, None] - Gh[:, None, :], 0)
                    A = A * torch.exp2(D)
                A = torch.tril(A) * scale
            o[b, s:e] = scale * o_inter + torch.einsum("hij,jhv->ihv", A, vn)
            S = decay * S + torch.einsum("thk,thv->hkv", ke[b, s:e], v_upd)
            ic += 1
        final[n] = S
    return o, (final if output_final_state else None), h, v_new


def state_scan_bwd_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    w: torch.Tensor,
    do: torch.Tensor,
    dv: torch.Tensor,
    g: torch.Tensor | None = None,
    gk: torch.Tensor | None = None,
    dht: torch.Tensor | None = None,
    scale: float | None = None,
    cu_seqlens: torch.Tensor | None = None,
    chunk_size: int = 64,
    dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward state scan (what fla's ``chunk_gated_delta_rule_bwd_dhu`` computes), chunk by
    chunk from the last: ``dh[c] = dS``; ``dv2 = dv + k dS`` (times ``exp2(G_last - G)`` per
    token with a scalar gate); ``dS = decay dS + scale qg^T do - w^T dv2``.

    q ``[B, T, HQ, K]``: with ``gk`` (KDA) the gated ``qg`` (``HQ == HV``); with ``g`` (GDN) or
    no gate the raw queries. k likewise (``kg`` with ``gk``). Returns ``dh [B, NT, HV, K, V]``,
    ``dh0 [N, HV, K, V]`` (the gradient of the initial state) and ``dv2 [B, T, HV, V]`` in ``dtype``.
    """
    B, T, _, K = q.shape
    HV, V = do.shape[2], do.shape[-1]
    BT = chunk_size
    if scale is None:
        scale = K ** -0.5
    dev = q.device
    qe = _expand_heads(q.to(dtype), HV)
    ke = _expand_heads(k.to(dtype), HV)
    we, doe, dve = w.to(dtype), do.to(dtype), dv.to(dtype)
    segs = _segments(T, B, cu_seqlens)
    NT = sum((e - s + BT - 1) // BT for _, s, e in segs) if cu_seqlens is not None else (T + BT - 1) // BT
    dh = torch.zeros(B, NT, HV, K, V, dtype=dtype, device=dev)
    dh0 = torch.zeros(len(segs), HV, K, V, dtype=dtype, device=dev)
    dv2 = torch.zeros(B, T, HV, V, dtype=dtype, device=dev)
    ic = 0
    for n, (b, bos, eos) in enumerate(segs):
        starts = list(range(bos, eos, BT))
        dS = dht[n].to(dtype) if dht is not None else torch.zeros(HV, K, V, dtype=dtype, device=dev)
        for c in range(len(starts) - 1, -1, -1):
            s, e = starts[c], min(starts[c] + BT, eos)
            dh[b, ic + c if cu_seqlens is not None else c] = dS
            kdS = torch.einsum("thk,hkv->thv", ke[b, s:e], dS)
            qc = qe[b, s:e]
            if gk is not None:
                decay = torch.exp2(gk[b, e - 1].to(dtype))[:, :, None]    # [HV, K, 1]
            elif g is not None:
                Gc = g[b, s:e].to(dtype)                                  # [nn, HV]
                decay = torch.exp2(Gc[-1])[:, None, None]
                kdS = kdS * torch.exp2(Gc[-1:] - Gc)[..., None]
                qc = qc * torch.exp2(Gc)[..., None]
            else:
                decay = 1.0
            dvc = dve[b, s:e] + kdS
            dv2[b, s:e] = dvc
            dS = decay * dS + scale * torch.einsum("thk,thv->hkv", qc, doe[b, s:e]) \
                - torch.einsum("thk,thv->hkv", we[b, s:e], dvc)
        dh0[n] = dS
        ic += len(starts)
    return dh, dh0, dv2


def naive_recurrence_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor | None = None,
    gk: torch.Tensor | None = None,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The gated delta rule token by token: the oracle the chunked stages must agree with.

    q ``[B, T, HQ, K]``, k ``[B, T, HK, K]``, v ``[B, T, HV, V]``, beta ``[B, T, HV]``;
    g ``[B, T, HV]`` (GDN) or gk ``[B, T, HV, K]`` (KDA): RAW natural-log per-token decays
    (not cumsummed), at most one; initial_state ``[N, HV, K, V]``.
    For each token: ``S = exp(gate) * S`` (per key channel for gk);
    ``S += beta k (v - k^T S)^T``; ``o = scale * q^T S``.
    Returns ``o [B, T, HV, V]`` and ``final_state [N, HV, K, V]`` (or None), in ``dtype``.
    """
    B, T, HQ, K = q.shape
    HV, V = v.shape[2], v.shape[-1]
    if scale is None:
        scale = K ** -0.5
    qe = _expand_heads(q.to(dtype), HV)
    ke = _expand_heads(k.to(dtype), HV)
    ve, be = v.to(dtype), beta.to(dtype)
    segs = _segments(T, B, cu_seqlens)
    o = torch.zeros(B, T, HV, V, dtype=dtype, device=q.device)
    final = torch.zeros(len(segs), HV, K, V, dtype=dtype, device=q.device)
    for n, (b, bos, eos) in enumerate(segs):
        S = torch.zeros(HV, K, V, dtype=dtype, device=q.device)
        if initial_state is not None:
            S = S + initial_state[n].to(dtype)
        for t in range(bos, eos):
            if gk is not None:
                S = S * torch.exp(gk[b, t].to(dtype))[..., None]
            elif g is not None:
                S = S * torch.exp(g[b, t].to(dtype))[:, None, None]
            kt = ke[b, t]                                                   # [HV, K]
            err = ve[b, t] - torch.einsum("hk,hkv->hv", kt, S)
            S = S + torch.einsum("hk,hv->hkv", kt, be[b, t][:, None] * err)
            o[b, t] = scale * torch.einsum("hk,hkv->hv", qe[b, t], S)
        final[n] = S
    return o, (final if output_final_state else None)

