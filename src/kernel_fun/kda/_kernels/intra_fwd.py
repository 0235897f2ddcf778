"""KDA intra-chunk forward: the two score matrices of a chunk, in one kernel.

Drop-in for the first two stages of fla 0.6.0's ``chunk_kda_fwd_intra``
(``chunk_kda_fwd_intra_token_parallel`` then ``chunk_kda_fwd_kernel_inter_solve_fused``, in
``fla/ops/kda/``), i.e. that function without its closing ``recompute_w_u_fwd``. Per chunk of
BT = 64 tokens and value head, with ``E_ijc = exp2(g_ic - g_jc)`` (``g`` the chunk-local log2
gate cumsum)::

    Aqk_ij = scale * sum_c q_ic k_jc E_ijc                    j <= i   (zero above)
    L_ij   = beta_i * sum_c k_ic k_jc E_ijc                   j <  i
    Akk    = (I + L)^-1                                       (unit lower triangular)

Why one kernel: fla's pair reads q, k and the fp32 gate twice and round-trips the diagonal
blocks through an fp32 buffer (3.14 ms at B=16, T=8192, H=HV=16, K=128 on the H200, where the
bytes take about 1 ms).

Design (one program = one chunk x one value head, all of K in one tile):

* The gate factor is split at an anchor row ``a`` with ``j < a <= i``:
  ``exp2(g_i - g_a) * exp2(g_a - g_j)``, both <= 1 for a decaying gate, so nothing overflows
  and no lower bound on the gate is needed (the same construction as our intra backward).
  Off-diagonal 16x16 blocks (I > J) anchor at the first row of I; inside a diagonal block the
  pairs are split by the highest bit where i and j differ, one masked dot per bit level.
* The inverse is block forward substitution over the 4 sub-chunks: each diagonal block by
  row-wise forward substitution in fp32 (as fla's solve), then
  ``X_IJ = -X_II sum_{J <= M < I} L_IM X_MJ``.
* Dots of gated fp32 operands use ``DOT_PRECISION`` (tf32 by default, as fla's off-diagonal
  blocks; fla's token-parallel diagonal blocks are exact fp32, hence ``DIAG_PRECISION``,
  tf32x3 by default); the solve's dots use ``SOLVE_PRECISION`` (ieee: exact fp32).

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
from kernel_fun.kda._kernels import bit_level, chunk_indices_for, chunk_program, launch

install_interpreter_shims()


def _alloc(size, dtype=None, device=None):
    """Output allocation (tests swap in a NaN-filled one to catch unwritten elements)."""
    return torch.empty(size, dtype=dtype, device=device)


def configs():
    """Every configuration the autotuner may pick (the interpreter runs only the first).
    BKC: the K slice (16 to 64; past 16 on 4 warps ptxas spills)."""
    return [triton.Config({"BKC": c}, num_warps=w, num_stages=s)
            for c, w, s in [(16, 4, 1), (32, 4, 1), (16, 8, 1), (32, 8, 1), (64, 8, 1)]]


@triton.jit
def _load_rows(x, I, n_valid, o_r, o_k, m_k, ROW: tl.constexpr):
    """Sub-chunk I's rows of x over one K slice, [16, BKC] fp32 (zero past the end)."""
    r = I * 16 + o_r
    return tl.load(x + r[:, None] * ROW + o_k[None, :], mask=(r < n_valid)[:, None] & m_k[None, :],
                   other=0.).to(tl.float32)


@triton.jit
def _rows(k, g, I, n_valid, o_r, o_k, m_k, HK: tl.constexpr, HVK: tl.constexpr):
    """Sub-chunk I's k and g over one K slice, [16, BKC] fp32."""
    return _load_rows(k, I, n_valid, o_r, o_k, m_k, HK), _load_rows(g, I, n_valid, o_r, o_k, m_k, HVK)


@triton.jit
def _wb_rows(k, g, I, b_b, m, o_r, o_k, m_k, HK: tl.constexpr, HVK: tl.constexpr, DT: tl.constexpr):
    """w's right operand for sub-chunk I over one K slice: beta k exp2(g) in the input dtype."""
    r = I * 16 + o_r
    m2 = m[:, None] & m_k[None, :]
    b_k = tl.load(k + r[:, None] * HK + o_k[None, :], mask=m2, other=0.).to(tl.float32)
    b_g = tl.load(g + r[:, None] * HVK + o_k[None, :], mask=m2, other=0.).to(tl.float32)
    return (b_k * tl.exp2(b_g) * b_b[:, None]).to(DT)


@triton.jit
def _diag_block(g, I, n_valid, b_x, b_k, b_g, m, o_r, o_k, m_k, HVK: tl.constexpr, WITH_DIAG: tl.constexpr,
                DIAG_PRECISION: tl.constexpr):
    """Inside sub-chunk I, over one K slice: sum_c x_i k_j E_ij for j < i (and j == i when
    WITH_DIAG), [16, 16] fp32, zero elsewhere."""
    NEG_INF: tl.constexpr = float("-inf")
    lvl = bit_level(o_r)
    lower = o_r[:, None] > o_r[None, :]
    acc = tl.zeros([16, 16], dtype=tl.float32)
    for lv in range(0, 4):
        r_a = I * 16 + (((o_r >> lv) << lv) | (1 << lv))  # the row's anchor at this level
        m_a = r_a < n_valid
        g_a = tl.load(g + r_a[:, None] * HVK + o_k[None, :], mask=m_a[:, None] & m_k[None, :], other=0.).to(tl.float32)
        is_row = ((o_r >> lv) & 1) == 1
        sgn = tl.where(is_row, 1., -1.)  # row side: exp2(g - g_a); column side: exp2(g_a - g)
        f = tl.exp2(tl.where((m & m_a)[:, None], (b_g - g_a) * sgn[:, None], NEG_INF))
        acc += tl.where((lvl == lv) & lower, tl.dot(b_x * f, tl.trans(b_k * f), input_precision=DIAG_PRECISION), 0.)
    if WITH_DIAG:
        b_d = tl.sum(b_x * b_k, axis=1)  # i == j: exp2(0) = 1
        acc += tl.where(o_r[:, None] == o_r[None, :], b_d[:, None], 0.)
    return acc


@triton.jit
def _off_block(g, I, n_valid, b_xI, b_gI, mI, b_kJ, b_gJ, o_k, m_k, HVK: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Sub-chunk I's rows against an earlier sub-chunk J's over one K slice (all of J valid
    when I has a valid row), anchored at I's first row: sum_c x_i k_j E_ij [16, 16] fp32. When
    I has no valid row both factors are 0: no exponent of unrelated rows, no inf * 0 that the
    solve would carry as NaN."""
    NEG_INF: tl.constexpr = float("-inf")
    live = I * 16 < n_valid
    g0 = tl.load(g + (I * 16) * HVK + o_k, mask=m_k & live, other=0.).to(tl.float32)
    fI = tl.exp2(tl.where(mI[:, None], b_gI - g0[None, :], NEG_INF))
    b_kJt = tl.trans(b_kJ * tl.exp2(tl.where(live, g0[None, :] - b_gJ, NEG_INF)))
    return tl.dot(b_xI * fI, b_kJt, input_precision=DOT_PRECISION)


@triton.jit
def _score_pass(x, k, g, qg, kg, n_valid, o_r, m0, m1, m2, m3, HX: tl.constexpr, HK: tl.constexpr,
                HVK: tl.constexpr, K: tl.constexpr, BKC: tl.constexpr, NKC: tl.constexpr, IS_Q: tl.constexpr,
                STORE_QG: tl.constexpr, STORE_KG: tl.constexpr, DOT_PRECISION: tl.constexpr,
                DIAG_PRECISION: tl.constexpr):
    """The ten lower [16, 16] blocks (row block, column block) of sum_c x_ic k_jc E_ijc over
    all of K, slice by slice: x = q (IS_Q: the diagonal included) or x = k (strictly lower).
    On the way, optionally, qg = q exp2(g) and kg = k exp2(g_last - g)."""
    NEG_INF: tl.constexpr = float("-inf")
    zero = tl.zeros([16, 16], dtype=tl.float32)
    s00, s11, s22, s33, s10, s20, s21, s30, s31, s32 = zero, zero, zero, zero, zero, zero, zero, zero, zero, zero
    for kc in range(0, NKC):
        o_k = kc * BKC + tl.arange(0, BKC)
        m_k = o_k < K
        k0, g0 = _rows(k, g, 0, n_valid, o_r, o_k, m_k, HK, HVK)
        k1, g1 = _rows(k, g, 1, n_valid, o_r, o_k, m_k, HK, HVK)
        k2, g2 = _rows(k, g, 2, n_valid, o_r, o_k, m_k, HK, HVK)
        k3, g3 = _rows(k, g, 3, n_valid, o_r, o_k, m_k, HK, HVK)
        if IS_Q:
            x0 = _load_rows(x, 0, n_valid, o_r, o_k, m_k, HX)
            x1 = _load_rows(x, 1, n_valid, o_r, o_k, m_k, HX)
            x2 = _load_rows(x, 2, n_valid, o_r, o_k, m_k, HX)
            x3 = _load_rows(x, 3, n_valid, o_r, o_k, m_k, HX)
        else:
            x0, x1, x2, x3 = k0, k1, k2, k3
        s00 += _diag_block(g, 0, n_valid, x0, k0, g0, m0, o_r, o_k, m_k, HVK, IS_Q, DIAG_PRECISION)
        s11 += _diag_block(g, 1, n_valid, x1, k1, g1, m1, o_r, o_k, m_k, HVK, IS_Q, DIAG_PRECISION)
        s22 += _diag_block(g, 2, n_valid, x2, k2, g2, m2, o_r, o_k, m_k, HVK, IS_Q, DIAG_PRECISION)
        s33 += _diag_block(g, 3, n_valid, x3, k3, g3, m3, o_r, o_k, m_k, HVK, IS_Q, DIAG_PRECISION)
        s10 += _off_block(g, 1, n_valid, x1, g1, m1, k0, g0, o_k, m_k, HVK, DOT_PRECISION)
        s20 += _off_block(g, 2, n_valid, x2, g2, m2, k0, g0, o_k, m_k, HVK, DOT_PRECISION)
        s21 += _off_block(g, 2, n_valid, x2, g2, m2, k1, g1, o_k, m_k, HVK, DOT_PRECISION)
        s30 += _off_block(g, 3, n_valid, x3, g3, m3, k0, g0, o_k, m_k, HVK, DOT_PRECISION)
        s31 += _off_block(g, 3, n_valid, x3, g3, m3, k1, g1, o_k, m_k, HVK, DOT_PRECISION)
        s32 += _off_block(g, 3, n_valid, x3, g3, m3, k2, g2, o_k, m_k, HVK, DOT_PRECISION)
        if STORE_QG:  # x is q
            _gated_rows(qg, 0, x0 * tl.exp2(g0), n_valid, o_r, o_k, m_k, HVK)
            _gated_rows(qg, 1, x1 * tl.exp2(g1), n_valid, o_r, o_k, m_k, HVK)
            _gated_rows(qg, 2, x2 * tl.exp2(g2), n_valid, o_r, o_k, m_k, HVK)
            _gated_rows(qg, 3, x3 * tl.exp2(g3), n_valid, o_r, o_k, m_k, HVK)
        if STORE_KG:
            gl = tl.load(g + (n_valid - 1) * HVK + o_k, mask=m_k, other=0.).to(tl.float32)[None, :]
            _gated_rows(kg, 0, k0 * tl.exp2(tl.where(m0[:, None], gl - g0, NEG_INF)), n_valid, o_r, o_k, m_k, HVK)
            _gated_rows(kg, 1, k1 * tl.exp2(tl.where(m1[:, None], gl - g1, NEG_INF)), n_valid, o_r, o_k, m_k, HVK)
            _gated_rows(kg, 2, k2 * tl.exp2(tl.where(m2[:, None], gl - g2, NEG_INF)), n_valid, o_r, o_k, m_k, HVK)
            _gated_rows(kg, 3, k3 * tl.exp2(tl.where(m3[:, None], gl - g3, NEG_INF)), n_valid, o_r, o_k, m_k, HVK)
    return s00, s11, s22, s33, s10, s20, s21, s30, s31, s32


@triton.jit
def _sub_row(N, X, i, o_r, eye):
    """One forward-substitution step: row i of X becomes e_i - sum_j N_ij X_j."""
    n_i = tl.sum(tl.where(o_r[:, None] == i, N, 0.), axis=0)  # row i of N, [16] over j
    row = tl.sum(n_i[:, None] * X, axis=0)  # sum_j N_ij X_j, [16]
    return tl.where(o_r[:, None] == i, eye - row[None, :], X)


@triton.jit
def _inv_unit_lower4(N0, N1, N2, N3, o_r):
    """(I + N)^-1 for four strictly lower [16, 16] N at once, by forward substitution in fp32:
    the four chains of 15 dependent steps are interleaved (independent work per step)."""
    eye = (o_r[:, None] == o_r[None, :]).to(tl.float32)
    X0 = eye
    X1 = eye
    X2 = eye
    X3 = eye
    for i in range(1, 16):
        X0 = _sub_row(N0, X0, i, o_r, eye)
        X1 = _sub_row(N1, X1, i, o_r, eye)
        X2 = _sub_row(N2, X2, i, o_r, eye)
        X3 = _sub_row(N3, X3, i, o_r, eye)
    return X0, X1, X2, X3


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


@triton.jit
def _gated_rows(p, I, x, n_valid, o_r, o_k, m_k, HVK: tl.constexpr):
    r = I * 16 + o_r
    tl.store(p + r[:, None] * HVK + o_k[None, :], x.to(p.dtype.element_ty), mask=(r < n_valid)[:, None] & m_k[None, :])


@triton.autotune(configs=autotune_configs(configs()), **autotune_cache(),
                 key=["H", "HV", "K", "V", "BT", "IS_VARLEN", "DOT_PRECISION", "DIAG_PRECISION", "SOLVE_PRECISION",
                      "WY", "STORE_QG"])
@triton.jit(do_not_specialize=["T"])
def _intra_fwd_kernel(
    q, k, g, beta, Aqk, Akk, v, w, u, qg, kg, cu_seqlens, chunk_indices, scale, T,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    IS_VARLEN: tl.constexpr, DOT_PRECISION: tl.constexpr, DIAG_PRECISION: tl.constexpr,
    SOLVE_PRECISION: tl.constexpr, WY: tl.constexpr = False, STORE_QG: tl.constexpr = False,
    V: tl.constexpr = 64, BV: tl.constexpr = 64, BKC: tl.constexpr = 32,
):
    # BK: K padded to a power of two; BKC: the K slice the scores and w are built over (a
    # slice's q, k, g tiles of the four sub-chunks are live at once: the whole K would spill).
    tl.static_assert(BT == 64, "chunk size 64: four 16-row sub-chunks")
    _, i_hv, i_h, _, t0, n_valid = chunk_program(cu_seqlens, chunk_indices, T, H, HV, BT, IS_VARLEN)
    HK: tl.constexpr = H * K
    HVK: tl.constexpr = HV * K
    HVBT: tl.constexpr = HV * BT
    NKC: tl.constexpr = (BK + BKC - 1) // BKC
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
    m0 = o_r < n_valid
    m1 = 16 + o_r < n_valid
    m2 = 32 + o_r < n_valid
    m3 = 48 + o_r < n_valid
    b0 = tl.load(beta + o_r * HV, mask=m0, other=0.).to(tl.float32)
    b1 = tl.load(beta + (16 + o_r) * HV, mask=m1, other=0.).to(tl.float32)
    b2 = tl.load(beta + (32 + o_r) * HV, mask=m2, other=0.).to(tl.float32)
    b3 = tl.load(beta + (48 + o_r) * HV, mask=m3, other=0.).to(tl.float32)

    # scores over all of K, one matrix at a time (each pass holds ten [16, 16] accumulators and
    # one K slice of the four sub-chunks' tiles): a_IJ (q-k, scaled at the store), l_IJ (k-k)
    a00, a11, a22, a33, a10, a20, a21, a30, a31, a32 = _score_pass(
        q, k, g, qg, kg, n_valid, o_r, m0, m1, m2, m3, HK, HK, HVK, K, BKC, NKC, True, WY and STORE_QG, False,
        DOT_PRECISION, DIAG_PRECISION)
    # Aqk rows, zeros above the diagonal
    _store_block(Aqk, 0, 0, a00 * scale, n_valid, o_r, HVBT)
    _store_block(Aqk, 0, 1, zero, n_valid, o_r, HVBT)
    _store_block(Aqk, 0, 2, zero, n_valid, o_r, HVBT)
    _store_block(Aqk, 0, 3, zero, n_valid, o_r, HVBT)
    _store_block(Aqk, 1, 0, a10 * scale, n_valid, o_r, HVBT)
    _store_block(Aqk, 1, 1, a11 * scale, n_valid, o_r, HVBT)
    _store_block(Aqk, 1, 2, zero, n_valid, o_r, HVBT)
    _store_block(Aqk, 1, 3, zero, n_valid, o_r, HVBT)
    _store_block(Aqk, 2, 0, a20 * scale, n_valid, o_r, HVBT)
    _store_block(Aqk, 2, 1, a21 * scale, n_valid, o_r, HVBT)
    _store_block(Aqk, 2, 2, a22 * scale, n_valid, o_r, HVBT)
    _store_block(Aqk, 2, 3, zero, n_valid, o_r, HVBT)
    _store_block(Aqk, 3, 0, a30 * scale, n_valid, o_r, HVBT)
    _store_block(Aqk, 3, 1, a31 * scale, n_valid, o_r, HVBT)
    _store_block(Aqk, 3, 2, a32 * scale, n_valid, o_r, HVBT)
    _store_block(Aqk, 3, 3, a33 * scale, n_valid, o_r, HVBT)

    l00, l11, l22, l33, l10, l20, l21, l30, l31, l32 = _score_pass(
        k, k, g, qg, kg, n_valid, o_r, m0, m1, m2, m3, HK, HK, HVK, K, BKC, NKC, False, False, WY,
        DOT_PRECISION, DIAG_PRECISION)
    l00 *= b0[:, None]
    l11 *= b1[:, None]
    l22 *= b2[:, None]
    l33 *= b3[:, None]
    l10 *= b1[:, None]
    l20 *= b2[:, None]
    l21 *= b2[:, None]
    l30 *= b3[:, None]
    l31 *= b3[:, None]
    l32 *= b3[:, None]

    # Akk = (I + L)^-1 by block forward substitution
    x00, x11, x22, x33 = _inv_unit_lower4(l00, l11, l22, l33, o_r)
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


def _run(q, k, gk, beta, scale, cu_seqlens, chunk_indices, chunk_size, dot_precision, diag_precision, config,
         v=None, store_qg=False):
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
    if cu_seqlens is not None and B != 1:
        raise ValueError("intra_fwd: varlen (cu_seqlens) needs B == 1")
    if chunk_indices is None and cu_seqlens is not None:
        chunk_indices = chunk_indices_for(cu_seqlens, BT)
    NT = triton.cdiv(T, BT) if cu_seqlens is None else len(chunk_indices)
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
    fp32 = k.dtype == torch.float32
    launch(_intra_fwd_kernel, (NT, B * HV), config,
           q, k, gk, beta, Aqk, Akk, *ptrs, cu_seqlens, chunk_indices, float(scale), T,
           H=H, HV=HV, K=K, BT=BT, BK=max(16, triton.next_power_of_2(K)), IS_VARLEN=cu_seqlens is not None,
           DOT_PRECISION="ieee" if fp32 else dot_precision, DIAG_PRECISION="ieee" if fp32 else diag_precision,
           SOLVE_PRECISION="ieee", **wy)
    record_launch("kda.intra_fwd")
    return outs


def intra_fwd(q, k, gk, beta, scale, cu_seqlens=None, chunk_indices=None, chunk_size: int = 64,
              dot_precision: str = "tf32", diag_precision: str = "tf32x3", config=None):
    """The forward's intra-chunk scores: ``(Aqk, Akk)``, what fla's ``chunk_kda_fwd_intra``
    returns besides w, u, qg, kg (same layout and dtype).

    Args:
        q, k: ``[B, T, H, K]`` (after the l2norm when the op has it); gk ``[B, T, HV, K]`` fp32,
        the chunk-local log2 gate cumsum; beta ``[B, T, HV]``; scale: float.
        cu_seqlens / chunk_indices: varlen as in fla (``B == 1``).
        dot_precision / diag_precision: ``tl.dot`` input precision of the gated products off /
        on the diagonal blocks. config: a ``triton.Config`` from ``configs()`` (tests).
    """
    return _run(q, k, gk, beta, scale, cu_seqlens, chunk_indices, chunk_size, dot_precision, diag_precision, config)


def chunk_fwd_intra(q, k, v, gk, beta, scale, cu_seqlens=None, chunk_size: int = 64, chunk_indices=None,
                    disable_recompute: bool = False, safe_gate: bool = False, lower_bound=None,
                    use_graph: bool = False, dot_precision: str = "tf32", diag_precision: str = "tf32x3",
                    config=None):
    """Drop-in for fla 0.6.0's ``chunk_kda_fwd_intra``, whole: the scores and, from the same
    registers, what its closing ``recompute_w_u_fwd`` makes. Returns
    ``(w, u, qg, kg, Aqk, Akk)``: w, kg (and qg when ``disable_recompute``, else None)
    ``[B, T, HV, K]`` in k's dtype, u like v, Aqk and Akk as ``intra_fwd``.

    safe_gate / lower_bound select another gate scheme in fla (routed to fla by the op) and
    use_graph fla's static buffers: not supported here (raise)."""
    if safe_gate or lower_bound is not None or use_graph:
        raise NotImplementedError("kernel_fun chunk_fwd_intra: safe_gate, lower_bound and use_graph are fla's")
    return _run(q, k, gk, beta, scale, cu_seqlens, chunk_indices, chunk_size, dot_precision, diag_precision, config,
                v=v, store_qg=disable_recompute)
