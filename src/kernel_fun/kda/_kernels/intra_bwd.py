"""KDA intra-chunk backward: the gradients that flow through the two intra-chunk score
matrices, ``Aqk`` (causal q-k scores) and the pre-inverse WY matrix ``L`` (``Akk``).

Drop-in for fla 0.6.0's ``chunk_kda_bwd_intra`` (``fla/ops/kda/chunk_intra.py``): same
arguments, same outputs. The math (``reference_stages.intra_bwd_reference``), per chunk of
BT tokens, per value head, with ``E_ijc = exp2(g_ic - g_jc)`` for ``j <= i``::

    dq_i  += sum_j dAqk_ij k_j E_ij                                   (row side)
    dkr_i  = sum_j dAkk_ij k_j E_ij                                   (row side)
    dkt_j  = sum_i (dAqk_ij q_i + dAkk_ij beta_i k_i) E_ij            (column side)
    dk    += beta * dkr + dkt
    db    += sum_c dkr * k
    dg    += q * dq_intra + (beta * dkr - dkt) * k

Kernel design (one program = one chunk x one value head; all of K, every dA entry of the
chunk read by this program only):

The program walks the chunk's 16-row sub-chunks ``I`` and, for each, the K blocks; it
writes the dq/dk/dg rows of ``I`` per K block and db of ``I`` at the end. Every gated product
is a ``[16, 16] @ [16, BK]`` tensor-core dot with fp32 operands. The gate factor
``exp2(g_i - g_j)`` is split at an anchor row ``a`` with ``j < a <= i`` into
``exp2(g_i - g_a) * exp2(g_a - g_j)``: both factors are <= 1 for a decaying gate, so nothing
overflows however strong the decay, and no lower bound on the gate is needed.

* Diagonal block (pairs inside ``I``): the pairs ``i > j`` are split by the highest bit ``b``
  where ``i`` and ``j`` differ; the anchor is ``i`` with its low ``b`` bits cleared, which
  depends only on the row and the level. Each level is one masked dot, and every row takes
  part in it either as a row (its bit ``b`` set: dq, dkr) or as a column (clear: dkt), so
  one exp2 per element and level serves both sides: the left operand is the symmetric
  ``S_rc = dA[max(r,c), min(r,c)]`` masked to the level. 4 levels: 4 exp2 per element and
  8 dots; the ``i == j`` term is element-wise.
* Row side (``j`` in an earlier sub-chunk ``J``): anchored at the first row of ``I`` (GLA's
  secondary chunking), so one accumulator takes every ``J`` and is scaled once.
* Column side (``i`` in a later sub-chunk ``P``): anchored at the first row of ``P``.

dA is read only on and below the diagonal (fla reads the same entries). Gate factors of rows
past the end of a sequence are exp2(-inf) = 0, so padded rows never meet an exponent.
Loops over sub-chunks, levels and partners are runtime loops: unrolled, ptxas keeps every
tile live at once. (A whole-chunk alternative, one masked M=64 product per bit level, measured
5.9-9.7 ms against this kernel's 4.25 at B=8 on the H200, 2026-11-30, and was deleted.)

Precision: gated operands are fp32; dots use ``DOT_PRECISION`` (tf32 by default, like fla's
own off-diagonal blocks; "ieee"/"tf32x3"/"bf16x3" selectable).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernel_fun._common.tuning import (alloc, autotune_cache, autotune_configs, chunk_work, config_name,  # noqa: F401
                                       install_interpreter_shims, launch)
from kernel_fun._common.witness import record_launch
from kernel_fun._delta.chunking import chunk_grid, chunk_program

install_interpreter_shims()  # runtime-bound loops under TRITON_INTERPRET=1 (see tuning.py)

# With ``fast_range=FAST_RANGE`` (as the chain calls it) a 16-row sub-chunk's
# diagonal block takes one anchor for a K block where, on every channel, the gate's range over
# the block's valid rows is within this many log2 units: the anchor is the middle of that
# range, so both gate factors stay within 2^-FAST_RANGE/2..2^FAST_RANGE/2 (2^+-96 at 192).
# Then a product the GPU flushes to zero (below 2^-126) stood for a term below
# 2^(FAST_RANGE/2 - 126) (2^-30, far under tf32's rounding of the kept ones), and a sum of 16
# products overflows only where a score gradient times a key passes 2^(124 - FAST_RANGE/2)
# (2^28). The block's first row as anchor (factors out to 2^+-120 at a range of 120, as first
# built) could lose terms up to 2^-6 to that flush and overflowed once a score gradient
# times a key passed about 2^4
# (tests/kda/test_stage_kernels.py::test_intra_bwd_one_anchor_stays_in_range_at_the_edge_of_its_spread).
# 192 takes about 75% of the 16-row blocks of `kernel-fun bench`'s gates (randn A_log, dt_bias)
# against 63% at 120 (counted on the CPU). Four dots instead of the bit levels' eight, two exp2
# per element instead of four. Past the range, the bit levels (no bound). The default
# (fast_range None or negative) compiles the bit levels alone, as measured.
FAST_RANGE = 192.0


# What the autotuner may pick (the interpreter runs only the first). ptxas takes every
# register it is allowed (255), which caps a 4-warp CTA at 2 per SM. Its stack (spills;
# sm_90a ahead-of-time compile, triton 3.6, ``tools/sass_stats.py``, which before 2026-11-30
# read LOCAL and missed them): BK=64 on 4 warps none; BK=128 (the only block the fused l2norm
# epilogue takes) 272 bytes; with ``maxnreg`` 168 or 128, 160-664 bytes. Fewest SASS
# instructions per program at K=128 (sm_90a): BK=64/128 on 4 warps.
CONFIGS = [
    triton.Config({"BK": bk, "HOIST_S": hoist}, num_warps=w, num_stages=st, maxnreg=mr)
    for bk, hoist, w, st, mr in [(64, False, 4, 1, None), (64, False, 4, 1, 168), (64, False, 4, 1, 128),
                                 (128, False, 4, 1, None), (32, False, 4, 1, 128), (64, True, 4, 1, 168),
                                 (64, False, 8, 1, 128), (64, False, 4, 2, 168)]
]
# Not yet timed or checked on a GPU (``kernel-fun bench --stages kda`` and the GPU tests force
# them). With the l2norm backward fused (as shipped) the autotuner has one
# configuration, BK=128 on 4 warps, and with the one anchor and gate_monotone ptxas gives it 255
# registers and a 224-byte stack (134 spill instructions; sm_90a, 2026-11-30). The same block on
# 8 warps: 221 registers, no stack, half the instructions per thread, and the same 8 warps per SM
# (one CTA instead of two).
CANDIDATES = [triton.Config({"BK": 128, "HOIST_S": False}, num_warps=8, num_stages=st) for st in (1, 2)]


@triton.jit
def bit_level(o_r):
    """[n, n] for a 16-row block: the highest bit where r and c differ (3..0), -1 on r == c.
    The pairs of one level share an anchor row (the diagonal block's split of the gate factor)."""
    x_rc = o_r[:, None] ^ o_r[None, :]
    return tl.where(x_rc >= 8, 3, tl.where(x_rc >= 4, 2, tl.where(x_rc >= 2, 1, tl.where(x_rc >= 1, 0, -1))))


@triton.jit
def _sym_block(pA, I, o_r, n_valid, HVBT: tl.constexpr, BC: tl.constexpr):
    """[BC, BC] S_rc = dA[I*BC + max(r, c), I*BC + min(r, c)]: the diagonal block of
    sub-chunk I, its lower triangle mirrored onto the upper one."""
    row = I * BC + tl.maximum(o_r[:, None], o_r[None, :])
    col = I * BC + tl.minimum(o_r[:, None], o_r[None, :])
    return tl.load(pA + row * HVBT + col, mask=row < n_valid, other=0.).to(tl.float32)


@triton.jit
def _diag_levels(g, I, n_valid, b_q, b_k, b_bk, b_g, s_qk, s_kk, lvl, m_i, m_k, o_r, o_k, acc_q, acc_r, acc_t,
                 HVK: tl.constexpr, BC: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Sub-chunk I's diagonal block, one K block: one masked dot per bit level, rows and
    columns together (any gate)."""
    NEG_INF: tl.constexpr = float("-inf")
    for lv in range(0, 4):
        r_a = I * BC + (((o_r >> lv) << lv) | (1 << lv))  # the row's anchor at this level
        m_a = r_a < n_valid
        g_a = tl.load(g + r_a[:, None] * HVK + o_k[None, :], mask=m_a[:, None] & m_k, other=0.).to(tl.float32)
        is_row = (((o_r >> lv) & 1) == 1)[:, None]
        sgn = tl.where(is_row, 1., -1.)  # row side: exp2(g - g_a); column side: exp2(g_a - g)
        f = tl.exp2(tl.where((m_i & m_a)[:, None], (b_g - g_a) * sgn, NEG_INF))
        f_row = tl.where(is_row, f, 0.)
        f_col = f - f_row
        rhs1 = b_q * f_row + b_k * f_col
        rhs2 = b_bk * f_row + b_k * f_col
        r1 = tl.dot(tl.where(lvl == lv, s_qk, 0.), rhs1, input_precision=DOT_PRECISION)
        r2 = tl.dot(tl.where(lvl == lv, s_kk, 0.), rhs2, input_precision=DOT_PRECISION)
        acc_q += r1 * f_row
        acc_r += r2 * f_row
        acc_t += (r1 + r2) * f_col
    return acc_q, acc_r, acc_t


@triton.jit
def _diag_one_anchor(b_q, b_k, b_bk, b_g, g_b, s_qk, s_kk, m_i, o_r, acc_q, acc_r, acc_t,
                     DOT_PRECISION: tl.constexpr):
    """Sub-chunk I's diagonal block, one K block, anchored at g_b (per channel): row side
    exp2(g_i - g_b) (dA_lower (k exp2(g_b - g))), column side exp2(g_b - g_j) (dA_lower^T
    (q exp2(g - g_b)) and the same with beta k). Four dots; the caller checked the spread."""
    NEG_INF: tl.constexpr = float("-inf")
    e_row = tl.exp2(tl.where(m_i[:, None], b_g - g_b, NEG_INF))
    e_col = tl.exp2(tl.where(m_i[:, None], g_b - b_g, NEG_INF))
    lo = o_r[:, None] > o_r[None, :]
    up = o_r[:, None] < o_r[None, :]
    b_kc = b_k * e_col
    acc_q += tl.dot(tl.where(lo, s_qk, 0.), b_kc, input_precision=DOT_PRECISION) * e_row  # dA[i, j], j < i
    acc_r += tl.dot(tl.where(lo, s_kk, 0.), b_kc, input_precision=DOT_PRECISION) * e_row
    t = tl.dot(tl.where(up, s_qk, 0.), b_q * e_row, input_precision=DOT_PRECISION)  # dA[i, j] at [j, i]
    t = tl.dot(tl.where(up, s_kk, 0.), b_bk * e_row, t, input_precision=DOT_PRECISION)
    acc_t += t * e_col
    return acc_q, acc_r, acc_t


def _whole_k_prune(configs, named_args, **kwargs):
    """An autotune ``early_config_prune``: with the l2norm backward fused (L2NORM_BWD), only
    configurations whose K block covers all of K (it needs whole rows of dq and dk)."""
    if not kwargs.get("L2NORM_BWD", named_args.get("L2NORM_BWD", False)):
        return configs
    K = kwargs.get("K", named_args.get("K"))
    return [c for c in configs if c.kwargs["BK"] >= K]


@triton.autotune(configs=autotune_configs(CONFIGS), **autotune_cache(),
                 key=["H", "HV", "K", "BT", "IS_VARLEN", "DOT_PRECISION", "L2NORM_BWD", "FAST_RANGE", "GATE_MONOTONE",
                      "WORK"],
                 prune_configs_by={"early_config_prune": _whole_k_prune})
@triton.jit(do_not_specialize=["T"])
def _intra_bwd_kernel(
    q, k, g, beta, dAqk, dAkk,
    dq, dk, db, dg,
    dq_out, dk_out, db_out, dg_out,
    q_rstd, k_rstd,
    cu_seqlens, chunk_indices, T,
    WORK,  # autotune key only: tuning.chunk_work(chunks x value heads)
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BT: tl.constexpr,
    BK: tl.constexpr, HOIST_S: tl.constexpr, IS_VARLEN: tl.constexpr, DOT_PRECISION: tl.constexpr,
    L2NORM_BWD: tl.constexpr = False, FAST_RANGE: tl.constexpr = -1.0, GATE_MONOTONE: tl.constexpr = False,
):
    """One program: one chunk x one value head (``chunk_program``)."""
    _, i_hv, i_h, _, t0, n_valid = chunk_program(cu_seqlens, chunk_indices, T, H, HV, BT, IS_VARLEN)
    BC: tl.constexpr = 16
    NC: tl.constexpr = BT // BC
    NEG_INF: tl.constexpr = float("-inf")  # exp2(-inf) = 0: masked gate factors
    HK: tl.constexpr = H * K
    HVK: tl.constexpr = HV * K
    HVBT: tl.constexpr = HV * BT
    q += t0 * HK + i_h * K
    k += t0 * HK + i_h * K
    g += t0 * HVK + i_hv * K
    beta += t0 * HV + i_hv
    dAqk += t0 * HVBT + i_hv * BT
    dAkk += t0 * HVBT + i_hv * BT
    dq += t0 * HVK + i_hv * K
    dk += t0 * HVK + i_hv * K
    dg += t0 * HVK + i_hv * K
    dq_out += t0 * HVK + i_hv * K
    dk_out += t0 * HVK + i_hv * K
    dg_out += t0 * HVK + i_hv * K
    db += t0 * HV + i_hv
    db_out += t0 * HV + i_hv
    if L2NORM_BWD:  # [B*T*H] fp32, one per (token, head): l2norm_fwd's rstd of q and k
        q_rstd += t0 * H + i_h
        k_rstd += t0 * H + i_h

    o_r = tl.arange(0, BC)
    # level of a pair inside a 16-block: the highest bit where r and c differ (-1 on r == c)
    lvl = bit_level(o_r)

    # one output sub-chunk I (16 rows) at a time: its dq / dk / dg rows for every K block
    for I in range(0, NC):
        if I * BC < n_valid:
            r_i = I * BC + o_r
            m_i = r_i < n_valid
            b_beta = tl.load(beta + r_i * HV, mask=m_i, other=0.).to(tl.float32)
            dqk_d = tl.load(dAqk + r_i * HVBT + r_i, mask=m_i, other=0.).to(tl.float32)[:, None]
            dkk_d = tl.load(dAkk + r_i * HVBT + r_i, mask=m_i, other=0.).to(tl.float32)[:, None]
            if HOIST_S:
                s_qk = _sym_block(dAqk, I, o_r, n_valid, HVBT, BC)
                s_kk = _sym_block(dAkk, I, o_r, n_valid, HVBT, BC)
            b_db = tl.zeros([BC], dtype=tl.float32)
            for i_k in range(0, tl.cdiv(K, BK)):
                o_k = i_k * BK + tl.arange(0, BK)
                m_k = (o_k < K)[None, :]
                m_ik = m_i[:, None] & m_k
                b_q = tl.load(q + r_i[:, None] * HK + o_k[None, :], mask=m_ik, other=0.).to(tl.float32)
                b_k = tl.load(k + r_i[:, None] * HK + o_k[None, :], mask=m_ik, other=0.).to(tl.float32)
                b_g = tl.load(g + r_i[:, None] * HVK + o_k[None, :], mask=m_ik, other=0.).to(tl.float32)
                b_bk = b_k * b_beta[:, None]
                # i == j
                acc_q = dqk_d * b_k
                acc_r = dkk_d * b_k
                acc_t = dqk_d * b_q + dkk_d * b_bk

                # -- the diagonal block: one masked dot per bit level, rows and columns together
                if not HOIST_S:
                    s_qk = _sym_block(dAqk, I, o_r, n_valid, HVBT, BC)
                    s_kk = _sym_block(dAkk, I, o_r, n_valid, HVBT, BC)
                # one anchor, per channel the middle of the gate's range over the block's valid
                # rows, where that range is within FAST_RANGE (log2) on every channel of this
                # tile; else (and with FAST_RANGE < 0, compiled alone) bit levels
                if FAST_RANGE >= 0:
                    if GATE_MONOTONE:  # non-increasing along the chunk: its range is its ends
                        g_hi = tl.load(g + (I * BC) * HVK + o_k, mask=o_k < K, other=0.).to(tl.float32)
                        r_end = tl.minimum(I * BC + BC, n_valid) - 1
                        g_lo = tl.load(g + r_end * HVK + o_k, mask=o_k < K, other=0.).to(tl.float32)
                    else:
                        g_hi = tl.max(tl.where(m_i[:, None], b_g, float("-inf")), axis=0)
                        g_lo = tl.min(tl.where(m_i[:, None], b_g, float("inf")), axis=0)
                    if tl.max(g_hi - g_lo, axis=0) <= FAST_RANGE:
                        g_b = ((g_hi + g_lo) * 0.5)[None, :]
                        acc_q, acc_r, acc_t = _diag_one_anchor(b_q, b_k, b_bk, b_g, g_b, s_qk, s_kk, m_i, o_r,
                                                               acc_q, acc_r, acc_t, DOT_PRECISION)
                    else:
                        acc_q, acc_r, acc_t = _diag_levels(g, I, n_valid, b_q, b_k, b_bk, b_g, s_qk, s_kk, lvl, m_i,
                                                           m_k, o_r, o_k, acc_q, acc_r, acc_t, HVK, BC,
                                                           DOT_PRECISION)
                else:
                    acc_q, acc_r, acc_t = _diag_levels(g, I, n_valid, b_q, b_k, b_bk, b_g, s_qk, s_kk, lvl, m_i, m_k,
                                                       o_r, o_k, acc_q, acc_r, acc_t, HVK, BC, DOT_PRECISION)

                # -- row side, earlier sub-chunks J < I, anchored at row I*BC
                if I > 0:  # runtime
                    g_0 = tl.load(g + (I * BC) * HVK + o_k, mask=o_k < K, other=0.).to(tl.float32)[None, :]
                    rq = tl.zeros([BC, BK], dtype=tl.float32)
                    rr = tl.zeros([BC, BK], dtype=tl.float32)
                    for J in range(0, I):
                        r_j = J * BC + o_r  # all valid: they precede a valid row
                        k_j = tl.load(k + r_j[:, None] * HK + o_k[None, :], mask=m_k, other=0.).to(tl.float32)
                        g_j = tl.load(g + r_j[:, None] * HVK + o_k[None, :], mask=m_k, other=0.).to(tl.float32)
                        rhs = k_j * tl.exp2(g_0 - g_j)
                        off = r_i[:, None] * HVBT + r_j[None, :]
                        x_qk = tl.load(dAqk + off, mask=m_i[:, None], other=0.).to(tl.float32)
                        x_kk = tl.load(dAkk + off, mask=m_i[:, None], other=0.).to(tl.float32)
                        rq = tl.dot(x_qk, rhs, rq, input_precision=DOT_PRECISION)
                        rr = tl.dot(x_kk, rhs, rr, input_precision=DOT_PRECISION)
                    f_i = tl.exp2(tl.where(m_i[:, None], b_g - g_0, NEG_INF))
                    acc_q += rq * f_i
                    acc_r += rr * f_i

                # -- column side, later sub-chunks P > I, anchored at row P*BC
                for P in range(I + 1, NC):
                    if P * BC < n_valid:
                        r_p = P * BC + o_r
                        m_p = r_p < n_valid
                        m_pk = m_p[:, None] & m_k
                        q_p = tl.load(q + r_p[:, None] * HK + o_k[None, :], mask=m_pk, other=0.).to(tl.float32)
                        k_p = tl.load(k + r_p[:, None] * HK + o_k[None, :], mask=m_pk, other=0.).to(tl.float32)
                        g_p = tl.load(g + r_p[:, None] * HVK + o_k[None, :], mask=m_pk, other=0.).to(tl.float32)
                        b_p = tl.load(beta + r_p * HV, mask=m_p, other=0.).to(tl.float32)
                        g_0 = tl.load(g + (P * BC) * HVK + o_k, mask=o_k < K, other=0.).to(tl.float32)[None, :]
                        f_p = tl.exp2(tl.where(m_p[:, None], g_p - g_0, NEG_INF))
                        # [r, c] = dA[P*BC + c, I*BC + r]: the block below, transposed by the load
                        off = r_p[None, :] * HVBT + r_i[:, None]
                        xt_qk = tl.load(dAqk + off, mask=m_p[None, :], other=0.).to(tl.float32)
                        xt_kk = tl.load(dAkk + off, mask=m_p[None, :], other=0.).to(tl.float32)
                        t = tl.dot(xt_qk, q_p * f_p, input_precision=DOT_PRECISION)
                        t = tl.dot(xt_kk, k_p * b_p[:, None] * f_p, t, input_precision=DOT_PRECISION)
                        acc_t += t * tl.exp2(tl.where(m_i[:, None], g_0 - b_g, NEG_INF))

                # -- epilogue for these rows and this K block
                b_db += tl.sum(acc_r * b_k, axis=1)
                acc_r = acc_r * b_beta[:, None]
                o_out = r_i[:, None] * HVK + o_k[None, :]
                b_dqi = tl.load(dq + o_out, mask=m_ik, other=0.).to(tl.float32)
                b_dki = tl.load(dk + o_out, mask=m_ik, other=0.).to(tl.float32)
                b_dgi = tl.load(dg + o_out, mask=m_ik, other=0.).to(tl.float32)
                b_dgf = b_dgi + b_q * acc_q + (acc_r - acc_t) * b_k  # rows past the end are 0
                tl.store(dg_out + o_out, b_dgf.to(dg_out.dtype.element_ty), mask=m_ik)
                b_dqf = b_dqi + acc_q
                b_dkf = b_dki + acc_r + acc_t
                if L2NORM_BWD:
                    # q, k here are the normalized y = x * rstd (whole rows: BK >= K), so the
                    # l2norm backward dx = rstd * (dy - y * sum(dy * y)) happens in registers.
                    b_rq = tl.load(q_rstd + r_i * H, mask=m_i, other=0.).to(tl.float32)[:, None]
                    b_rk = tl.load(k_rstd + r_i * H, mask=m_i, other=0.).to(tl.float32)[:, None]
                    b_dqf = (b_dqf - tl.sum(b_dqf * b_q, axis=1)[:, None] * b_q) * b_rq
                    b_dkf = (b_dkf - tl.sum(b_dkf * b_k, axis=1)[:, None] * b_k) * b_rk
                tl.store(dq_out + o_out, b_dqf.to(dq_out.dtype.element_ty), mask=m_ik)
                tl.store(dk_out + o_out, b_dkf.to(dk_out.dtype.element_ty), mask=m_ik)
            b_dbi = tl.load(db + r_i * HV, mask=m_i, other=0.).to(tl.float32)
            tl.store(db_out + r_i * HV, (b_dbi + b_db).to(db_out.dtype.element_ty), mask=m_i)



# The widest K block the autotuner may pick (the interpreter runs only the first config).
_MAX_BK = max(c.kwargs["BK"] for c in autotune_configs(CONFIGS))


def can_fuse_l2norm(H: int, HV: int, K: int, config=None) -> bool:
    """Whether ``intra_bwd(..., l2norm_rstd=...)`` can run: one q/k head per value head
    (grouped heads are summed after this stage, before the l2norm backward) and a K block
    covering K (the given config's, or one the autotuner may pick)."""
    return H == HV and (config.kwargs["BK"] if config is not None else _MAX_BK) >= K


def intra_bwd(
    q: torch.Tensor,
    k: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    dAqk: torch.Tensor,
    dAkk: torch.Tensor,
    dq: torch.Tensor,
    dk: torch.Tensor,
    db: torch.Tensor,
    dg: torch.Tensor,
    cu_seqlens: torch.LongTensor | None = None,
    chunk_indices: torch.LongTensor | None = None,
    chunk_size: int = 64,
    safe_gate: bool = False,
    lower_bound: float | None = None,
    use_graph: bool = False,
    dot_precision: str = "tf32",
    config=None,
    *,
    l2norm_rstd: tuple[torch.Tensor, torch.Tensor] | None = None,
    out_dtype: torch.dtype | None = None,
    fast_range: float | None = None,
    gate_monotone: bool = False,
):
    """Intra-chunk backward of KDA; drop-in for fla's ``chunk_kda_bwd_intra``.

    Args:
        q, k: ``[B, T, H, K]``.
        g: ``[B, T, HV, K]`` gates cumsummed within each chunk, log2 units (fp32).
        beta: ``[B, T, HV]``.
        dAqk: ``[B, T, HV, BT]`` fp32, gradient of the causal q-k scores (lower triangle and
            diagonal of each chunk are read).
        dAkk: ``[B, T, HV, BT]`` fp32, gradient of ``L`` (the strictly lower WY matrix with
            beta on its rows); the lower triangle and diagonal are read, as fla does.
        dq, dk, dg: ``[B, T, HV, K]`` and db ``[B, T, HV]``: the WY stage's gradients, added to.
        cu_seqlens: ``[N + 1]`` for a varlen batch (``B == 1``); chunk_indices ``[NT, 2]``
            (fla's ``prepare_chunk_indices``) computed when not given.
        chunk_size: 64 (or 32).
        safe_gate, lower_bound: accepted for signature parity; they select a numerical scheme
            in fla, not different math, and this kernel needs no bound on the gate.
        use_graph: fla's static-buffer capture mode; not supported (raises).
        dot_precision: ``tl.dot`` input precision for the fp32 gated products ("tf32" as fla's;
            the chain passes "ieee", ``chain.INTRA_BWD_DOTS``: dg's terms cancel and its sums
            dA_log, ddt_bias kept tf32's error, docs/kda.md "Errors").
        config: a ``triton.Config`` from ``CONFIGS`` or ``CANDIDATES`` to run instead of
            autotuning (tests, bench).
        l2norm_rstd: ``(q_rstd, k_rstd)``, each ``[B, T, H]`` fp32 (``l2norm_fwd``'s rstd, any
            shape with that many elements), when q and k are l2-normalized in the op: dq and dk
            then come out as the gradients of the raw (un-normalized) q and k, the l2norm
            backward done in the epilogue. Needs ``HV == H`` and a K block covering K
            (``can_fuse_l2norm``); kernel-fun's extension, not in fla's signature.
        out_dtype: dtype of dq and dk when ``l2norm_rstd`` is given (default: dq's).
        fast_range: the gate spread (log2) up to which a diagonal block takes one anchor
            (``FAST_RANGE``, as the chain passes it); None or negative: the bit levels always.
        gate_monotone: with ``fast_range``, the caller guarantees g is non-increasing along
            each chunk (a cumsum of log decays <= 0, as the gate in the op makes): a block's
            gate range is then read from its first and last rows instead of reduced over them.

    Returns:
        ``(dq, dk, db, dg)``: new tensors (inputs are not modified) holding the inputs plus the
        intra-chunk contributions; dq/dk in the dtype of the given dq/dk (``out_dtype`` with
        ``l2norm_rstd``), db and dg in fp32, dq/dk at ``HV`` heads (the caller reduces grouped
        heads), dg chunk-local (not yet reverse-cumsummed).
    """
    if use_graph:
        raise NotImplementedError("kernel_fun intra_bwd: use_graph (static buffers) is not supported")
    B, T, H, K = k.shape
    HV = g.shape[2]
    BT = chunk_size
    if BT not in (32, 64):
        raise ValueError(f"intra_bwd supports chunk_size 32 or 64, got {BT}")
    if HV % H != 0:
        raise ValueError(f"HV={HV} must be a multiple of H={H}")
    chunk_indices, NT = chunk_grid("intra_bwd", B, T, BT, cu_seqlens, chunk_indices)
    q, k, g, beta, dAqk, dAkk, dq, dk, db, dg = (
        x.contiguous() for x in (q, k, g, beta, dAqk, dAkk, dq, dk, db, dg))
    fuse = l2norm_rstd is not None
    if fuse:
        if not can_fuse_l2norm(H, HV, K, config):
            raise ValueError(f"intra_bwd: the l2norm backward fuses only with HV == H and a K block "
                             f"covering K (H={H}, HV={HV}, K={K}, config={config})")
        q_rstd, k_rstd = (r.contiguous() for r in l2norm_rstd)
        if q_rstd.numel() != B * T * H or k_rstd.numel() != B * T * H:
            raise ValueError(f"intra_bwd: rstd must have B*T*H = {B * T * H} elements")
    else:
        q_rstd = k_rstd = g  # unused
    dq_out = alloc(dq.shape, (out_dtype or dq.dtype) if fuse else dq.dtype, dq.device)
    dk_out = alloc(dk.shape, (out_dtype or dk.dtype) if fuse else dk.dtype, dk.device)
    db_out = alloc(db.shape, torch.float32, db.device)
    dg_out = alloc(dg.shape, torch.float32, dg.device)
    if NT > 0:
        launch(_intra_bwd_kernel, (NT, B * HV), config,
               q, k, g, beta, dAqk, dAkk, dq, dk, db, dg, dq_out, dk_out, db_out, dg_out, q_rstd, k_rstd,
               cu_seqlens, chunk_indices, T, WORK=chunk_work(B, T, BT, HV), H=H, HV=HV, K=K, BT=BT,
               IS_VARLEN=cu_seqlens is not None, DOT_PRECISION=dot_precision, L2NORM_BWD=fuse,
               FAST_RANGE=-1.0 if fast_range is None else float(fast_range),
               GATE_MONOTONE=bool(gate_monotone) and fast_range is not None)
        record_launch("kda.intra_bwd")
    return dq_out, dk_out, db_out, dg_out
