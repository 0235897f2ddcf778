"""KDA intra-chunk forward: the two score matrices of a chunk and the solve, in one kernel.

``intra_fwd`` replaces the first two stages of fla 0.6.0's ``chunk_kda_fwd_intra``
(``chunk_kda_fwd_intra_token_parallel`` then ``chunk_kda_fwd_kernel_inter_solve_fused``, in
``fla/ops/kda/``); ``chunk_fwd_intra`` the whole function, its closing ``recompute_w_u_fwd``
included (w, u, qg, kg from the same program). Per chunk of BT = 64 tokens and value head,
with ``E_ijc = exp2(g_ic - g_jc)`` (``g`` the chunk-local log2 gate cumsum)::

    Aqk_ij = scale * sum_c q_ic k_jc E_ijc                    j <= i   (zero above)
    L_ij   = beta_i * sum_c k_ic k_jc E_ijc                   j <  i
    Akk    = (I + L)^-1                                       (unit lower triangular)

Why one kernel: fla's pair reads q, k and the fp32 gate twice and round-trips the diagonal
blocks through an fp32 buffer (3.14 ms at B=16, T=8192, H=HV=16, K=128 on the H200, where the
bytes take about 1 ms).

Design (one program = one chunk x one value head; K in slices of BKC):

* Scores (``_scores``): the gate factor of a pair is split at an anchor row. Pairs inside
  aligned row blocks of 64, 32 or 16 rows share the block's first row as anchor where the
  chunk's gate allows (``FAST_RANGE``): one masked [64, BKC] x [BKC, 64] product per matrix.
  The pairs across blocks are split by the highest bit where i and j differ, anchored so that
  both factors are <= 1 for a decaying gate (no bound needed, the construction of our intra
  backward): one product per level.
* The inverse: each diagonal 16x16 block by recursive doubling (``_inv_unit_lower``), then
  block forward substitution over the 4 sub-chunks, ``X_IJ = -X_II sum_{J <= M < I} L_IM X_MJ``.
* Dots of gated fp32 operands use ``DOT_PRECISION`` across sub-chunks (tf32 by default, as
  fla's off-diagonal blocks) and ``DIAG_PRECISION`` inside them (fla's token-parallel diagonal
  blocks are exact fp32; tf32x3 by default); the solve's dots use ``SOLVE_PRECISION`` (ieee:
  exact fp32 by default).
* Measured slower than fla's (README, kda): a candidate stage of ``kda.chain``.

Outputs in k's dtype: Aqk and Akk ``[B, T, HV, BT]``, each row's 64 entries written (zeros
above the diagonal), rows past a sequence's end not written (with packed documents, the
padding rows after ``cu_seqlens[-1]``: fla zero-fills its Akk there; no stage reads them).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernel_fun._common.tuning import autotune_cache, autotune_configs, install_interpreter_shims
from kernel_fun._common.witness import record_launch
from kernel_fun.kda._kernels import bit_level, chunk_grid, chunk_program, launch

install_interpreter_shims()


def _alloc(size, dtype=None, device=None):
    """Output allocation (tests swap in a NaN-filled one to catch unwritten elements)."""
    return torch.empty(size, dtype=dtype, device=device)


# ``_scores`` anchors aligned row blocks (64, 32 or 16 rows) at their first row where the
# chunk's gate stays within this many log2 units of the anchors in every channel: the factors
# are then within 2^-FAST_RANGE..2^FAST_RANGE. Not more than 60: an operand q exp2(g - g_b)
# under 2^-126 is flushed to zero on the GPU, and the term it stood for is then at most
# 2^(FAST_RANGE - 126) |k| (2^-66 here; 2^-6 at the 120 first built, a real loss). Past it,
# the bit levels (no bound needed) take the pairs.
FAST_RANGE = 60.0


def configs():
    """Every configuration the autotuner may pick (the interpreter runs only the first).
    BKC: the K slice the scores are built over (16 to 64)."""
    return [triton.Config({"BKC": c}, num_warps=w, num_stages=s)
            for c, w, s in [(32, 8, 1), (16, 8, 1), (32, 4, 1), (16, 4, 1), (64, 8, 1)]]


@triton.jit
def _wb_rows(k, g, I, b_b, m, o_r, o_k, m_k, HK: tl.constexpr, HVK: tl.constexpr, DT: tl.constexpr):
    """w's right operand for sub-chunk I over one K slice: beta k exp2(g) in the input dtype."""
    r = I * 16 + o_r
    m2 = m[:, None] & m_k[None, :]
    b_k = tl.load(k + r[:, None] * HK + o_k[None, :], mask=m2, other=0.).to(tl.float32)
    b_g = tl.load(g + r[:, None] * HVK + o_k[None, :], mask=m2, other=0.).to(tl.float32)
    return (b_k * tl.exp2(b_g) * b_b[:, None]).to(DT)


@triton.jit
def _scores(q, k, g, n_valid, HK: tl.constexpr, HVK: tl.constexpr, K: tl.constexpr, BKC: tl.constexpr,
            NKC: tl.constexpr, DOT_PRECISION: tl.constexpr, DIAG_PRECISION: tl.constexpr, FAST_RANGE: tl.constexpr):
    """The chunk's two [64, 64] fp32 score matrices over all of K, slice by slice:
    (sum_c q_ic k_jc E_ijc for j <= i, sum_c k_ic k_jc E_ijc for j < i), zero elsewhere.

    Every pair i > j is taken at the level of the highest bit where i and j differ (0..5).

    * Blocks (levels below L): rows are grouped in aligned blocks of 2^L, each anchored at its
      first row b: E_ijc = exp2(g_ic - g_bc) * exp2(g_bc - g_jc) for the pairs inside a block.
      This is exact whatever the gate, and safe while every |g_ic - g_bc| is at most
      FAST_RANGE (log2, 60): both factors within [2^-FAST_RANGE, 2^FAST_RANGE], no overflow,
      and an operand flushed from the denormals stands for a term under 2^-66. One masked [64, BKC] x [BKC, 64] product per matrix (DIAG_PRECISION) for all
      of them. L is the largest of 6, 5, 4 for which this chunk's gate allows it (measured in a
      first pass), else 0.
    * Levels L..5: at level lv a row's anchor ``a`` is its index with the bits below lv cleared
      and bit lv set, so that j < a <= i and both factors exp2(g_i - g_a), exp2(g_a - g_j) are
      at most 1 for a decaying gate: no bound needed. One product per level and matrix:
      DIAG_PRECISION inside a 16-row sub-chunk (levels 0..3), DOT_PRECISION across (4, 5).

    The diagonal i == j of the q-k matrix is element-wise (exp2(0) = 1)."""
    NEG_INF: tl.constexpr = float("-inf")
    o_t = tl.arange(0, 64)
    m_t = o_t < n_valid
    x_rc = o_t[:, None] ^ o_t[None, :]
    lower = o_t[:, None] > o_t[None, :]
    # the gate's spread from the block anchors, for blocks of 64, 32 and 16 rows: element-wise
    # maxima over the K slices, reduced once (a first pass over g; L1/L2-resident after)
    s6 = tl.zeros([64, BKC], dtype=tl.float32)
    s5 = tl.zeros([64, BKC], dtype=tl.float32)
    s4 = tl.zeros([64, BKC], dtype=tl.float32)
    for kc in range(0, NKC):
        o_k = kc * BKC + tl.arange(0, BKC)
        m_k = o_k < K
        m2 = m_t[:, None] & m_k[None, :]
        b_g = tl.load(g + o_t[:, None] * HVK + o_k[None, :], mask=m2, other=0.).to(tl.float32)
        g_6 = tl.load(g + o_k, mask=m_k, other=0.).to(tl.float32)[None, :]
        g_5 = tl.load(g + ((o_t >> 5) << 5)[:, None] * HVK + o_k[None, :], mask=m2, other=0.).to(tl.float32)
        g_4 = tl.load(g + ((o_t >> 4) << 4)[:, None] * HVK + o_k[None, :], mask=m2, other=0.).to(tl.float32)
        s6 = tl.maximum(s6, tl.where(m2, tl.abs(b_g - g_6), 0.))
        s5 = tl.maximum(s5, tl.abs(b_g - g_5))
        s4 = tl.maximum(s4, tl.abs(b_g - g_4))
    fits6 = tl.max(tl.max(s6, axis=1), axis=0) <= FAST_RANGE
    fits5 = tl.max(tl.max(s5, axis=1), axis=0) <= FAST_RANGE
    fits4 = tl.max(tl.max(s4, axis=1), axis=0) <= FAST_RANGE
    L = tl.where(fits6, 6, tl.where(fits5, 5, tl.where(fits4, 4, 0)))
    r_b = (o_t >> L) << L  # each row's block anchor
    in_block = ((x_rc >> L) == 0) & lower
    acc_q = tl.zeros([64, 64], dtype=tl.float32)
    acc_k = tl.zeros([64, 64], dtype=tl.float32)
    d_q = tl.zeros([64], dtype=tl.float32)
    for kc in range(0, NKC):
        o_k = kc * BKC + tl.arange(0, BKC)
        m_k = o_k < K
        m2 = m_t[:, None] & m_k[None, :]
        b_q = tl.load(q + o_t[:, None] * HK + o_k[None, :], mask=m2, other=0.).to(tl.float32)
        b_k = tl.load(k + o_t[:, None] * HK + o_k[None, :], mask=m2, other=0.).to(tl.float32)
        b_g = tl.load(g + o_t[:, None] * HVK + o_k[None, :], mask=m2, other=0.).to(tl.float32)
        d_q += tl.sum(b_q * b_k, axis=1)  # i == j: exp2(0) = 1
        if L > 0:
            g_b = tl.load(g + r_b[:, None] * HVK + o_k[None, :], mask=m2, other=0.).to(tl.float32)
            e_row = tl.exp2(tl.where(m_t[:, None], b_g - g_b, NEG_INF))
            b_kct = tl.trans(b_k * tl.exp2(tl.where(m_t[:, None], g_b - b_g, NEG_INF)))
            acc_q += tl.where(in_block, tl.dot(b_q * e_row, b_kct, input_precision=DIAG_PRECISION), 0.)
            acc_k += tl.where(in_block, tl.dot(b_k * e_row, b_kct, input_precision=DIAG_PRECISION), 0.)
        for lv in range(L, 6):
            r_a = ((o_t >> lv) << lv) | (1 << lv)
            m_a = r_a < n_valid
            g_a = tl.load(g + r_a[:, None] * HVK + o_k[None, :], mask=m_a[:, None] & m_k[None, :],
                          other=0.).to(tl.float32)
            sgn = tl.where(((o_t >> lv) & 1) == 1, 1., -1.)  # row side: exp2(g - g_a); column side: exp2(g_a - g)
            f = tl.exp2(tl.where((m_t & m_a)[:, None], (b_g - g_a) * sgn[:, None], NEG_INF))
            b_kf = b_k * f
            b_kft = tl.trans(b_kf)
            # the pairs of this level, row side (bit lv set) below the column side
            sel = ((x_rc >> lv) == 1) & (((o_t >> lv) & 1) == 1)[:, None]
            if lv < 4:
                p_q = tl.dot(b_q * f, b_kft, input_precision=DIAG_PRECISION)
                p_k = tl.dot(b_kf, b_kft, input_precision=DIAG_PRECISION)
            else:
                p_q = tl.dot(b_q * f, b_kft, input_precision=DOT_PRECISION)
                p_k = tl.dot(b_kf, b_kft, input_precision=DOT_PRECISION)
            acc_q += tl.where(sel, p_q, 0.)
            acc_k += tl.where(sel, p_k, 0.)
    acc_q += tl.where(o_t[:, None] == o_t[None, :], d_q[:, None], 0.)
    return acc_q, acc_k


@triton.jit
def _quarters(x, R: tl.constexpr, C: tl.constexpr):
    """The four quarters of an [R, C] register tile: (top left, top right, bottom left,
    bottom right), by a reshape, a permute and splits (no reductions)."""
    t = tl.permute(tl.reshape(x, [2, R // 2, 2, C // 2]), [1, 3, 2, 0])  # [R/2, C/2, col half, row half]
    top, bottom = tl.split(t)
    tl_, tr = tl.split(top)
    bl, br = tl.split(bottom)
    return tl_, tr, bl, br


@triton.jit
def _inv_unit_lower(N, o_r, P: tl.constexpr):
    """(I + N)^-1 for a strictly lower [16, 16] N by recursive doubling: with Y the inverse of
    the block diagonal of 2^lv-blocks and N_lv the part of N between the two halves of each
    2^(lv+1)-block (the pairs of bit level lv), the 2^(lv+1)-block inverse is Y - Y N_lv Y
    (exactly: Y N_lv is nilpotent of order 2). Four levels, two [16, 16] products each, no
    cross-row reductions (the forward substitution's 15 dependent steps each needed two)."""
    lvl = bit_level(o_r)
    X = (o_r[:, None] == o_r[None, :]).to(tl.float32)
    for lv in tl.static_range(0, 4):
        N_lv = tl.where(lvl == lv, N, 0.)
        X -= tl.dot(X, tl.dot(N_lv, X, input_precision=P), input_precision=P)
    return X


@triton.jit
def _store_block(p, I, J, blk, n_valid, o_r, HVBT: tl.constexpr):
    r = I * 16 + o_r
    tl.store(p + r[:, None] * HVBT + (J * 16 + o_r)[None, :], blk.to(p.dtype.element_ty), mask=(r < n_valid)[:, None])


@triton.jit
def _wy_rows(p, I, x0, x1, x2, x3, t0_, t1_, t2_, t3_, n_valid, o_r, o_c, m_c, ROW: tl.constexpr,
             N_TERMS: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Rows of sub-chunk I of X @ T (X = Akk's block row I, T = the per-sub-chunk right
    operands [16, C]): sum over J <= I of x_IJ t_J, stored to ``p`` (row stride ROW)."""
    acc = tl.dot(x0, t0_, input_precision=DOT_PRECISION)
    if N_TERMS > 1:
        acc = tl.dot(x1, t1_, acc, input_precision=DOT_PRECISION)
    if N_TERMS > 2:
        acc = tl.dot(x2, t2_, acc, input_precision=DOT_PRECISION)
    if N_TERMS > 3:
        acc = tl.dot(x3, t3_, acc, input_precision=DOT_PRECISION)
    r = I * 16 + o_r
    tl.store(p + r[:, None] * ROW + o_c[None, :], acc.to(p.dtype.element_ty), mask=(r < n_valid)[:, None] & m_c[None, :])


@triton.autotune(configs=autotune_configs(configs()), **autotune_cache(),
                 key=["H", "HV", "K", "V", "BT", "IS_VARLEN", "DOT_PRECISION", "DIAG_PRECISION", "SOLVE_PRECISION",
                      "WY", "STORE_QG", "FAST_RANGE"])
@triton.jit(do_not_specialize=["T"])
def _intra_fwd_kernel(
    q, k, g, beta, Aqk, Akk, v, w, u, qg, kg, cu_seqlens, chunk_indices, scale, T,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    IS_VARLEN: tl.constexpr, DOT_PRECISION: tl.constexpr, DIAG_PRECISION: tl.constexpr,
    SOLVE_PRECISION: tl.constexpr, WY: tl.constexpr = False, STORE_QG: tl.constexpr = False,
    V: tl.constexpr = 64, BV: tl.constexpr = 64, BKC: tl.constexpr = 32, FAST_RANGE: tl.constexpr = 60.0,
):
    # BK: K padded to a power of two; BKC: the K slice the scores and w are built over (the
    # whole K in registers would spill).
    tl.static_assert(BT == 64, "chunk size 64: four 16-row sub-chunks")
    _, i_hv, i_h, _, t0, n_valid = chunk_program(cu_seqlens, chunk_indices, T, H, HV, BT, IS_VARLEN)
    HK: tl.constexpr = H * K
    HVK: tl.constexpr = HV * K
    HVBT: tl.constexpr = HV * BT
    NKC: tl.constexpr = (BK + BKC - 1) // BKC
    NEG_INF: tl.constexpr = float("-inf")
    DT: tl.constexpr = Akk.dtype.element_ty
    q += t0 * HK + i_h * K
    k += t0 * HK + i_h * K
    g += t0 * HVK + i_hv * K
    beta += t0 * HV + i_hv
    Aqk += t0 * HVBT + i_hv * BT
    Akk += t0 * HVBT + i_hv * BT
    if WY:
        kg += t0 * HVK + i_hv * K
        if STORE_QG:
            qg += t0 * HVK + i_hv * K
    o_r = tl.arange(0, 16)
    zero = tl.zeros([16, 16], dtype=tl.float32)

    # scores over all of K: Aqk (scaled at the store, zeros above the diagonal) and L = beta k-k
    s_q, s_k = _scores(q, k, g, n_valid, HK, HVK, K, BKC, NKC, DOT_PRECISION, DIAG_PRECISION, FAST_RANGE)
    o_t = tl.arange(0, 64)
    tl.store(Aqk + o_t[:, None] * HVBT + o_t[None, :], (s_q * scale).to(Aqk.dtype.element_ty),
             mask=(o_t < n_valid)[:, None])
    b_t = tl.load(beta + o_t * HV, mask=o_t < n_valid, other=0.).to(tl.float32)
    s_k *= b_t[:, None]
    q_tl, _, q_bl, q_br = _quarters(s_k, 64, 64)
    l00, _, l10, l11 = _quarters(q_tl, 32, 32)
    l20, l21, l30, l31 = _quarters(q_bl, 32, 32)
    l22, _, l32, l33 = _quarters(q_br, 32, 32)
    if WY:
        # The element-wise part of what fla's recompute_w_u_fwd makes: qg = q exp2(g),
        # kg = k exp2(g_last - g) (a pass over K of their own: the score loop stays small).
        m_t = o_t < n_valid
        for kc in range(0, NKC):
            o_k = kc * BKC + tl.arange(0, BKC)
            m_k = o_k < K
            m_tk = m_t[:, None] & m_k[None, :]
            b_g = tl.load(g + o_t[:, None] * HVK + o_k[None, :], mask=m_tk, other=0.).to(tl.float32)
            if STORE_QG:
                b_q = tl.load(q + o_t[:, None] * HK + o_k[None, :], mask=m_tk, other=0.).to(tl.float32)
                tl.store(qg + o_t[:, None] * HVK + o_k[None, :], (b_q * tl.exp2(b_g)).to(qg.dtype.element_ty),
                         mask=m_tk)
            b_k = tl.load(k + o_t[:, None] * HK + o_k[None, :], mask=m_tk, other=0.).to(tl.float32)
            gl = tl.load(g + (n_valid - 1) * HVK + o_k, mask=m_k, other=0.).to(tl.float32)
            tl.store(kg + o_t[:, None] * HVK + o_k[None, :],
                     (b_k * tl.exp2(tl.where(m_t[:, None], gl[None, :] - b_g, NEG_INF))).to(kg.dtype.element_ty),
                     mask=m_tk)

    # Akk = (I + L)^-1 by block forward substitution
    x00 = _inv_unit_lower(l00, o_r, SOLVE_PRECISION)
    x11 = _inv_unit_lower(l11, o_r, SOLVE_PRECISION)
    x22 = _inv_unit_lower(l22, o_r, SOLVE_PRECISION)
    x33 = _inv_unit_lower(l33, o_r, SOLVE_PRECISION)
    x10 = -tl.dot(x11, tl.dot(l10, x00, input_precision=SOLVE_PRECISION), input_precision=SOLVE_PRECISION)
    x21 = -tl.dot(x22, tl.dot(l21, x11, input_precision=SOLVE_PRECISION), input_precision=SOLVE_PRECISION)
    x20 = -tl.dot(x22, tl.dot(l20, x00, input_precision=SOLVE_PRECISION)
                  + tl.dot(l21, x10, input_precision=SOLVE_PRECISION), input_precision=SOLVE_PRECISION)
    x32 = -tl.dot(x33, tl.dot(l32, x22, input_precision=SOLVE_PRECISION), input_precision=SOLVE_PRECISION)
    x31 = -tl.dot(x33, tl.dot(l31, x11, input_precision=SOLVE_PRECISION)
                  + tl.dot(l32, x21, input_precision=SOLVE_PRECISION), input_precision=SOLVE_PRECISION)
    x30 = -tl.dot(x33, tl.dot(l30, x00, input_precision=SOLVE_PRECISION)
                  + tl.dot(l31, x10, input_precision=SOLVE_PRECISION)
                  + tl.dot(l32, x20, input_precision=SOLVE_PRECISION), input_precision=SOLVE_PRECISION)
    _store_block(Akk, 0, 0, x00, n_valid, o_r, HVBT)
    _store_block(Akk, 0, 1, zero, n_valid, o_r, HVBT)
    _store_block(Akk, 0, 2, zero, n_valid, o_r, HVBT)
    _store_block(Akk, 0, 3, zero, n_valid, o_r, HVBT)
    _store_block(Akk, 1, 0, x10, n_valid, o_r, HVBT)
    _store_block(Akk, 1, 1, x11, n_valid, o_r, HVBT)
    _store_block(Akk, 1, 2, zero, n_valid, o_r, HVBT)
    _store_block(Akk, 1, 3, zero, n_valid, o_r, HVBT)
    _store_block(Akk, 2, 0, x20, n_valid, o_r, HVBT)
    _store_block(Akk, 2, 1, x21, n_valid, o_r, HVBT)
    _store_block(Akk, 2, 2, x22, n_valid, o_r, HVBT)
    _store_block(Akk, 2, 3, zero, n_valid, o_r, HVBT)
    _store_block(Akk, 3, 0, x30, n_valid, o_r, HVBT)
    _store_block(Akk, 3, 1, x31, n_valid, o_r, HVBT)
    _store_block(Akk, 3, 2, x32, n_valid, o_r, HVBT)
    _store_block(Akk, 3, 3, x33, n_valid, o_r, HVBT)

    if WY:
        # The rest of what fla's recompute_w_u_fwd makes from Akk: w = Akk (beta k exp2(g)),
        # u = Akk (beta v). Akk and the right operands are rounded to the input dtype first, as
        # fla's pass reads them (Akk as stored): the backward recomputes w and u from the
        # stored Akk, so the forward's agree with it. k and g are read a second time here, slice
        # by slice (L2-resident: this program read them a moment ago).
        w += t0 * HVK + i_hv * K
        m0 = o_r < n_valid
        m1 = 16 + o_r < n_valid
        m2 = 32 + o_r < n_valid
        m3 = 48 + o_r < n_valid
        b0 = tl.load(beta + o_r * HV, mask=m0, other=0.).to(tl.float32)
        b1 = tl.load(beta + (16 + o_r) * HV, mask=m1, other=0.).to(tl.float32)
        b2 = tl.load(beta + (32 + o_r) * HV, mask=m2, other=0.).to(tl.float32)
        b3 = tl.load(beta + (48 + o_r) * HV, mask=m3, other=0.).to(tl.float32)
        r00, r10, r11, r20, r21, r22 = x00.to(DT), x10.to(DT), x11.to(DT), x20.to(DT), x21.to(DT), x22.to(DT)
        r30, r31, r32, r33 = x30.to(DT), x31.to(DT), x32.to(DT), x33.to(DT)
        for kc in range(0, NKC):
            o_k = kc * BKC + tl.arange(0, BKC)
            m_k = o_k < K
            kb0 = _wb_rows(k, g, 0, b0, m0, o_r, o_k, m_k, HK, HVK, DT)
            kb1 = _wb_rows(k, g, 1, b1, m1, o_r, o_k, m_k, HK, HVK, DT)
            kb2 = _wb_rows(k, g, 2, b2, m2, o_r, o_k, m_k, HK, HVK, DT)
            kb3 = _wb_rows(k, g, 3, b3, m3, o_r, o_k, m_k, HK, HVK, DT)
            _wy_rows(w, 0, r00, r00, r00, r00, kb0, kb0, kb0, kb0, n_valid, o_r, o_k, m_k, HVK, 1, DOT_PRECISION)
            _wy_rows(w, 1, r10, r11, r11, r11, kb0, kb1, kb1, kb1, n_valid, o_r, o_k, m_k, HVK, 2, DOT_PRECISION)
            _wy_rows(w, 2, r20, r21, r22, r22, kb0, kb1, kb2, kb2, n_valid, o_r, o_k, m_k, HVK, 3, DOT_PRECISION)
            _wy_rows(w, 3, r30, r31, r32, r33, kb0, kb1, kb2, kb3, n_valid, o_r, o_k, m_k, HVK, 4, DOT_PRECISION)
        HVV: tl.constexpr = HV * V
        v += t0 * HVV + i_hv * V
        u += t0 * HVV + i_hv * V
        for i_v in range(0, tl.cdiv(V, BV)):
            o_v = i_v * BV + tl.arange(0, BV)
            m_v = o_v < V
            vb0 = (tl.load(v + (0 * 16 + o_r)[:, None] * HVV + o_v[None, :], mask=m0[:, None] & m_v[None, :],
                           other=0.).to(tl.float32) * b0[:, None]).to(DT)
            vb1 = (tl.load(v + (1 * 16 + o_r)[:, None] * HVV + o_v[None, :], mask=m1[:, None] & m_v[None, :],
                           other=0.).to(tl.float32) * b1[:, None]).to(DT)
            vb2 = (tl.load(v + (2 * 16 + o_r)[:, None] * HVV + o_v[None, :], mask=m2[:, None] & m_v[None, :],
                           other=0.).to(tl.float32) * b2[:, None]).to(DT)
            vb3 = (tl.load(v + (3 * 16 + o_r)[:, None] * HVV + o_v[None, :], mask=m3[:, None] & m_v[None, :],
                           other=0.).to(tl.float32) * b3[:, None]).to(DT)
            _wy_rows(u, 0, r00, r00, r00, r00, vb0, vb0, vb0, vb0, n_valid, o_r, o_v, m_v, HVV, 1, DOT_PRECISION)
            _wy_rows(u, 1, r10, r11, r11, r11, vb0, vb1, vb1, vb1, n_valid, o_r, o_v, m_v, HVV, 2, DOT_PRECISION)
            _wy_rows(u, 2, r20, r21, r22, r22, vb0, vb1, vb2, vb2, n_valid, o_r, o_v, m_v, HVV, 3, DOT_PRECISION)
            _wy_rows(u, 3, r30, r31, r32, r33, vb0, vb1, vb2, vb3, n_valid, o_r, o_v, m_v, HVV, 4, DOT_PRECISION)


def _run(q, k, gk, beta, scale, cu_seqlens, chunk_indices, chunk_size, precisions, config, v=None,
         store_qg=False, fast_range=None):
    """Check, allocate and launch: ``(Aqk, Akk)``, and with ``v`` the WY pieces before them,
    ``(w, u, qg, kg, Aqk, Akk)`` (qg None unless ``store_qg``)."""
    B, T, H, K = k.shape
    HV = gk.shape[2]
    BT = chunk_size
    if BT != 64 or K > 128:
        raise ValueError(f"intra_fwd: chunk size 64 and K <= 128 (got {BT}, {K})")
    if (HV % H or tuple(q.shape) != tuple(k.shape) or tuple(gk.shape) != (B, T, HV, K)
            or tuple(beta.shape) != (B, T, HV) or (v is not None and (v.shape[:3] != (B, T, HV)))):
        raise ValueError(f"intra_fwd: shapes q {tuple(q.shape)} k {tuple(k.shape)} gk {tuple(gk.shape)} "
                         f"beta {tuple(beta.shape)} v {None if v is None else tuple(v.shape)} disagree")
    chunk_indices, NT = chunk_grid("intra_fwd", B, T, BT, cu_seqlens, chunk_indices)
    q, k, gk, beta = (x.contiguous() for x in (q, k, gk, beta))
    dev = k.device
    Aqk = _alloc((B, T, HV, BT), k.dtype, dev)
    Akk = _alloc((B, T, HV, BT), k.dtype, dev)
    wy = dict(WY=False)
    outs = (Aqk, Akk)
    ptrs = (Aqk,) * 5  # v, w, u, qg, kg: unused without WY
    if v is not None:
        v = v.contiguous()
        V = v.shape[3]
        w = _alloc((B, T, HV, K), k.dtype, dev)
        kg = _alloc((B, T, HV, K), k.dtype, dev)
        qg = _alloc((B, T, HV, K), k.dtype, dev) if store_qg else None
        u = _alloc(tuple(v.shape), v.dtype, dev)
        outs = (w, u, qg, kg, Aqk, Akk)
        ptrs = (v, w, u, qg if qg is not None else w, kg)
        wy = dict(WY=True, STORE_QG=store_qg, V=V, BV=min(64, max(16, triton.next_power_of_2(V))))
    if NT == 0:
        return outs
    dot_p, diag_p, solve_p = ("ieee",) * 3 if k.dtype == torch.float32 else precisions
    launch(_intra_fwd_kernel, (NT, B * HV), config,
           q, k, gk, beta, Aqk, Akk, *ptrs, cu_seqlens, chunk_indices, float(scale), T,
           H=H, HV=HV, K=K, BT=BT, BK=max(16, triton.next_power_of_2(K)), IS_VARLEN=cu_seqlens is not None,
           DOT_PRECISION=dot_p, DIAG_PRECISION=diag_p, SOLVE_PRECISION=solve_p,
           FAST_RANGE=float(FAST_RANGE if fast_range is None else fast_range), **wy)
    record_launch("kda.intra_fwd")
    return outs


def intra_fwd(q, k, gk, beta, scale, cu_seqlens=None, chunk_indices=None, chunk_size: int = 64,
              dot_precision: str = "tf32", diag_precision: str = "tf32x3", solve_precision: str = "ieee",
              config=None, fast_range=None):
    """The forward's intra-chunk scores: ``(Aqk, Akk)``, what fla's ``chunk_kda_fwd_intra``
    returns besides w, u, qg, kg (same layout and dtype).

    Args:
        q, k: ``[B, T, H, K]`` (after the l2norm when the op has it); gk ``[B, T, HV, K]`` fp32,
        the chunk-local log2 gate cumsum; beta ``[B, T, HV]``; scale: float.
        cu_seqlens / chunk_indices: varlen as in fla (``B == 1``).
        dot_precision / diag_precision: ``tl.dot`` input precision of the gated products across
        / inside the 16-row sub-chunks; solve_precision: of the inverse's 16x16 products (ieee:
        fp32 on the FMA units; tf32x3 / tf32 on the tensor cores). fp32 inputs run all in ieee.
        config: a ``triton.Config`` from ``configs()`` (tests). fast_range: the gate spread
        (log2) up to which a chunk takes the one-anchor path (default ``FAST_RANGE``; a negative
        value never does: tests).
    """
    return _run(q, k, gk, beta, scale, cu_seqlens, chunk_indices, chunk_size,
                (dot_precision, diag_precision, solve_precision), config, fast_range=fast_range)


def chunk_fwd_intra(q, k, v, gk, beta, scale, cu_seqlens=None, chunk_size: int = 64, chunk_indices=None,
                    disable_recompute: bool = False, safe_gate: bool = False, lower_bound=None,
                    use_graph: bool = False, dot_precision: str = "tf32", diag_precision: str = "tf32x3",
                    solve_precision: str = "ieee", config=None, fast_range=None):
    """Drop-in for fla 0.6.0's ``chunk_kda_fwd_intra``, whole: the scores and, from the same
    registers, what its closing ``recompute_w_u_fwd`` makes. Returns
    ``(w, u, qg, kg, Aqk, Akk)``: w, kg (and qg when ``disable_recompute``, else None)
    ``[B, T, HV, K]`` in k's dtype, u like v, Aqk and Akk as ``intra_fwd``.

    safe_gate / lower_bound select another gate scheme in fla (routed to fla by the op) and
    use_graph fla's static buffers: not supported here (raise). The precisions as in
    ``intra_fwd``."""
    if safe_gate or lower_bound is not None or use_graph:
        raise NotImplementedError("kernel_fun chunk_fwd_intra: safe_gate, lower_bound and use_graph are fla's")
    return _run(q, k, gk, beta, scale, cu_seqlens, chunk_indices, chunk_size,
                (dot_precision, diag_precision, solve_precision), config, v=v, store_qg=disable_recompute,
                fast_range=fast_range)
