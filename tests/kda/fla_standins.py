"""Plain-torch stand-ins for the fla stage functions the KDA chain calls (fla's kernels do not
run under Triton's interpreter), so the CPU tier can run the whole chain: fla's stages in
torch, ours through the interpreter, end to end against the fp64 recurrence.

Each stand-in has the signature and return convention of fla 0.6.0's function (shapes,
dtypes, which entries are written), computed chunk by chunk in fp64. Entries fla leaves
unwritten (the upper triangles of Aqk and dAqk) are NaN here, so a consumer that reads them
fails. ``install(monkeypatch)`` routes ``kda.chain``'s fla calls to these.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from kernel_fun.kda.reference_stages import recompute_w_u_reference

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "delta"))
from input_standins import INPUTS, install_into  # noqa: E402  (shared with the other family)

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


STANDINS = {
    **INPUTS,  # _delta/inputs' l2norm and beta sigmoid (tests/delta/input_standins.py)
    ("fla.ops.kda.gate", "kda_gate_chunk_cumsum"): kda_gate_chunk_cumsum,
    ("fla.ops.utils.cumsum", "chunk_local_cumsum"): chunk_local_cumsum,
    ("fla.ops.kda.chunk_intra", "chunk_kda_fwd_intra"): chunk_kda_fwd_intra,
    ("fla.ops.kda.wy_fast", "recompute_w_u_fwd"): recompute_w_u_fwd,
    ("fla.ops.common.chunk_delta_h", "chunk_gated_delta_rule_fwd_h"): chunk_gated_delta_rule_fwd_h,
}


def install(monkeypatch):
    """Route kda.chain's fla stage calls (and ``_delta.inputs``') to the stand-ins. Returns the
    list of (module, symbol) called, in order."""
    from kernel_fun.kda import chain

    return install_into(monkeypatch, chain, STANDINS)
