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

Kernel design (one program = one chunk x one value head, a loop over K blocks):

The chunk is held as ``[NC, 16, BK]`` tiles (NC = BT/16 sub-chunks) and every gated product
runs on tensor cores as a batched ``[NC, 16, 16] @ [NC, 16, BK]`` dot. The gate factor
``exp2(g_i - g_j)`` is split at an anchor row ``a`` with ``j < a <= i`` into
``exp2(g_i - g_a) * exp2(g_a - g_j)``: both factors are <= 1 for a decaying gate, so nothing
overflows however strong the decay, and no lower bound on the gate is needed.

* Inside a 16-token sub-chunk (the diagonal blocks), the pairs ``i > j`` are split by the
  highest bit ``b`` where ``i`` and ``j`` differ; the anchor is ``i`` with its low ``b`` bits
  cleared, which depends only on the row and the level. Each level is one masked dot, and
  every token takes part in it either as a row (its bit ``b`` is set) or as a column (clear),
  so one exponential per element and level serves both the row-side products (dq, dkr) and
  the column-side product (dkt): a row and its transposed partner share the same dot, with
  the symmetric ``S_rc = dA[max(r,c), min(r,c)]`` as left operand. 4 levels, 4 exp2 per
  element, 8 dots; the ``i == j`` term is element-wise.
* Across sub-chunks, "views" pair sub-chunk ``I`` with ``P = I ^ v`` (v = 1..NC-1): the later
  one of the two is the row side, the earlier the column side, anchored at the first row of
  the later sub-chunk (GLA's secondary chunking). 2 exp2 per element and 2 dots per view.

dA is read only on and below the diagonal (fla reads the same entries). Gate factors are
zeroed for rows past the end of a sequence, so padded rows never meet an exponent.

Precision: gated operands are fp32; dots use ``DOT_PRECISION`` (tf32 by default, like fla's
own off-diagonal blocks; "ieee"/"tf32x3"/"bf16x3" selectable).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernel_fun._common.tuning import autotune_configs
from kernel_fun._common.witness import record_launch
from kernel_fun.kda._kernels import chunk_indices_for, launch



def _alloc(size, dtype=None, device=None):
    """Output allocation (tests swap in a NaN-filled one to catch unwritten elements)."""
    return torch.empty(size, dtype=dtype, device=device)


def configs():
    """Every configuration the autotuner may pick (the interpreter runs only the first)."""
    return [
        triton.Config({"BK": bk, "HOIST": hoist}, num_warps=w, num_stages=s)
        for bk, hoist, w, s in [
            (32, False, 4, 2),
            (32, False, 8, 2),
            (64, False, 8, 2),
            (32, True, 8, 2),
            (64, True, 8, 1),
            (32, False, 4, 1),
        ]
    ]


@triton.jit
def _sym_lhs(pA, t_loc, o_i, o_r, n_valid, HVBT: tl.constexpr, BC: tl.constexpr):
    """[NC, BC, BC]: S_rc = dA[max(r,c), min(r,c)] of each diagonal 16x16 block."""
    rr = tl.maximum(o_r[:, None], o_r[None, :])
    cc = tl.minimum(o_r[:, None], o_r[None, :])
    row = o_i[:, None, None] * BC + rr[None, :, :]
    col = o_i[:, None, None] * BC + cc[None, :, :]
    return tl.load(pA + row * HVBT + col, mask=row < n_valid, other=0.).to(tl.float32)


@triton.jit
def _view_lhs(pA, o_i, o_r, v: tl.constexpr, n_valid, HVBT: tl.constexpr, BC: tl.constexpr):
    """[NC, BC, BC]: for sub-chunk I and partner P = I ^ v, the block dA[I, P] when I > P
    (row side), else the transposed block dA[P, I]^T (column side)."""
    p_i = o_i ^ v
    is_row = (o_i > p_i)[:, None, None]
    r_own = o_i[:, None, None] * BC + o_r[None, :, None]
    c_par = p_i[:, None, None] * BC + o_r[None, None, :]
    row = tl.where(is_row, r_own, c_par)
    col = tl.where(is_row, c_par, r_own)
    return tl.load(pA + row * HVBT + col, mask=row < n_valid, other=0.).to(tl.float32)


@triton.autotune(configs=autotune_configs(configs()), key=["H", "HV", "K", "BT", "IS_VARLEN", "DOT_PRECISION"])
@triton.jit(do_not_specialize=["T"])
def _intra_bwd_kernel(
    q, k, g, beta, dAqk, dAkk,
    dq, dk, db, dg,
    dq_out, dk_out, db_out, dg_out,
    cu_seqlens, chunk_indices, T,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BT: tl.constexpr,
    BK: tl.constexpr, HOIST: tl.constexpr, IS_VARLEN: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    BC: tl.constexpr = 16
    NC: tl.constexpr = BT // BC
    NEG_INF: tl.constexpr = float("-inf")  # exp2(-inf) = 0: masked gate factors
    i_t = tl.program_id(0).to(tl.int64)
    i_bh = tl.program_id(1).to(tl.int64)
    i_b = i_bh // HV
    i_hv = i_bh % HV
    i_h = i_hv // (HV // H)
    if IS_VARLEN:
        i_n = tl.load(chunk_indices + i_t * 2).to(tl.int64)
        i_t = tl.load(chunk_indices + i_t * 2 + 1).to(tl.int64)
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
    else:
        bos = i_b * T
        eos = bos + T
    t0 = bos + i_t * BT  # global token index of the chunk's first row
    n_valid = tl.minimum(eos - t0, BT).to(tl.int32)

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

    o_i = tl.arange(0, NC)
    o_r = tl.arange(0, BC)
    t_loc = o_i[:, None] * BC + o_r[None, :]  # [NC, BC] chunk-local row
    m_t = t_loc < n_valid

    # level of a pair inside a 16-block: the highest bit where r and c differ (-1 on r == c)
    x_rc = o_r[:, None] ^ o_r[None, :]
    lvl = tl.where(x_rc >= 8, 3, tl.where(x_rc >= 4, 2, tl.where(x_rc >= 2, 1, tl.where(x_rc >= 1, 0, -1))))
    lvl = lvl[None, :, :]

    # the i == j terms
    dqk_d = tl.load(dAqk + t_loc * HVBT + t_loc, mask=m_t, other=0.).to(tl.float32)[:, :, None]
    dkk_d = tl.load(dAkk + t_loc * HVBT + t_loc, mask=m_t, other=0.).to(tl.float32)[:, :, None]
    b_beta = tl.load(beta + t_loc * HV, mask=m_t, other=0.).to(tl.float32)
    if HOIST:
        s_qk = _sym_lhs(dAqk, t_loc, o_i, o_r, n_valid, HVBT, BC)
        s_kk = _sym_lhs(dAkk, t_loc, o_i, o_r, n_valid, HVBT, BC)

    b_db = tl.zeros([NC, BC], dtype=tl.float32)
    for i_k in range(0, tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = (o_k < K)[None, None, :]
        m_tk = m_t[:, :, None] & m_k
        o_k3 = o_k[None, None, :]
        b_q = tl.load(q + t_loc[:, :, None] * HK + o_k3, mask=m_tk, other=0.).to(tl.float32)
        b_k = tl.load(k + t_loc[:, :, None] * HK + o_k3, mask=m_tk, other=0.).to(tl.float32)
        b_g = tl.load(g + t_loc[:, :, None] * HVK + o_k3, mask=m_tk, other=0.).to(tl.float32)
        b_bk = b_k * b_beta[:, :, None]

        b_dq = dqk_d * b_k
        b_dkr = dkk_d * b_k
        b_dkt = dqk_d * b_q + dkk_d * b_bk

        # ---- diagonal 16x16 blocks: one masked batched dot per bit level ----
        if not HOIST:
            s_qk = _sym_lhs(dAqk, t_loc, o_i, o_r, n_valid, HVBT, BC)
            s_kk = _sym_lhs(dAkk, t_loc, o_i, o_r, n_valid, HVBT, BC)
        for lv in tl.static_range(4):
            anc = ((o_r >> lv) << lv) | (1 << lv)
            t_anc = o_i[:, None] * BC + anc[None, :]
            m_anc = t_anc < n_valid
            b_ga = tl.load(g + t_anc[:, :, None] * HVK + o_k3, mask=m_anc[:, :, None] & m_k, other=0.).to(tl.float32)
            is_row = (((o_r >> lv) & 1) == 1)[None, :, None]
            b_f = tl.exp2(tl.where((m_t & m_anc)[:, :, None], tl.where(is_row, b_g - b_ga, b_ga - b_g), NEG_INF))
            rhs1 = tl.where(is_row, b_q, b_k) * b_f
            rhs2 = tl.where(is_row, b_bk, b_k) * b_f
            lhs1 = tl.where(lvl == lv, s_qk, 0.)
            lhs2 = tl.where(lvl == lv, s_kk, 0.)
            r1 = tl.dot(lhs1, rhs1, input_precision=DOT_PRECISION) * b_f
            r2 = tl.dot(lhs2, rhs2, input_precision=DOT_PRECISION) * b_f
            b_dq += tl.where(is_row, r1, 0.)
            b_dkr += tl.where(is_row, r2, 0.)
            b_dkt += tl.where(is_row, 0., r1 + r2)

        # ---- blocks between sub-chunks I and P = I ^ v ----
        for v in tl.static_range(1, NC):
            p_i = o_i ^ v
            is_row = (o_i > p_i)[:, None, None]
            t_p = p_i[:, None] * BC + o_r[None, :]
            m_p = t_p < n_valid
            m_pk = m_p[:, :, None] & m_k
            g_p = tl.load(g + t_p[:, :, None] * HVK + o_k3, mask=m_pk, other=0.).to(tl.float32)
            k_p = tl.load(k + t_p[:, :, None] * HK + o_k3, mask=m_pk, other=0.).to(tl.float32)
            q_p = tl.load(q + t_p[:, :, None] * HK + o_k3, mask=m_pk, other=0.).to(tl.float32)
            b_p = tl.load(beta + t_p * HV, mask=m_p, other=0.).to(tl.float32)
            # anchor: first row of the later sub-chunk of the pair
            t_a = tl.where(o_i > p_i, o_i, p_i) * BC
            m_a = (t_a < n_valid)[:, None, None]
            g_a = tl.load(g + t_a[:, None, None] * HVK + o_k3, mask=m_a & m_k, other=0.).to(tl.float32)
            f_p = tl.exp2(tl.where(m_p[:, :, None] & m_a, tl.where(is_row, g_a - g_p, g_p - g_a), NEG_INF))
            f_o = tl.exp2(tl.where(m_t[:, :, None] & m_a, tl.where(is_row, b_g - g_a, g_a - b_g), NEG_INF))
            rhs1 = tl.where(is_row, k_p, q_p) * f_p
            rhs2 = tl.where(is_row, k_p, k_p * b_p[:, :, None]) * f_p
            lhs1 = _view_lhs(dAqk, o_i, o_r, v, n_valid, HVBT, BC)
            lhs2 = _view_lhs(dAkk, o_i, o_r, v, n_valid, HVBT, BC)
            r1 = tl.dot(lhs1, rhs1, input_precision=DOT_PRECISION) * f_o
            r2 = tl.dot(lhs2, rhs2, input_precision=DOT_PRECISION) * f_o
            b_dq += tl.where(is_row, r1, 0.)
            b_dkr += tl.where(is_row, r2, 0.)
            b_dkt += tl.where(is_row, 0., r1 + r2)

        # ---- epilogue for this K block ----
        b_db += tl.sum(b_dkr * b_k, axis=2)
        o_out = t_loc[:, :, None] * HVK + o_k3
        b_dqi = tl.load(dq + o_out, mask=m_tk, other=0.).to(tl.float32)
        b_dki = tl.load(dk + o_out, mask=m_tk, other=0.).to(tl.float32)
        b_dgi = tl.load(dg + o_out, mask=m_tk, other=0.).to(tl.float32)
        b_dkr = b_dkr * b_beta[:, :, None]
        tl.store(dq_out + o_out, (b_dqi + b_dq).to(dq_out.dtype.element_ty), mask=m_tk)
        tl.store(dk_out + o_out, (b_dki + b_dkr + b_dkt).to(dk_out.dtype.element_ty), mask=m_tk)
        tl.store(dg_out + o_out, (b_dgi + b_q * b_dq + (b_dkr - b_dkt) * b_k).to(dg_out.dtype.element_ty), mask=m_tk)

    b_dbi = tl.load(db + t_loc * HV, mask=m_t, other=0.).to(tl.float32)
    tl.store(db_out + t_loc * HV, (b_dbi + b_db).to(db_out.dtype.element_ty), mask=m_t)


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
        dot_precision: ``tl.dot`` input precision for the fp32 gated products.
        config: a ``triton.Config`` from ``configs()`` to run instead of autotuning (tests).

    Returns:
        ``(dq, dk, db, dg)``: new tensors (inputs are not modified) holding the inputs plus the
        intra-chunk contributions; dq/dk in the dtype of the given dq/dk, db and dg in fp32,
        dq/dk at ``HV`` heads (the caller reduces grouped heads), dg chunk-local (not yet
        reverse-cumsummed).
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
    if cu_seqlens is not None and B != 1:
        raise ValueError("varlen (cu_seqlens) needs B == 1")
    if chunk_indices is None and cu_seqlens is not None:
        chunk_indices = chunk_indices_for(cu_seqlens, BT)
    NT = triton.cdiv(T, BT) if cu_seqlens is None else len(chunk_indices)
    q, k, g, beta, dAqk, dAkk, dq, dk, db, dg = (
        x.contiguous() for x in (q, k, g, beta, dAqk, dAkk, dq, dk, db, dg))

    dq_out = _alloc(dq.shape, dq.dtype, dq.device)
    dk_out = _alloc(dk.shape, dk.dtype, dk.device)
    db_out = _alloc(db.shape, torch.float32, db.device)
    dg_out = _alloc(dg.shape, torch.float32, dg.device)
    if NT == 0:
        return dq_out, dk_out, db_out, dg_out
    grid = (NT, B * HV)
    launch(
        _intra_bwd_kernel, grid, config,
        q, k, g, beta, dAqk, dAkk,
        dq, dk, db, dg,
        dq_out, dk_out, db_out, dg_out,
        cu_seqlens, chunk_indices, T,
        H=H, HV=HV, K=K, BT=BT,
        IS_VARLEN=cu_seqlens is not None, DOT_PRECISION=dot_precision,
    )
    record_launch("kda.intra_bwd")
    return dq_out, dk_out, db_out, dg_out
