"""GDN backward, first half, one (chunk, value head) per program: everything that lives on the
value side or in the [BT, BT] chunk matrices. dv and dbeta come out whole; the gradients of the
two gate-free score matrices (Q K^T and diag(beta) K K^T) and the Z-part of dG go to the second
half (``wy_dqk_bwd.py``), which makes dq, dk and dg.

Per chunk (BT = 64 tokens) and value head, in the notation of ``wy_dqkwg_bwd.py`` (G the
chunk-local cumulative gate, gamma = exp(G), Gamma_ij = exp(G_i - G_j) for i >= j else 0,
S = h, vn = v_new, dvn = dv2, A = (I + StrictLower(diag(beta) K K^T * Gamma))^-1):

    dAqk  = scale * (do vn^T) * Gamma                       (gradient of Q K^T, [BT, BT])
    D     = dvn (K S)^T,   rowsum(A^T dw * K) = -colsum(A * D)     (dw = -dvn S^T never held)
    dA    = StrictLower(dvn (beta V)^T - D diag(beta gamma))
    Z     = -(A^T dA A^T) * Gamma on the strict lower triangle
    dAkk  = diag(beta) Z                                     (gradient of K K^T, [BT, BT])
    dv    = diag(beta) A^T dvn
    dbeta = rowsum(A^T dvn * V) + gamma rowsum(A^T dw * K) + rowsum(Z * K K^T)
    dGz   = 2 beta gamma rowsum(A^T dw * K) + rowsum(Z * L) - colsum(Z * L)   (L = diag(beta) K K^T),
            minus sum(beta gamma rowsum(A^T dw * K)) on the last row (the part of dG that needs
            no dq, dk; the second half adds the rest)

Why the split: the fused kernel held dq, dk [BT, K] and three [BT, BT] fp32 accumulators (112 KB
at K = 128) and spilled in every configuration (255 registers, 824-2112 B of stack, sm_90a). This
half holds only the three [BT, BT] ones (48 KB). Transpose-free: A^T, v_new^T, v^T, h^T and k^T
are loaded transposed from memory; no dot result is transposed (the Triton 3.4-3.7.0 Hopper
miscompile, fla #640); dAqk and dAkk are written in natural layout and the second half loads them
transposed.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernel_fun._common.tuning import (  # noqa: F401  (config_name: every kernel module names its configs)
    alloc, autotune_cache, autotune_configs, chunk_work, config_name, fitting_blocks, install_interpreter_shims, launch,
    next_pow2, row_stride)
from kernel_fun._common.witness import record_launch
from kernel_fun._delta.chunking import chunk_program


install_interpreter_shims()

# (BV, num_warps, num_stages, MERGE_D). The first is the only one the interpreter runs: BV=32, so
# that the CPU tests (V = 64/128) exercise the V loop. Timed on the H200 (`--stages gdn`, B=4
# T=4096 H=16 K=V=128, bf16), ms at HV=32 | HV=16, and sm_90a registers / stack (Triton 3.6) at HV=32:
#   MERGE_D BV32 w4 0.599 | -      255/0    (2026-12-02, bench/records/2026-12-02-h200-stages-gdn-wy-dv-merge-d-d638293.json)
#   BV64 w8 0.793 | 0.398  236/0            (the rest: bench/records/2026-12-02-h200-stages-gdn-hv{32,16}-137cfbe.json)
#   candidates: BV32 w4 0.742 | 0.387  255/160;  BV128 w8 0.871 | 0.454  255/8;  BV16 w4 0.892 | 0.432  255/104;
#   BV64 w4 1.041 | 0.511  255/304;  BV32 w8 1.022 | 0.509  247/0;
#   MERGE_D BV32 w4 s1 0.805 (253/0);  MERGE_D BV32 w8 0.897 (222/0);  MERGE_D BV64 w8 0.818 (255/0)
# MERGE_D keeps two [BT, BT] fp32 accumulators across the V loop instead of three (the kernel's
# docstring): one more [BV, BT] x [BT, BT] product per V block, one fewer [BT, BV] load, and the
# four-warp BV32 form no longer spills (Nsight Compute on 2026-12-02 had the three-accumulator
# BV32-w4 at 255 registers, 2.4 M spill requests, 12.5% occupancy: docs/gdn.md). 19% faster at HV=32.
# Three stages (2026-12-04, the same probe; bench/records/2026-12-04-h200-stages-gdn-wy-dv-stages-48070d5.json):
# MERGE_D BV32 w4 s3 0.580-0.582 | prod_b8 1.151 against s2's 0.603-0.606 | 1.201 (sm_90a: 106 KB of
# shared memory, still two programs an SM; 16 B of stack); BV16 w4 s2 / s3 0.735 / 0.669.
_CONFIG_TUPLES = [(32, 4, 3, True), (64, 8, 2, False)]
_CANDIDATE_TUPLES = [(32, 4, 2, False), (128, 8, 2, False), (16, 4, 2, False), (64, 4, 2, False), (32, 8, 2, False),
                     (32, 4, 1, True), (32, 8, 2, True), (64, 8, 2, True), (32, 4, 2, True)]


def _config(bv, nw, ns, merge_d):
    return triton.Config(dict({"BV": bv}, **({"MERGE_D": True} if merge_d else {})), num_warps=nw, num_stages=ns)


CONFIGS = [_config(*c) for c in _CONFIG_TUPLES]
CANDIDATES = [_config(*c) for c in _CANDIDATE_TUPLES]


def prune_bv(configs, named_args, **kwargs):
    """Drop configurations whose value block is wider than V (both halves of the backward)."""
    return fitting_blocks(configs, {"BV": max(kwargs.get("V", named_args.get("V")), 32)})


@triton.jit(do_not_specialize=["T"])
def wy_dv_bwd_kernel(
    k,  # [B, T, H, K]
    v,  # [B, T, HV, V]
    v_new,  # [B, T, HV, V]
    g,  # [B, T, HV] fp32, chunk-local cumulative log2 gate
    beta,  # [B, T, HV]
    A,  # [B, T, HV, BT]: (I + L)^-1, lower triangular, its zeros above the diagonal written (wy_inverse)
    h,  # [B, NT, HV, K, V]: the state before each chunk
    do,  # [B, T, HV, V]
    dv2,  # [B, T, HV, V]: the full gradient of v_new
    dv,  # [B, T, HV, V], rows s_dv elements apart (HV * V, or a column slice of a fused q/k/v gradient)
    db,  # [B, T, HV] fp32
    dAqk,  # [B, T, HV, BT]: scale * (do vn^T) * Gamma
    dAkk,  # [B, T, HV, BT]: diag(beta) Z
    dgz,  # [B, T, HV] fp32: the Z-part of dG (before the reverse cumsum)
    cu_seqlens,  # [N + 1] | unused
    chunk_indices,  # [NT, 2] | unused
    scale,
    T,
    WORK,  # autotune key only: tuning.chunk_work(chunks x value heads)
    s_dv,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, KP: tl.constexpr, BV: tl.constexpr,
    IS_VARLEN: tl.constexpr, DOT_PRECISION: tl.constexpr,
    MERGE_D: tl.constexpr = False,
):
    _, i_hv, i_h, i_tg, row0, n_valid = chunk_program(cu_seqlens, chunk_indices, T, H, HV, BT, IS_VARLEN)
    last = n_valid - 1

    o_i = tl.arange(0, BT)
    m_t = o_i < n_valid
    o_k = tl.arange(0, KP)
    m_k = o_k < K
    m_tk = m_t[:, None] & m_k[None, :]
    m_kt = m_k[:, None] & m_t[None, :]
    m_tt = m_t[:, None] & m_t[None, :]

    # Per-chunk base pointers (int64); offsets inside a chunk fit in int32.
    k += (row0 * H + i_h) * K
    dt_in = k.dtype.element_ty
    p_g = g + row0 * HV + i_hv
    b_g = tl.load(p_g + o_i * HV, mask=m_t, other=0.0).to(tl.float32)
    b_beta = tl.load(beta + row0 * HV + i_hv + o_i * HV, mask=m_t, other=0.0).to(tl.float32)
    b_gam = tl.where(m_t, tl.exp2(b_g), 0.0)
    b_bg = b_beta * b_gam
    # A as wy_inverse writes it: every column of the chunk's rows, zeros above the diagonal (and so
    # past the chunk's end); masked by its rows only, so that no mask runs along the contiguous
    # dimension (which would split each load into 2-byte accesses) and no where is needed.
    p_A = A + (row0 * HV + i_hv) * BT
    if MERGE_D:  # A as stored [i, j]: the V loop makes (A^T dv2)^T = dv2^T A
        b_al = tl.load(p_A + o_i[:, None] * (HV * BT) + o_i[None, :], mask=m_t[:, None], other=0.0).to(dt_in)
    else:  # A^T [j, i]
        b_at = tl.load(p_A + o_i[None, :] * (HV * BT) + o_i[:, None], mask=m_t[None, :], other=0.0).to(dt_in)
    b_kt = tl.load(k + o_i[None, :] * (H * K) + o_k[:, None], mask=m_kt, other=0.0)  # k^T from memory
    p_h = h + (i_tg * HV + i_hv) * K * V
    p_v = v + (row0 * HV + i_hv) * V
    p_vn = v_new + (row0 * HV + i_hv) * V
    p_do = do + (row0 * HV + i_hv) * V
    p_dv2 = dv2 + (row0 * HV + i_hv) * V
    p_dv = dv + row0 * s_dv + i_hv * V

    # fp32 accumulators over V: ds = do vn^T, dA_u = dv2 (beta V)^T, D = dv2 (K S)^T. MERGE_D
    # holds two [BT, BT] ones, not three: M = dA_u - D diag(beta gamma) = dv2 ((beta V)^T - (K S)^T
    # diag(beta gamma)) in one product, and D's only other use, rowsum(A^T dw * K)_j =
    # -sum_v (K S)^T_vj (dv2^T A)_vj, as a [BT] vector; dv and dbeta from dv2^T A too.
    b_ds = tl.zeros([BT, BT], dtype=tl.float32)
    b_dau = tl.zeros([BT, BT], dtype=tl.float32)
    if MERGE_D:
        b_dkk = tl.zeros([BT], dtype=tl.float32)
    else:
        b_D = tl.zeros([BT, BT], dtype=tl.float32)
    b_db = tl.zeros([BT], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < V
        m_tv = m_t[:, None] & m_v[None, :]
        m_vt = m_v[:, None] & m_t[None, :]
        m_vk = m_v[:, None] & m_k[None, :]
        b_do = tl.load(p_do + o_i[:, None] * (HV * V) + o_v[None, :], mask=m_tv, other=0.0)
        b_vnt = tl.load(p_vn + o_i[None, :] * (HV * V) + o_v[:, None], mask=m_vt, other=0.0)
        b_dvn = tl.load(p_dv2 + o_i[:, None] * (HV * V) + o_v[None, :], mask=m_tv, other=0.0).to(dt_in)
        b_vt = tl.load(p_v + o_i[None, :] * (HV * V) + o_v[:, None], mask=m_vt, other=0.0)
        b_ht = tl.load(p_h + o_k[None, :] * V + o_v[:, None], mask=m_vk, other=0.0).to(dt_in)  # S^T [BV, K]

        b_ds = tl.dot(b_do, b_vnt, b_ds, input_precision=DOT_PRECISION)
        if MERGE_D:
            b_kht = tl.dot(b_ht, b_kt, input_precision=DOT_PRECISION)  # (K S)^T of this V block, fp32
            b_x = (b_vt.to(tl.float32) * b_beta[None, :] - b_kht * b_bg[None, :]).to(dt_in)
            b_dau = tl.dot(b_dvn, b_x, b_dau, input_precision=DOT_PRECISION)  # M
            # (A^T dv2)^T = dv2^T A: dv = diag(beta) A^T dv2, dbeta += rowsum(A^T dv2 * V)
            b_dvnt = tl.load(p_dv2 + o_i[None, :] * (HV * V) + o_v[:, None], mask=m_vt, other=0.0).to(dt_in)
            b_dvbt = tl.dot(b_dvnt, b_al, input_precision=DOT_PRECISION)
            b_dkk -= tl.sum(b_dvbt * b_kht, 0)
            b_db += tl.sum(b_dvbt * b_vt.to(tl.float32), 0)
            tl.store(p_dv + o_i[None, :] * s_dv + o_v[:, None],
                     (b_dvbt * b_beta[None, :]).to(dv.dtype.element_ty), mask=m_vt)
        else:
            b_vbt = (b_vt.to(tl.float32) * b_beta[None, :]).to(dt_in)
            b_dau = tl.dot(b_dvn, b_vbt, b_dau, input_precision=DOT_PRECISION)
            b_kht = tl.dot(b_ht, b_kt, input_precision=DOT_PRECISION).to(dt_in)  # (K S)^T of this V block
            b_D = tl.dot(b_dvn, b_kht, b_D, input_precision=DOT_PRECISION)
            # u = A diag(beta) V:  dv = diag(beta) A^T dv2, dbeta += rowsum(A^T dv2 * V)
            b_dvb = tl.dot(b_at, b_dvn, input_precision=DOT_PRECISION)
            b_v = tl.load(p_v + o_i[:, None] * (HV * V) + o_v[None, :], mask=m_tv, other=0.0)
            b_db += tl.sum(b_dvb * b_v.to(tl.float32), 1)
            tl.store(p_dv + o_i[:, None] * s_dv + o_v[None, :],
                     (b_dvb * b_beta[:, None]).to(dv.dtype.element_ty), mask=m_tv)

    # [BT, BT] masks formed after the V loop, so that they are not live across it
    m_lower = (o_i[:, None] >= o_i[None, :]) & m_tt  # [i, j], i >= j, both tokens valid
    m_strict = (o_i[:, None] > o_i[None, :]) & m_tt
    if MERGE_D:  # A^T for the dA products below, loaded after the loop (not live across it)
        b_at = tl.load(p_A + o_i[None, :] * (HV * BT) + o_i[:, None], mask=m_t[None, :], other=0.0).to(dt_in)
    else:
        # rowsum(A^T dw * K)_i = -sum_j A_ji D_ji, A loaded as stored
        b_a = tl.load(p_A + o_i[:, None] * (HV * BT) + o_i[None, :], mask=m_t[:, None], other=0.0).to(tl.float32)
        b_dkk = -tl.sum(b_a * b_D, 0)

    # Gamma, formed with where before any product (exp2 overflows above the diagonal; 0 * inf
    # would be NaN)
    b_Gam = tl.where(m_lower, tl.exp2(tl.where(m_lower, b_g[:, None] - b_g[None, :], 0.0)), 0.0)
    p_s = (row0 * HV + i_hv) * BT + o_i[:, None] * (HV * BT) + o_i[None, :]
    tl.store(dAqk + p_s, (b_ds * b_Gam * scale).to(dAqk.dtype.element_ty), mask=m_t[:, None])

    # A = (I + L)^-1:  dL = -A^T dA A^T on the strict lower triangle,
    # dA = dw (beta gamma K)^T + dv2 (beta V)^T = dA_u - D diag(beta gamma)
    if MERGE_D:
        b_da = tl.where(m_strict, b_dau, 0.0).to(dt_in)
    else:
        b_da = tl.where(m_strict, b_dau - b_D * b_bg[None, :], 0.0).to(dt_in)
    b_da = tl.dot(b_at, b_da, input_precision=DOT_PRECISION).to(dt_in)
    b_da = tl.dot(b_da, b_at, input_precision=DOT_PRECISION)
    b_z = tl.where(m_strict, -b_da * b_Gam, 0.0)  # dL * Gamma
    tl.store(dAkk + p_s, (b_z * b_beta[:, None]).to(dAkk.dtype.element_ty), mask=m_t[:, None])

    b_k = tl.load(k + o_i[:, None] * (H * K) + o_k[None, :], mask=m_tk, other=0.0)
    b_kk = tl.dot(b_k, b_kt, input_precision=DOT_PRECISION)  # K K^T
    b_zk = b_z * b_kk
    b_db += tl.sum(b_zk, 1) + b_gam * b_dkk
    b_zl = b_zk * b_beta[:, None]  # dL * L
    b_bgk = b_bg * b_dkk
    b_dgz = 2.0 * b_bgk + tl.sum(b_zl, 1) - tl.sum(b_zl, 0)
    # sums of 1-D tensors go through a [1, N] view: Triton 3.6 cannot lower a 1-D sum of a
    # dot's result for sm_100a (TMEM layout pass: 'parent layout must have at least rank >= 2')
    b_dgz -= tl.where(o_i == last, tl.sum(b_bgk[None, :], 1), 0.0)
    tl.store(db + row0 * HV + i_hv + o_i * HV, b_db.to(db.dtype.element_ty), mask=m_t)
    tl.store(dgz + row0 * HV + i_hv + o_i * HV, b_dgz, mask=m_t)


wy_dv_bwd_kernel_tuned = triton.autotune(
    configs=autotune_configs(CONFIGS), **autotune_cache(),
    key=["H", "HV", "K", "V", "BT", "IS_VARLEN", "WORK"],
    prune_configs_by={"early_config_prune": prune_bv},
)(wy_dv_bwd_kernel)


def wy_dv_bwd(k, v, v_new, g, beta, A, h, do, dv2, scale, NT: int, cu_seqlens=None, chunk_indices=None,
              chunk_size: int = 64, dv=None, *, config: triton.Config | None = None):
    """The first half of the GDN backward (shapes checked and made contiguous by the caller,
    ``wy_dqkwg_bwd``): k ``[B, T, H, K]``; v, v_new, do, dv2 ``[B, T, HV, V]``; g, beta
    ``[B, T, HV]``; A ``[B, T, HV, BT]`` with its zeros above the diagonal stored, as ``wy_inverse``
    writes it (only A's rows are masked); h ``[B, NT, HV, K, V]``. Returns ``(dv [B, T, HV, V]``
    in v's dtype, ``dbeta [B, T, HV]`` fp32, ``dAqk, dAkk [B, T, HV, BT]`` in k's dtype (every
    column of each chunk's rows, zero above the diagonal and past the chunk's end: the second half
    masks them by rows only), ``dGz [B, T, HV]`` fp32). ``dv``: where to write dv
    (rows strided, ``row_stride``'s layout), else a new tensor."""
    B, T, H, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    BT = chunk_size
    dev = k.device
    if dv is None:
        dv = alloc((B, T, HV, V), dtype=v.dtype, device=dev)
    db = alloc((B, T, HV), dtype=torch.float32, device=dev)
    dAqk = alloc((B, T, HV, BT), dtype=k.dtype, device=dev)
    dAkk = alloc((B, T, HV, BT), dtype=k.dtype, device=dev)
    dgz = alloc((B, T, HV), dtype=torch.float32, device=dev)
    is_varlen = cu_seqlens is not None
    args = dict(
        k=k, v=v, v_new=v_new, g=g, beta=beta, A=A, h=h, do=do, dv2=dv2, dv=dv, db=db, dAqk=dAqk, dAkk=dAkk,
        dgz=dgz, cu_seqlens=cu_seqlens if is_varlen else db, chunk_indices=chunk_indices if is_varlen else db,
        scale=float(scale), T=T, WORK=chunk_work(B, T, BT, HV), s_dv=row_stride(dv, "dv"), H=H, HV=HV, K=K, V=V,
        BT=BT, KP=max(16, next_pow2(K)),
        IS_VARLEN=is_varlen, DOT_PRECISION="ieee" if k.dtype == torch.float32 else "tf32",
    )
    grid = (NT, B * HV)
    launch(wy_dv_bwd_kernel_tuned, grid, config, **args)
    record_launch("gdn.wy_dv_bwd")
    return dv, db, dAqk, dAkk, dgz
