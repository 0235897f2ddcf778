"""GDN's gated intra-chunk scores, for the backward state scan to make dv from.

    Aqk[t, j] = scale * (q_t . k_j) * exp2(G_t - G_j)   for j <= t within the chunk, else 0

``[B, T, HV, BT]`` in q's dtype (G: the chunk-local cumulative log2 gate of the value head).
With it, ``_delta``'s backward state scan forms the intra-chunk dv = Aqk^T do per chunk on the
do tile it loads anyway (its ``A=`` path), in place of fla's ``chunk_bwd_dv_local``, which reads
q, k, g, do and writes dv (4 tensors of 2X bytes at the main shape, against q, k in and Aqk out:
X + X + X/2 at V = 128).

Grid: one program per (chunk, qk head): one [BT, K] x [K, BT] product, then one gated [BT, BT]
tile per value head of the group (G = HV / H), the group's gates loaded with q and k. At the model
A/B's layer (B=4 T=4096 H=16 HV=32 K=128; 201 MB, 47 us at the copy rate): 58 us, where one program
per value head, each re-reading q, k and forming the product again, took 76 us
(``bench/records/2026-12-03-h200-stages-gdn-inputs-scores-*.json``).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernel_fun._common.tuning import (  # noqa: F401  (config_name: every kernel module names its configs)
    alloc, autotune_cache, autotune_configs, cdiv, chunk_work, config_name, install_interpreter_shims, launch,
    next_pow2)
from kernel_fun._common.witness import record_launch
from kernel_fun._delta.chunking import chunk_program


install_interpreter_shims()

# The first is the interpreter's. sm_90a (Triton 3.6, H=16 K=128, 2026-12-03), registers at HV=32 |
# HV=16: w4 105 | 80, w8 67 | 48, w2 165 | 109; no stack; 32 KB of shared memory.
CONFIGS = [triton.Config({}, num_warps=nw, num_stages=ns) for nw, ns in [(4, 2), (4, 3), (8, 2), (2, 2)]]
CANDIDATES: list = []


@triton.jit(do_not_specialize=["T"])
def gated_scores_kernel(
    q,  # [B, T, H, K]
    k,  # [B, T, H, K]
    g,  # [B, T, HV] fp32
    A,  # [B, T, HV, BT]
    cu_seqlens,
    chunk_indices,
    scale,
    T,
    WORK,  # autotune key only: tuning.chunk_work(chunks x qk heads)
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, KP: tl.constexpr, GP: tl.constexpr,
    IS_VARLEN: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    # one program per (chunk, qk head): chunk_program over H heads, i_h the qk head
    _, i_h, _, _, row0, n_valid = chunk_program(cu_seqlens, chunk_indices, T, H, H, BT, IS_VARLEN)
    G: tl.constexpr = HV // H
    o_i = tl.arange(0, BT)
    m_t = o_i < n_valid
    o_k = tl.arange(0, KP)
    m_k = o_k < K
    b_q = tl.load(q + (row0 * H + i_h) * K + o_i[:, None] * (H * K) + o_k[None, :],
                  mask=m_t[:, None] & m_k[None, :], other=0.0)
    b_kt = tl.load(k + (row0 * H + i_h) * K + o_i[None, :] * (H * K) + o_k[:, None],
                   mask=m_k[:, None] & m_t[None, :], other=0.0)  # k^T loaded transposed
    # the group's gates [BT, GP] in one load (a row's value heads are adjacent), before any store
    o_g = tl.arange(0, GP)
    b_g2 = tl.load(g + (row0 + o_i[:, None]) * HV + i_h * G + o_g[None, :],
                   mask=m_t[:, None] & (o_g < G)[None, :], other=0.0).to(tl.float32)
    b_a = tl.dot(b_q, b_kt, input_precision=DOT_PRECISION) * scale
    m_c = (o_i[:, None] >= o_i[None, :]) & m_t[:, None] & m_t[None, :]
    for j in range(G):  # the group's value heads: one gated tile each
        b_g = tl.sum(tl.where(o_g[None, :] == j, b_g2, 0.0), 1)
        # the factor formed under the mask before it multiplies (exp2 overflows above the diagonal)
        b_ag = tl.where(m_c, b_a * tl.exp2(tl.where(m_c, b_g[:, None] - b_g[None, :], 0.0)), 0.0)
        tl.store(A + (row0 * HV + i_h * G + j) * BT + o_i[:, None] * (HV * BT) + o_i[None, :],
                 b_ag.to(A.dtype.element_ty), mask=m_t[:, None])


def group_pad(G: int) -> int:
    """GP: a group's G value heads padded to a power of two (at least 2), the gate tile's width."""
    return max(2, next_pow2(G))


gated_scores_kernel_tuned = triton.autotune(
    configs=autotune_configs(CONFIGS), **autotune_cache(), key=["H", "HV", "K", "BT", "IS_VARLEN", "WORK"],
)(gated_scores_kernel)


def gated_scores(q, k, g, scale, cu_seqlens=None, chunk_indices=None, chunk_size: int = 64,
                 *, config: triton.Config | None = None):
    """``Aqk [B, T, HV, BT]`` (q's dtype, zero above the diagonal and past a sequence's end
    within its last chunk) from q, k ``[B, T, H, K]`` and g ``[B, T, HV]`` fp32 (chunk-local
    cumulative log2 gate)."""
    B, T, H, K = q.shape
    HV = g.shape[2]
    BT = chunk_size
    if tuple(k.shape) != tuple(q.shape) or tuple(g.shape[:2]) != (B, T) or HV % H:
        raise ValueError(f"gated_scores: q {tuple(q.shape)} k {tuple(k.shape)} g {tuple(g.shape)}")
    is_varlen = cu_seqlens is not None
    NT = len(chunk_indices) if is_varlen else cdiv(T, BT)
    q, k, g = q.contiguous(), k.contiguous(), g.contiguous()
    A = alloc((B, T, HV, BT), dtype=q.dtype, device=q.device)
    args = dict(q=q, k=k, g=g, A=A, cu_seqlens=cu_seqlens if is_varlen else A,
                chunk_indices=chunk_indices if is_varlen else A, scale=float(scale), T=T,
                WORK=chunk_work(B, T, BT, H), H=H, HV=HV, K=K,
                BT=BT, KP=max(16, next_pow2(K)), GP=group_pad(HV // H), IS_VARLEN=is_varlen,
                DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32")
    grid = (NT, B * H)
    launch(gated_scores_kernel_tuned, grid, config, **args)
    record_launch("gdn.gated_scores")
    return A
