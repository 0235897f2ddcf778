"""GDN backward, one chunk at a time: the output/state gradients of q, k and the gate (fla's
``chunk_bwd_dqkwg``) fused with the WY backward (fla's ``prepare_wy_repr_bwd``), transpose-free.

Replaces fla 0.6.0's pair ``chunk_bwd_dqkwg`` (fla/ops/common/chunk_o.py, which fla refuses on
Hopper with Triton 3.4-3.7.0: ``tl.trans`` of a dot result fed to a dot is miscompiled there,
fla #640) + ``prepare_wy_repr_bwd`` (fla/ops/gated_delta_rule/wy_fast.py, wrong at num_warps=4,
fla #988), then ``dk.add_(dk2)``, ``dg.add_(dg2)``, the chunk-local reverse cumsum of dg and the
group sum of dq, dk (grouped values). dw never leaves the program.

Per chunk (BT = 64 tokens), value head, with G the chunk-local cumulative gate (natural units
below; the kernel reads it in log2 units as the chain keeps it), gamma = exp(G), Gamma_ij =
exp(G_i - G_j) for i >= j (else 0), S = h (the state before the chunk), dS = dh (the gradient
of the state after it), vn = v_new, dvn = dv2 (its full gradient, from the backward scan),
A = (I + StrictLower(diag(beta) K K^T * Gamma))^-1 (fla's forward intra stage):

    dq   = scale * (diag(gamma) do S^T + (do vn^T * Gamma) K)
    dk   = scale * (vn do^T * Gamma^T) Q + diag(gamma_L / gamma) vn dS^T        (output, state)
    dw   = -dvn S^T
    dk  += diag(beta gamma) A^T dw,  dv = diag(beta) A^T dvn                     (w, u)
    Z    = -(A^T dA A^T) * Gamma,  dA = StrictLower(dw (beta gamma K)^T + dvn (beta V)^T)
    dk  += diag(beta) Z K + Z^T diag(beta) K                                     (A)
    dbeta = gamma rowsum(A^T dw * K) + rowsum(A^T dvn * V) + rowsum(Z * K K^T)
    dG   = rowsum(dq * Q) - rowsum(dk_out,state * K) + beta gamma rowsum(A^T dw * K)
           + rowsum(Z * L) - colsum(Z * L)   (L = diag(beta) K K^T),
           and on the last row also gamma_L sum(S * dS) + sum(dk_state * K)
    dg   = the chunk-local reverse cumsum of dG (the gradient of the per-token log gate)

No dot result is ever transposed into another dot (the Triton 3.4-3.7.0 Hopper pattern): every
transposed operand is loaded transposed from memory (A^T, h^T, dh^T, v_new^T, k^T, v^T), and
(ds * Gamma)^T and Z^T, needed once each, are stored to a scratch tile and read back
transposed after a barrier.

Grid: one program per (chunk, qk head); it loops over the qk head's G = HV / H value heads and
sums their dq, dk in fp32 registers, so grouped values write dq, dk once (fla writes them per
value head and sums afterwards). The per-value-head gate factors are folded into the operands
(do * gamma * scale, vn * gamma_L / gamma, rounded to the input dtype) so that the group's
dq, dk accumulate in one pair of registers; each head's share of rowsum(dq * Q) is the
difference of the rowsums before and after it.

Registers (fp32 accumulators): dq, dk [BT, K] and ds, dA_u, D [BT, BT]; at K = 128 that is 112 KB
per program. Designed for M = 64 wgmma tiles (every product has BT = 64 rows). sm_90a compile
(2026-12, K=V=128): 255 registers and 824-2112 B of spill stack by configuration (docs/gdn.md);
not yet timed. Bytes at B=8, T=8192, H=HV=16, K=V=128: q, k, v, v_new, do, dv2 and h, dh (2X
each) in, dq, dk, dv out: about 12X = 3.2 GB, 0.76 ms at 4.24 TB/s, against fla's dqkwg +
wy_bwd 1.82 + 1.00 ms (shared/baselines/h200-2026-11-30.md).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernel_fun._common.tuning import autotune_cache, autotune_configs, install_interpreter_shims
from kernel_fun._common.witness import record_launch

install_interpreter_shims()

# (BV, num_warps, num_stages). The first is the only one the interpreter runs: BV=32, so that
# the CPU tests (V = 64/128) exercise the V loop. Not yet compiled for sm_90a nor timed.
CONFIGS = [triton.Config({"BV": bv}, num_warps=nw, num_stages=ns)
           for bv, nw, ns in [(32, 4, 2), (64, 8, 2), (64, 4, 2), (32, 8, 2), (128, 8, 2)]]


def config_name(c) -> str:
    return f"BV{c.kwargs['BV']}-w{c.num_warps}-s{c.num_stages}"


def _prune(configs, named_args, **kwargs):
    V = kwargs.get("V", named_args.get("V"))
    kept = [c for c in configs if c.kwargs["BV"] <= max(V, 32)]
    return kept or list(configs[:1])


@triton.jit(do_not_specialize=["T"])
def wy_dqkwg_bwd_kernel(
    q,  # [B, T, H, K] (l2-normalized where the op normalizes)
    k,  # [B, T, H, K]
    v,  # [B, T, HV, V]
    v_new,  # [B, T, HV, V]
    g,  # [B, T, HV] fp32, chunk-local cumulative log2 gate
    beta,  # [B, T, HV]
    A,  # [B, T, HV, BT]: (I + L)^-1, lower triangular
    h,  # [B, NT, HV, K, V]: the state before each chunk
    dh,  # [B, NT, HV, K, V]: the gradient of the state after each chunk
    do,  # [B, T, HV, V]
    dv2,  # [B, T, HV, V]: the full gradient of v_new
    zt,  # [B * NT, HV, 2, BT, BT] scratch ((ds * Gamma) and Z, read back transposed)
    dq,  # [B, T, H, K]
    dk,  # [B, T, H, K]
    dv,  # [B, T, HV, V]
    db,  # [B, T, HV] fp32
    dg,  # [B, T, HV] fp32 (reverse-cumsummed within the chunk)
    cu_seqlens,  # [N + 1] | unused
    chunk_indices,  # [NT, 2] | unused
    scale,
    T,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, KP: tl.constexpr, BV: tl.constexpr,
    IS_VARLEN: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    i_t = tl.program_id(0).to(tl.int64)
    i_bh = tl.program_id(1).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    G: tl.constexpr = HV // H
    if IS_VARLEN:
        i_tg = i_t
        i_n = tl.load(chunk_indices + i_t * 2).to(tl.int64)
        i_t = tl.load(chunk_indices + i_t * 2 + 1).to(tl.int64)
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
        T = (eos - bos).to(tl.int32)
    else:
        i_tg = i_b * tl.cdiv(T, BT) + i_t
        bos = i_b * T
    t0 = i_t * BT
    n_t = T - t0  # tokens left in the sequence from this chunk on (>= 1)
    last = tl.minimum(n_t, BT) - 1

    o_i = tl.arange(0, BT)
    m_t = o_i < n_t
    o_k = tl.arange(0, KP)
    m_k = o_k < K
    m_tk = m_t[:, None] & m_k[None, :]
    m_kt = m_k[:, None] & m_t[None, :]
    m_tt = m_t[:, None] & m_t[None, :]
    m_lower = (o_i[:, None] >= o_i[None, :]) & m_tt  # [i, j], i >= j, both tokens valid
    m_upper = (o_i[:, None] <= o_i[None, :]) & m_tt  # the transposed mask, [j, i]
    m_strict = (o_i[:, None] > o_i[None, :]) & m_tt

    # Per-chunk base pointers (int64); offsets inside a chunk fit in int32.
    row0 = bos + t0
    q += (row0 * H + i_h) * K
    k += (row0 * H + i_h) * K
    dq += (row0 * H + i_h) * K
    dk += (row0 * H + i_h) * K
    dt_in = q.dtype.element_ty

    b_kt = tl.load(k + o_i[None, :] * (H * K) + o_k[:, None], mask=m_kt, other=0.0)  # k^T from memory

    b_dq = tl.zeros([BT, KP], dtype=tl.float32)
    b_dk = tl.zeros([BT, KP], dtype=tl.float32)
    r_q0 = tl.zeros([BT], dtype=tl.float32)  # rowsum(dq * q), rowsum(dk * k) of the heads before
    r_k0 = tl.zeros([BT], dtype=tl.float32)
    for i_g in range(G):
        i_hv = i_h * G + i_g
        p_g = g + row0 * HV + i_hv
        p_b = beta + row0 * HV + i_hv
        b_g = tl.load(p_g + o_i * HV, mask=m_t, other=0.0).to(tl.float32)
        b_gl = tl.load(p_g + last * HV).to(tl.float32)
        b_beta = tl.load(p_b + o_i * HV, mask=m_t, other=0.0).to(tl.float32)
        b_gam = tl.where(m_t, tl.exp2(b_g), 0.0)
        b_decay = tl.where(m_t, tl.exp2(b_gl - b_g), 0.0)  # gamma_L / gamma, <= 1
        b_bg = b_beta * b_gam
        p_A = A + (row0 * HV + i_hv) * BT
        b_at = tl.load(p_A + o_i[None, :] * (HV * BT) + o_i[:, None], mask=m_tt, other=0.0)  # A^T [j, i]
        b_at = tl.where(m_upper, b_at, 0.0).to(dt_in)
        p_h = h + (i_tg * HV + i_hv) * K * V
        p_dh = dh + (i_tg * HV + i_hv) * K * V
        p_v = v + (row0 * HV + i_hv) * V
        p_vn = v_new + (row0 * HV + i_hv) * V
        p_do = do + (row0 * HV + i_hv) * V
        p_dv2 = dv2 + (row0 * HV + i_hv) * V
        p_dv = dv + (row0 * HV + i_hv) * V

        # fp32 accumulators over V: dq and dk (the group's, gate factors folded into the
        # operands), ds = do vn^T, dA_u = dv2 (beta V)^T, D = dv2 (K S)^T. dw = -dv2 S^T is never
        # held: its dk term -(diag(beta gamma) A^T dv2) S^T goes to dk here, and the terms that
        # need rowsum(A^T dw * K) take it from D (below).
        b_ds = tl.zeros([BT, BT], dtype=tl.float32)
        b_dau = tl.zeros([BT, BT], dtype=tl.float32)
        b_D = tl.zeros([BT, BT], dtype=tl.float32)
        b_db = tl.zeros([BT], dtype=tl.float32)
        b_hdh = tl.zeros([1], dtype=tl.float32)  # sum(S * dS)
        b_dos_f = b_gam * scale
        for i_v in range(tl.cdiv(V, BV)):
            o_v = i_v * BV + tl.arange(0, BV)
            m_v = o_v < V
            m_tv = m_t[:, None] & m_v[None, :]
            m_vt = m_v[:, None] & m_t[None, :]
            m_vk = m_v[:, None] & m_k[None, :]
            b_do = tl.load(p_do + o_i[:, None] * (HV * V) + o_v[None, :], mask=m_tv, other=0.0)
            b_vn = tl.load(p_vn + o_i[:, None] * (HV * V) + o_v[None, :], mask=m_tv, other=0.0)
            b_dvn = tl.load(p_dv2 + o_i[:, None] * (HV * V) + o_v[None, :], mask=m_tv, other=0.0).to(dt_in)
            b_vnt = tl.load(p_vn + o_i[None, :] * (HV * V) + o_v[:, None], mask=m_vt, other=0.0)
            b_vt = tl.load(p_v + o_i[None, :] * (HV * V) + o_v[:, None], mask=m_vt, other=0.0)
            # S^T and dS^T [BV, K] tiles of the [K, V] states, loaded transposed
            b_ht = tl.load(p_h + o_k[None, :] * V + o_v[:, None], mask=m_vk, other=0.0).to(dt_in)
            b_dht = tl.load(p_dh + o_k[None, :] * V + o_v[:, None], mask=m_vk, other=0.0).to(dt_in)
            b_hdh += tl.sum(tl.sum(b_ht.to(tl.float32) * b_dht.to(tl.float32), 1), 0)

            b_dog = (b_do.to(tl.float32) * b_dos_f[:, None]).to(dt_in)
            b_dq = tl.dot(b_dog, b_ht, b_dq, input_precision=DOT_PRECISION)
            b_vnd = (b_vn.to(tl.float32) * b_decay[:, None]).to(dt_in)
            b_dk = tl.dot(b_vnd, b_dht, b_dk, input_precision=DOT_PRECISION)
            b_ds = tl.dot(b_do, b_vnt, b_ds, input_precision=DOT_PRECISION)
            b_vbt = (b_vt.to(tl.float32) * b_beta[None, :]).to(dt_in)
            b_dau = tl.dot(b_dvn, b_vbt, b_dau, input_precision=DOT_PRECISION)
            b_kht = tl.dot(b_ht, b_kt, input_precision=DOT_PRECISION).to(dt_in)  # (K S)^T of this V block
            b_D = tl.dot(b_dvn, b_kht, b_D, input_precision=DOT_PRECISION)
            # u = A diag(beta) V:  dv = diag(beta) A^T dv2, dbeta += rowsum(A^T dv2 * V)
            b_dvb = tl.dot(b_at, b_dvn, input_precision=DOT_PRECISION)
            b_v = tl.load(p_v + o_i[:, None] * (HV * V) + o_v[None, :], mask=m_tv, other=0.0)
            b_db += tl.sum(b_dvb * b_v.to(tl.float32), 1)
            tl.store(p_dv + o_i[:, None] * (HV * V) + o_v[None, :],
                     (b_dvb * b_beta[:, None]).to(dv.dtype.element_ty), mask=m_tv)
            # w = A diag(beta gamma) K:  dk += diag(beta gamma) A^T dw = -(diag(beta gamma) A^T dv2) S^T
            b_dk = tl.dot((b_dvb * (-b_bg)[:, None]).to(dt_in), b_ht, b_dk, input_precision=DOT_PRECISION)

        b_q = tl.load(q + o_i[:, None] * (H * K) + o_k[None, :], mask=m_tk, other=0.0)
        b_k = tl.load(k + o_i[:, None] * (H * K) + o_k[None, :], mask=m_tk, other=0.0)
        # rowsum(A^T dw * K)_i = -sum_j A_ji D_ji, A loaded as stored
        b_a = tl.load(p_A + o_i[:, None] * (HV * BT) + o_i[None, :], mask=m_tt, other=0.0)
        b_a = tl.where(m_lower, b_a, 0.0).to(tl.float32)
        b_dkk = -tl.sum(b_a * b_D, 0)
        # this head's state part of rowsum(dk * K) (for the last row's dG)
        b_rk = tl.sum(b_dk * b_k.to(tl.float32), 1) - r_k0
        s_state = tl.sum(b_rk - b_bg * b_dkk, 0)
        b_dgl = tl.exp2(b_gl) * tl.sum(b_hdh, 0) + s_state

        # Gamma and its transpose, formed with where before any product (exp2 overflows above
        # the diagonal; 0 * inf would be NaN)
        b_Gam = tl.where(m_lower, tl.exp2(tl.where(m_lower, b_g[:, None] - b_g[None, :], 0.0)), 0.0)
        # Output, intra-chunk: dq += scale (ds * Gamma) K, dk += scale (ds * Gamma)^T Q
        b_dsg = (b_ds * b_Gam * scale).to(dt_in)
        b_dq = tl.dot(b_dsg, b_k, b_dq, input_precision=DOT_PRECISION)

        # A = (I + L)^-1:  dL = -A^T dA A^T on the strict lower triangle,
        # dA = dw (beta gamma K)^T + dv2 (beta V)^T = dA_u - D diag(beta gamma)
        b_da = tl.where(m_strict, b_dau - b_D * b_bg[None, :], 0.0).to(dt_in)
        b_da = tl.dot(b_at, b_da, input_precision=DOT_PRECISION).to(dt_in)
        b_da = tl.dot(b_da, b_at, input_precision=DOT_PRECISION)
        b_z = tl.where(m_strict, -b_da * b_Gam, 0.0)  # dL * Gamma

        # (ds * Gamma)^T and Z^T through memory, never as transposed dot results
        p_zt = zt + (i_tg * HV + i_hv) * 2 * BT * BT
        tl.store(p_zt + o_i[:, None] * BT + o_i[None, :], b_dsg)
        tl.store(p_zt + BT * BT + o_i[:, None] * BT + o_i[None, :], b_z.to(dt_in))
        tl.debug_barrier()
        b_dstg = tl.load(p_zt + o_i[None, :] * BT + o_i[:, None])
        b_ztl = tl.load(p_zt + BT * BT + o_i[None, :] * BT + o_i[:, None])
        b_dk = tl.dot(b_dstg, b_q, b_dk, input_precision=DOT_PRECISION)

        b_q32 = b_q.to(tl.float32)
        b_k32 = b_k.to(tl.float32)
        # dG: rowsum(dq * Q) - rowsum(dk_out,state * K) + beta gamma rowsum(A^T dw * K) + ...
        b_dgh = (tl.sum(b_dq * b_q32, 1) - r_q0) - (tl.sum(b_dk * b_k32, 1) - r_k0) + 2.0 * b_bg * b_dkk
        b_dgh += tl.where(o_i == last, b_dgl, 0.0)
        b_db += b_gam * b_dkk

        b_kk = tl.dot(b_k, b_kt, input_precision=DOT_PRECISION)  # K K^T
        b_zk = b_z * b_kk
        b_db += tl.sum(b_zk, 1)
        b_zl = b_zk * b_beta[:, None]  # dL * L
        b_dgh += tl.sum(b_zl, 1) - tl.sum(b_zl, 0)
        b_dk = tl.dot((b_z * b_beta[:, None]).to(dt_in), b_k, b_dk, input_precision=DOT_PRECISION)
        b_kb = (b_k32 * b_beta[:, None]).to(dt_in)
        b_dk = tl.dot(b_ztl, b_kb, b_dk, input_precision=DOT_PRECISION)
        if G > 1:
            r_q0 = tl.sum(b_dq * b_q32, 1)
            r_k0 = tl.sum(b_dk * b_k32, 1)

        # dbeta, and dG reverse-cumsummed within the chunk: dg_t = sum over s >= t of dG_s
        tl.store(db + row0 * HV + i_hv + o_i * HV, b_db.to(db.dtype.element_ty), mask=m_t)
        b_dgh = tl.where(m_t, b_dgh, 0.0)
        b_rc = tl.sum(b_dgh, 0) - tl.cumsum(b_dgh, 0) + b_dgh
        tl.store(dg + row0 * HV + i_hv + o_i * HV, b_rc.to(dg.dtype.element_ty), mask=m_t)

    tl.store(dq + o_i[:, None] * (H * K) + o_k[None, :], b_dq.to(dq.dtype.element_ty), mask=m_tk)
    tl.store(dk + o_i[:, None] * (H * K) + o_k[None, :], b_dk.to(dk.dtype.element_ty), mask=m_tk)


wy_dqkwg_bwd_kernel_tuned = triton.autotune(
    configs=autotune_configs(CONFIGS), **autotune_cache(),
    key=["H", "HV", "K", "V", "BT", "IS_VARLEN"],
    prune_configs_by={"early_config_prune": _prune},
)(wy_dqkwg_bwd_kernel)

# Every output is allocated through this name, so that tests can poison outputs with NaN.
_alloc = torch.empty


def wy_dqkwg_bwd(q, k, v, v_new, g, beta, A, h, dh, do, dv2, scale, cu_seqlens=None, chunk_indices=None,
                 chunk_size: int = 64, out_dtype=None, *, config: triton.Config | None = None):
    """The GDN backward's per-chunk gradients (fla's ``chunk_bwd_dqkwg`` + ``prepare_wy_repr_bwd``
    + the dk/dg adds + the reverse cumsum of dg + the group sum of dq, dk), in one launch.

    q, k ``[B, T, H, K]``; v, v_new, do, dv2 ``[B, T, HV, V]`` (dv2: the full gradient of v_new,
    from the backward state scan); g ``[B, T, HV]`` fp32 chunk-local cumulative log2 gate; beta
    ``[B, T, HV]`` (activated); A ``[B, T, HV, BT]`` (fla's forward intra stage's inverse); h,
    dh ``[B, NT, HV, K, V]`` (the states before each chunk and their gradients after it, key-major);
    cu_seqlens ``[N + 1]`` with chunk_indices ``[NT, 2]`` (fla's prepare_chunk_indices) for packed
    documents. Returns ``(dq, dk [B, T, H, K]`` in ``out_dtype`` (q's by default), ``dv [B, T, HV, V]``
    in v's dtype, ``dbeta [B, T, HV]`` fp32, ``dg [B, T, HV]`` fp32: the gradient of the per-token
    natural-log gate, already reverse-cumsummed).
    """
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    BT = chunk_size
    if HV % H or K > 256 or tuple(k.shape) != (B, T, H, K):
        raise ValueError(f"wy_dqkwg_bwd: q {tuple(q.shape)} k {tuple(k.shape)} v {tuple(v.shape)}")
    for name, t in (("v_new", v_new), ("do", do), ("dv2", dv2)):
        if tuple(t.shape) != (B, T, HV, V):
            raise ValueError(f"wy_dqkwg_bwd: {name} {tuple(t.shape)} must be {(B, T, HV, V)}")
    if tuple(g.shape) != (B, T, HV) or tuple(beta.shape) != (B, T, HV) or tuple(A.shape) != (B, T, HV, BT):
        raise ValueError(f"wy_dqkwg_bwd: g {tuple(g.shape)} beta {tuple(beta.shape)} A {tuple(A.shape)}")
    is_varlen = cu_seqlens is not None
    if is_varlen:
        if B != 1 or chunk_indices is None:
            raise ValueError("wy_dqkwg_bwd: cu_seqlens needs B == 1 and chunk_indices")
        NT = len(chunk_indices)
    else:
        NT = triton.cdiv(T, BT)
    if tuple(h.shape) != (B, NT, HV, K, V):
        raise ValueError(f"wy_dqkwg_bwd: h {tuple(h.shape)} must be {(B, NT, HV, K, V)}")
    if tuple(dh.shape) != tuple(h.shape):
        raise ValueError(f"wy_dqkwg_bwd: dh {tuple(dh.shape)} must be h's {tuple(h.shape)}")
    q, k, v, v_new, g, beta, A, h, dh, do, dv2 = (
        x.contiguous() for x in (q, k, v, v_new, g, beta, A, h, dh, do, dv2))
    out_dtype = out_dtype or q.dtype
    dq = _alloc((B, T, H, K), dtype=out_dtype, device=q.device)
    dk = _alloc((B, T, H, K), dtype=out_dtype, device=q.device)
    dv = _alloc((B, T, HV, V), dtype=v.dtype, device=q.device)
    db = _alloc((B, T, HV), dtype=torch.float32, device=q.device)
    dg = _alloc((B, T, HV), dtype=torch.float32, device=q.device)
    zt = torch.empty((B * NT, HV, 2, BT, BT), dtype=q.dtype, device=q.device)  # scratch, fully rewritten
    args = dict(
        q=q, k=k, v=v, v_new=v_new, g=g, beta=beta, A=A, h=h, dh=dh, do=do, dv2=dv2, zt=zt,
        dq=dq, dk=dk, dv=dv, db=db, dg=dg,
        cu_seqlens=cu_seqlens if is_varlen else dq, chunk_indices=chunk_indices if is_varlen else dq,
        scale=float(scale), T=T, H=H, HV=HV, K=K, V=V, BT=BT, KP=max(16, triton.next_power_of_2(K)),
        IS_VARLEN=is_varlen, DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
    )
    grid = (NT, B * H)
    if config is not None:
        wy_dqkwg_bwd_kernel[grid](**args, **config.all_kwargs())
    else:
        wy_dqkwg_bwd_kernel_tuned[grid](**args)
    record_launch("gdn.wy_dqkwg_bwd")
    return dq, dk, dv, db, dg
