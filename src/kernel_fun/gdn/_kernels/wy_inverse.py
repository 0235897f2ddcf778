"""GDN's WY inverse: the chunk's gated, beta-scaled K K^T and its triangular inverse, in one pass.

    L = StrictLower(diag(beta) (K K^T * Gamma)),   Gamma[i, j] = exp2(G_i - G_j)
    A = (I + L)^-1                                  [B, T, HV, BT] in k's dtype

(G: the chunk-local cumulative log2 gate of the value head; beta activated.) The forward and the
recompute scans make v_new from A, v and beta, and the backward scan dv2^T w from A and beta, so
A is the only thing the forward's intra stage writes.

One program per (chunk, qk head) (fla's kernel runs one per (chunk, value head)): the ten
[16, 16] blocks of K K^T on and below the diagonal are formed once and serve the group's G = HV / H
value heads, which differ only in gate and beta. Per value head, the four diagonal blocks are
inverted by forward substitution in one loop (fla runs four loops, one block after the other),
each step on all four blocks: four independent dependency chains a step. A step needs row i of L
indexed by the rows of the inverse (to weigh them) and adds a row indexed by its columns; the
program holds each diagonal block twice, L and L^T (K K^T is symmetric, so L^T is the same product
gated the other way), so that row i of L comes out of L^T already indexed by rows, the weighted
sum over rows comes out indexed by columns, and no step converts a layout (fla's converts one
vector a step through shared memory). The off-diagonal blocks of the inverse follow by the block
recurrence X_ij = -X_ii sum_{j<=m<i} L_im X_mj, in tf32 (as fla's). The six blocks above the
diagonal are written as zeros (3 KB more a chunk and value head: 8 KB of A written instead of 5,
about 25 MB a layer at B=4 T=4096 HV=32), so that its readers (the three scans, ``wy_dv_bwd``) load
it masked by rows only: under the triangular mask Triton 3.6 read the tile the pipeliner copied
into shared memory back to registers, masked it and wrote it to shared memory again, once a chunk,
on each scan's dependent chain, and split each load into 2-byte accesses.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernel_fun._common.tuning import (  # noqa: F401  (config_name: every kernel module names its configs)
    alloc, autotune_cache, autotune_configs, chunk_work, config_name, install_interpreter_shims, launch)
from kernel_fun._common.witness import record_launch
from kernel_fun._delta.chunking import chunk_grid, chunk_program


install_interpreter_shims()

# The first is the interpreter's. BK: the K slice a step of the K K^T products loads. One warp: a
# [16, 16] tile is one warp's, and more warps repeat it (H200, B=4 T=4096 H=16 HV=32, ms: BK64 w1
# 0.106, BK32 w1 0.111, BK64 w2 0.188, BK32 w2 0.200, BK64 w4 0.373, BK32 w4 0.382;
# bench/records/2026-12-04-h200-gdn-wy-inverse-configs-unroll.json). sm_90a (Triton 3.6): 189 registers
# at HV=16, 255 at HV=32 (the group loop keeps K K^T live), no stack.
CONFIGS = [triton.Config({"BK": bk}, num_warps=nw, num_stages=2) for bk, nw in [(64, 1), (32, 1), (64, 2)]]
CANDIDATES: list = []


@triton.jit
def _gated(b_kk, b_g_r, b_g_c, b_b, m_r, m_c, MASK_LOWER: tl.constexpr, LOWER: tl.constexpr):
    """A [16, 16] block of L (rows r, columns c): beta_r kk exp2(G_r - G_c) where the rows and
    columns are valid (and, on the diagonal, below it), else 0; the exponent is formed under the
    mask (above the diagonal, or past the sequence, it can overflow). ``LOWER`` False gives the
    diagonal block's transpose from the same symmetric kk: beta_c kk exp2(G_c - G_r) above it."""
    o = tl.arange(0, 16)
    m = m_r[:, None] & m_c[None, :]
    if MASK_LOWER:
        if LOWER:
            m = m & (o[:, None] > o[None, :])
        else:
            m = m & (o[:, None] < o[None, :])
    if LOWER:
        d = b_g_r[:, None] - b_g_c[None, :]
        s = b_b[:, None]
    else:
        d = b_g_c[None, :] - b_g_r[:, None]
        s = b_b[None, :]
    return tl.where(m, b_kk * s * tl.exp2(tl.where(m, d, 0.0)), 0.0)


@triton.jit
def _substitution_step(b_x, b_lt, i):
    """Row i of the strictly lower inverse: X[i, :] += sum_j (-L[i, j]) X[j, :] (X starts as -L,
    rows j < i already final). b_lt is L^T, so its column i is L's row i indexed by rows."""
    o = tl.arange(0, 16)
    b_a = -tl.sum(tl.where(o[None, :] == i, b_lt, 0.0), 1)
    b_s = tl.sum(b_a[:, None] * b_x, 0)
    return b_x + tl.where(o[:, None] == i, b_s[None, :], 0.0)


@triton.jit
def _store(A, b_x, row, col, n_valid, HV: tl.constexpr, BT: tl.constexpr):
    """Block (row, col) of the chunk's A (A already points at the chunk's first row of this head)."""
    o = tl.arange(0, 16)
    tl.store(A + (row * 16 + o)[:, None] * (HV * BT) + (col * 16 + o)[None, :], b_x.to(A.dtype.element_ty),
             mask=((row * 16 + o) < n_valid)[:, None])


@triton.jit(do_not_specialize=["T"])
def wy_inverse_kernel(
    k,  # [B, T, H, K]
    g,  # [B, T, HV] fp32, chunk-local cumulative log2 gate
    beta,  # [B, T, HV], activated
    A,  # [B, T, HV, BT] out
    cu_seqlens,
    chunk_indices,
    T,
    WORK,  # autotune key only: tuning.chunk_work(chunks x qk heads)
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    IS_VARLEN: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    tl.static_assert(BT == 64)
    _, i_h, _, _, row0, n_valid = chunk_program(cu_seqlens, chunk_indices, T, H, H, BT, IS_VARLEN)
    G: tl.constexpr = HV // H
    o = tl.arange(0, 16)
    m0 = o < n_valid
    m1 = (16 + o) < n_valid
    m2 = (32 + o) < n_valid
    m3 = (48 + o) < n_valid
    # the ten [16, 16] blocks of K K^T on and below the diagonal (block rows 0..3), fp32
    kk00 = tl.zeros([16, 16], dtype=tl.float32)
    kk11 = tl.zeros([16, 16], dtype=tl.float32)
    kk22 = tl.zeros([16, 16], dtype=tl.float32)
    kk33 = tl.zeros([16, 16], dtype=tl.float32)
    kk10 = tl.zeros([16, 16], dtype=tl.float32)
    kk20 = tl.zeros([16, 16], dtype=tl.float32)
    kk21 = tl.zeros([16, 16], dtype=tl.float32)
    kk30 = tl.zeros([16, 16], dtype=tl.float32)
    kk31 = tl.zeros([16, 16], dtype=tl.float32)
    kk32 = tl.zeros([16, 16], dtype=tl.float32)
    p_k = k + (row0 * H + i_h) * K + o[:, None] * (H * K)
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = (o_k < K)[None, :]
        b_k0 = tl.load(p_k + o_k[None, :], mask=m0[:, None] & m_k, other=0.0)
        b_k1 = tl.load(p_k + 16 * H * K + o_k[None, :], mask=m1[:, None] & m_k, other=0.0)
        b_k2 = tl.load(p_k + 32 * H * K + o_k[None, :], mask=m2[:, None] & m_k, other=0.0)
        b_k3 = tl.load(p_k + 48 * H * K + o_k[None, :], mask=m3[:, None] & m_k, other=0.0)
        b_t0 = tl.trans(b_k0)
        b_t1 = tl.trans(b_k1)
        b_t2 = tl.trans(b_k2)
        kk00 = tl.dot(b_k0, b_t0, kk00, input_precision=DOT_PRECISION)
        kk11 = tl.dot(b_k1, b_t1, kk11, input_precision=DOT_PRECISION)
        kk22 = tl.dot(b_k2, b_t2, kk22, input_precision=DOT_PRECISION)
        kk33 = tl.dot(b_k3, tl.trans(b_k3), kk33, input_precision=DOT_PRECISION)
        kk10 = tl.dot(b_k1, b_t0, kk10, input_precision=DOT_PRECISION)
        kk20 = tl.dot(b_k2, b_t0, kk20, input_precision=DOT_PRECISION)
        kk21 = tl.dot(b_k2, b_t1, kk21, input_precision=DOT_PRECISION)
        kk30 = tl.dot(b_k3, b_t0, kk30, input_precision=DOT_PRECISION)
        kk31 = tl.dot(b_k3, b_t1, kk31, input_precision=DOT_PRECISION)
        kk32 = tl.dot(b_k3, b_t2, kk32, input_precision=DOT_PRECISION)
    eye = (o[:, None] == o[None, :]).to(tl.float32)
    for j in range(G):  # the group's value heads: gate, beta, inverse, store
        i_v = i_h * G + j
        p_gb = (row0 + o) * HV + i_v
        g0 = tl.load(g + p_gb, mask=m0, other=0.0).to(tl.float32)
        g1 = tl.load(g + p_gb + 16 * HV, mask=m1, other=0.0).to(tl.float32)
        g2 = tl.load(g + p_gb + 32 * HV, mask=m2, other=0.0).to(tl.float32)
        g3 = tl.load(g + p_gb + 48 * HV, mask=m3, other=0.0).to(tl.float32)
        b0 = tl.load(beta + p_gb, mask=m0, other=0.0).to(tl.float32)
        b1 = tl.load(beta + p_gb + 16 * HV, mask=m1, other=0.0).to(tl.float32)
        b2 = tl.load(beta + p_gb + 32 * HV, mask=m2, other=0.0).to(tl.float32)
        b3 = tl.load(beta + p_gb + 48 * HV, mask=m3, other=0.0).to(tl.float32)
        # the diagonal blocks: X starts as -L, and L^T for the substitution's rows
        x0 = -_gated(kk00, g0, g0, b0, m0, m0, True, True)
        x1 = -_gated(kk11, g1, g1, b1, m1, m1, True, True)
        x2 = -_gated(kk22, g2, g2, b2, m2, m2, True, True)
        x3 = -_gated(kk33, g3, g3, b3, m3, m3, True, True)
        t0 = _gated(kk00, g0, g0, b0, m0, m0, True, False)
        t1 = _gated(kk11, g1, g1, b1, m1, m1, True, False)
        t2 = _gated(kk22, g2, g2, b2, m2, m2, True, False)
        t3 = _gated(kk33, g3, g3, b3, m3, m3, True, False)
        for i in range(2, 16):  # rows 0 and 1 of -L are final already
            x0 = _substitution_step(x0, t0, i)
            x1 = _substitution_step(x1, t1, i)
            x2 = _substitution_step(x2, t2, i)
            x3 = _substitution_step(x3, t3, i)
        x0 += eye
        x1 += eye
        x2 += eye
        x3 += eye
        l10 = _gated(kk10, g1, g0, b1, m1, m0, False, True)
        l20 = _gated(kk20, g2, g0, b2, m2, m0, False, True)
        l21 = _gated(kk21, g2, g1, b2, m2, m1, False, True)
        l30 = _gated(kk30, g3, g0, b3, m3, m0, False, True)
        l31 = _gated(kk31, g3, g1, b3, m3, m1, False, True)
        l32 = _gated(kk32, g3, g2, b3, m3, m2, False, True)
        # block rows of the inverse, first off-diagonal, then further out (each needs the ones nearer)
        x10 = -tl.dot(x1, tl.dot(l10, x0, input_precision=DOT_PRECISION), input_precision=DOT_PRECISION)
        x21 = -tl.dot(x2, tl.dot(l21, x1, input_precision=DOT_PRECISION), input_precision=DOT_PRECISION)
        x32 = -tl.dot(x3, tl.dot(l32, x2, input_precision=DOT_PRECISION), input_precision=DOT_PRECISION)
        x20 = -tl.dot(x2, tl.dot(l20, x0, input_precision=DOT_PRECISION)
                      + tl.dot(l21, x10, input_precision=DOT_PRECISION), input_precision=DOT_PRECISION)
        x31 = -tl.dot(x3, tl.dot(l31, x1, input_precision=DOT_PRECISION)
                      + tl.dot(l32, x21, input_precision=DOT_PRECISION), input_precision=DOT_PRECISION)
        x30 = -tl.dot(x3, tl.dot(l30, x0, input_precision=DOT_PRECISION)
                      + tl.dot(l31, x10, input_precision=DOT_PRECISION)
                      + tl.dot(l32, x20, input_precision=DOT_PRECISION), input_precision=DOT_PRECISION)
        p_a = A + (row0 * HV + i_v) * BT
        _store(p_a, x0, 0, 0, n_valid, HV, BT)
        _store(p_a, x10, 1, 0, n_valid, HV, BT)
        _store(p_a, x1, 1, 1, n_valid, HV, BT)
        _store(p_a, x20, 2, 0, n_valid, HV, BT)
        _store(p_a, x21, 2, 1, n_valid, HV, BT)
        _store(p_a, x2, 2, 2, n_valid, HV, BT)
        _store(p_a, x30, 3, 0, n_valid, HV, BT)
        _store(p_a, x31, 3, 1, n_valid, HV, BT)
        _store(p_a, x32, 3, 2, n_valid, HV, BT)
        _store(p_a, x3, 3, 3, n_valid, HV, BT)
        for r in tl.static_range(3):  # the zeros above the diagonal (the scans read A unmasked)
            for c in tl.static_range(r + 1, 4):
                _store(p_a, tl.zeros([16, 16], dtype=tl.float32), r, c, n_valid, HV, BT)


wy_inverse_kernel_tuned = triton.autotune(
    configs=autotune_configs(CONFIGS), **autotune_cache(), key=["H", "HV", "K", "IS_VARLEN", "WORK"],
)(wy_inverse_kernel)


def wy_inverse(k, g, beta, cu_seqlens=None, chunk_indices=None, chunk_size: int = 64,
               *, config: triton.Config | None = None):
    """``A [B, T, HV, BT]`` (k's dtype; lower triangular, its zeros above the diagonal written: its
    readers mask it by rows only) from k ``[B, T, H, K]``, g
    ``[B, T, HV]`` fp32 (chunk-local cumulative log2 gate) and the activated beta ``[B, T, HV]``."""
    B, T, H, K = k.shape
    HV = g.shape[2]
    BT = chunk_size
    if BT != 64 or tuple(g.shape) != (B, T, HV) or tuple(beta.shape) != (B, T, HV) or HV % H:
        raise ValueError(f"wy_inverse: k {tuple(k.shape)} g {tuple(g.shape)} beta {tuple(beta.shape)} BT={BT}")
    chunk_indices, NT = chunk_grid("gdn.wy_inverse", B, T, BT, cu_seqlens, chunk_indices)
    A = alloc((B, T, HV, BT), dtype=k.dtype, device=k.device)
    varlen = cu_seqlens is not None  # (else A stands in for the two index pointers, never read)
    launch(wy_inverse_kernel_tuned, (NT, B * H), config, k=k.contiguous(), g=g.contiguous(), beta=beta.contiguous(),
           A=A, cu_seqlens=cu_seqlens if varlen else A, chunk_indices=chunk_indices if varlen else A, T=T,
           WORK=chunk_work(B, T, BT, H), H=H,
           HV=HV, K=K, BT=BT, IS_VARLEN=varlen, DOT_PRECISION="ieee" if k.dtype == torch.float32 else "tf32")
    record_launch("gdn.wy_inverse")
    return A
