"""GDN's forward intra stage with its inputs, in one launch: what ``inputs_fwd.py`` and
``wy_inverse.py`` make one after the other (the l2norm of q and k, beta's sigmoid, the gate with
its chunk-local cumulative sum, a strided v copied, then the WY inverse A), from one program per
(chunk, qk head) that holds the chunk's normalized k rows for K K^T where ``wy_inverse`` read
them back from memory, in place of two launches.

    q_n, k_n = q / sqrt(sum(q^2) + eps), k / sqrt(sum(k^2) + eps)   (rows, in q's dtype; rstd fp32)
    beta   = beta_scale * sigmoid(beta_raw)                      (fp32; or beta as given)
    gc     = gate_scale * cumsum_within_chunk(gate)               (fp32, log2 units)
    A      = (I + StrictLower(diag(beta) (K_n K_n^T * Gamma)))^-1  (per value head, k's dtype)

One warp a program, as ``wy_inverse`` (a [16, 16] tile is one warp's; more warps repeat the
substitution). The rows are handled as four [16, BK] blocks a K slice, in two passes: the first
sums the squares of q's and k's rows, the second loads them again (from L2: the program read them
a moment before), writes q_n and k_n, and accumulates K_n K_n^T from the k_n it writes, so A is
made from exactly the rounded k the scans read (as before). Then, per value head of the group
(G = HV / H): the gate and beta of the chunk's 64 tokens (four [16] blocks, the cumulative sum
carried across them), stored, v's rows copied where v is strided, and the inverse
(``wy_inverse.invert_store``) from the gate and beta in registers.
Taken whenever the op normalizes q and k (``gdn.chain.inputs_forward``).
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
from kernel_fun._delta.gate import gate_value
from kernel_fun.gdn._kernels.wy_inverse import invert_store, kk_step

install_interpreter_shims()

# The first is the interpreter's. BK: the K slice of a pass; BVC: the columns of v a copy step moves.
CONFIGS = [triton.Config({"BK": bk}, num_warps=nw, num_stages=2) for bk, nw in [(64, 1), (32, 1), (64, 2)]]
CANDIDATES: list = []


@triton.jit
def _rows(p, o_k, m, m_k):
    return tl.load(p + o_k[None, :], mask=m[:, None] & m_k, other=0.0).to(tl.float32)


@triton.jit
def _normalized(p_in, p_out, r, o_k, m, m_k):
    """A [16, BK] block of rows scaled by their rstd r, stored at ``p_out`` and returned (rounded)."""
    b = (_rows(p_in, o_k, m, m_k) * r[:, None]).to(p_out.dtype.element_ty)
    tl.store(p_out + o_k[None, :], b, mask=m[:, None] & m_k)
    return b


@triton.jit
def _gate_block(g, beta, gc, beta_out, A_log, dt_bias, p, m, carry, gate_scale, beta_scale,
                GATE_IN_KERNEL: tl.constexpr, HAS_DT_BIAS: tl.constexpr, BETA_SIGMOID: tl.constexpr,
                STORE_BETA: tl.constexpr):
    """16 tokens of a value head: (cumulative gate times gate_scale, beta, the gate's running sum),
    gc and beta stored. ``carry``: the sum of the chunk's earlier gates (natural log units)."""
    b_g = tl.load(g + p, mask=m, other=0.0).to(tl.float32)
    b_b = tl.load(beta + p, mask=m, other=0.0).to(tl.float32)
    if GATE_IN_KERNEL:
        if HAS_DT_BIAS:
            b_g += tl.load(dt_bias).to(tl.float32)
        b_g = gate_value(b_g, -tl.exp(tl.load(A_log).to(tl.float32)))
    b_g = tl.where(m, b_g, 0.0)
    b_c = (tl.cumsum(b_g, axis=0) + carry) * gate_scale
    tl.store(gc + p, b_c, mask=m)
    if BETA_SIGMOID:
        b_b = beta_scale * tl.sigmoid(b_b)
    if STORE_BETA:
        tl.store(beta_out + p, b_b, mask=m)
    return b_c, b_b, carry + tl.sum(b_g, axis=0)


@triton.jit(do_not_specialize=["T"])
def inputs_wy_fwd_kernel(
    q, k,  # [B, T, H, K], any strides with the last 1
    v, v_out,  # [B, T, HV, V], any strides with the last 1; its contiguous copy (COPY_V)
    g,  # [B, T, HV]: the raw gate input (GATE_IN_KERNEL) or the per-token log gate
    beta,  # [B, T, HV]: raw (BETA_SIGMOID) or as given
    A_log, dt_bias,  # [HV] fp32 (GATE_IN_KERNEL; dt_bias when HAS_DT_BIAS)
    q_out, q_rstd, k_out, k_rstd,  # [B, T, H, K] in q's dtype; [B, T, H] fp32
    gc,  # [B, T, HV] fp32 out: the chunk-local cumulative gate times gate_scale
    beta_out,  # [B, T, HV] fp32 out (STORE_BETA)
    A,  # [B, T, HV, BT] out, k's dtype
    cu_seqlens, chunk_indices,
    T,
    WORK,  # autotune key only: tuning.chunk_work(chunks x qk heads)
    s_qb, s_qt, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh,
    gate_scale, beta_scale, eps,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    GATE_IN_KERNEL: tl.constexpr, HAS_DT_BIAS: tl.constexpr, BETA_SIGMOID: tl.constexpr, IS_VARLEN: tl.constexpr,
    COPY_V: tl.constexpr, V: tl.constexpr, BVC: tl.constexpr, STORE_BETA: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    tl.static_assert(BT == 64)
    i_b, i_h, _, _, row0, n_valid = chunk_program(cu_seqlens, chunk_indices, T, H, H, BT, IS_VARLEN)
    G: tl.constexpr = HV // H
    t_local = row0 - i_b * T  # the token within its batch row (varlen: B == 1, so row0)
    o = tl.arange(0, 16)
    m0 = o < n_valid
    m1 = (16 + o) < n_valid
    m2 = (32 + o) < n_valid
    m3 = (48 + o) < n_valid
    p_q = q + i_b * s_qb + (t_local + o)[:, None] * s_qt + i_h * s_qh
    p_k = k + i_b * s_kb + (t_local + o)[:, None] * s_kt + i_h * s_kh
    # pass 1: the rows' sums of squares
    sq0 = tl.zeros([16], dtype=tl.float32)
    sq1 = tl.zeros([16], dtype=tl.float32)
    sq2 = tl.zeros([16], dtype=tl.float32)
    sq3 = tl.zeros([16], dtype=tl.float32)
    sk0 = tl.zeros([16], dtype=tl.float32)
    sk1 = tl.zeros([16], dtype=tl.float32)
    sk2 = tl.zeros([16], dtype=tl.float32)
    sk3 = tl.zeros([16], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = (o_k < K)[None, :]
        b = _rows(p_q, o_k, m0, m_k)
        sq0 += tl.sum(b * b, axis=1)
        b = _rows(p_q + 16 * s_qt, o_k, m1, m_k)
        sq1 += tl.sum(b * b, axis=1)
        b = _rows(p_q + 32 * s_qt, o_k, m2, m_k)
        sq2 += tl.sum(b * b, axis=1)
        b = _rows(p_q + 48 * s_qt, o_k, m3, m_k)
        sq3 += tl.sum(b * b, axis=1)
        b = _rows(p_k, o_k, m0, m_k)
        sk0 += tl.sum(b * b, axis=1)
        b = _rows(p_k + 16 * s_kt, o_k, m1, m_k)
        sk1 += tl.sum(b * b, axis=1)
        b = _rows(p_k + 32 * s_kt, o_k, m2, m_k)
        sk2 += tl.sum(b * b, axis=1)
        b = _rows(p_k + 48 * s_kt, o_k, m3, m_k)
        sk3 += tl.sum(b * b, axis=1)
    rq0 = 1.0 / tl.sqrt(sq0 + eps)
    rq1 = 1.0 / tl.sqrt(sq1 + eps)
    rq2 = 1.0 / tl.sqrt(sq2 + eps)
    rq3 = 1.0 / tl.sqrt(sq3 + eps)
    rk0 = 1.0 / tl.sqrt(sk0 + eps)
    rk1 = 1.0 / tl.sqrt(sk1 + eps)
    rk2 = 1.0 / tl.sqrt(sk2 + eps)
    rk3 = 1.0 / tl.sqrt(sk3 + eps)
    p_r = (row0 + o) * H + i_h
    tl.store(q_rstd + p_r, rq0, mask=m0)
    tl.store(q_rstd + p_r + 16 * H, rq1, mask=m1)
    tl.store(q_rstd + p_r + 32 * H, rq2, mask=m2)
    tl.store(q_rstd + p_r + 48 * H, rq3, mask=m3)
    tl.store(k_rstd + p_r, rk0, mask=m0)
    tl.store(k_rstd + p_r + 16 * H, rk1, mask=m1)
    tl.store(k_rstd + p_r + 32 * H, rk2, mask=m2)
    tl.store(k_rstd + p_r + 48 * H, rk3, mask=m3)
    # pass 2: q_n, k_n written; K_n K_n^T from the k_n written
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
    p_qo = q_out + p_r[:, None] * K
    p_ko = k_out + p_r[:, None] * K
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = (o_k < K)[None, :]
        _normalized(p_q, p_qo, rq0, o_k, m0, m_k)
        _normalized(p_q + 16 * s_qt, p_qo + 16 * H * K, rq1, o_k, m1, m_k)
        _normalized(p_q + 32 * s_qt, p_qo + 32 * H * K, rq2, o_k, m2, m_k)
        _normalized(p_q + 48 * s_qt, p_qo + 48 * H * K, rq3, o_k, m3, m_k)
        b_k0 = _normalized(p_k, p_ko, rk0, o_k, m0, m_k)
        b_k1 = _normalized(p_k + 16 * s_kt, p_ko + 16 * H * K, rk1, o_k, m1, m_k)
        b_k2 = _normalized(p_k + 32 * s_kt, p_ko + 32 * H * K, rk2, o_k, m2, m_k)
        b_k3 = _normalized(p_k + 48 * s_kt, p_ko + 48 * H * K, rk3, o_k, m3, m_k)
        kk00, kk11, kk22, kk33, kk10, kk20, kk21, kk30, kk31, kk32 = kk_step(
            kk00, kk11, kk22, kk33, kk10, kk20, kk21, kk30, kk31, kk32, b_k0, b_k1, b_k2, b_k3, DOT_PRECISION)
    for j in range(G):  # the group's value heads: gate, beta, v's rows, the inverse
        i_v = i_h * G + j
        if COPY_V:
            o_t = tl.arange(0, BT)
            m_t = (o_t < n_valid)[:, None]
            p_v = v + i_b * s_vb + (t_local + o_t)[:, None] * s_vt + i_v * s_vh
            p_vo = v_out + (row0 + o_t)[:, None] * (HV * V) + i_v * V
            for i_c in range(tl.cdiv(V, BVC)):
                o_c = i_c * BVC + tl.arange(0, BVC)
                m_tc = m_t & (o_c < V)[None, :]
                tl.store(p_vo + o_c[None, :], tl.load(p_v + o_c[None, :], mask=m_tc, other=0.0), mask=m_tc)
        p_gb = (row0 + o) * HV + i_v
        carry = tl.zeros([], dtype=tl.float32)
        g0, b0, carry = _gate_block(g, beta, gc, beta_out, A_log + i_v, dt_bias + i_v, p_gb, m0, carry, gate_scale,
                                    beta_scale, GATE_IN_KERNEL, HAS_DT_BIAS, BETA_SIGMOID, STORE_BETA)
        g1, b1, carry = _gate_block(g, beta, gc, beta_out, A_log + i_v, dt_bias + i_v, p_gb + 16 * HV, m1, carry,
                                    gate_scale, beta_scale, GATE_IN_KERNEL, HAS_DT_BIAS, BETA_SIGMOID, STORE_BETA)
        g2, b2, carry = _gate_block(g, beta, gc, beta_out, A_log + i_v, dt_bias + i_v, p_gb + 32 * HV, m2, carry,
                                    gate_scale, beta_scale, GATE_IN_KERNEL, HAS_DT_BIAS, BETA_SIGMOID, STORE_BETA)
        g3, b3, carry = _gate_block(g, beta, gc, beta_out, A_log + i_v, dt_bias + i_v, p_gb + 48 * HV, m3, carry,
                                    gate_scale, beta_scale, GATE_IN_KERNEL, HAS_DT_BIAS, BETA_SIGMOID, STORE_BETA)
        invert_store(kk00, kk11, kk22, kk33, kk10, kk20, kk21, kk30, kk31, kk32, g0, g1, g2, g3, b0, b1, b2, b3,
                     m0, m1, m2, m3, A + (row0 * HV + i_v) * BT, n_valid, HV, BT, DOT_PRECISION)


inputs_wy_fwd_kernel_tuned = triton.autotune(
    configs=autotune_configs(CONFIGS), **autotune_cache(),
    key=["H", "HV", "K", "GATE_IN_KERNEL", "HAS_DT_BIAS", "BETA_SIGMOID", "IS_VARLEN", "COPY_V", "V", "WORK"],
)(inputs_wy_fwd_kernel)


def inputs_wy_fwd(q, k, v, g, beta, A_log, dt_bias, gate_in_kernel: bool, beta_sigmoid: bool, beta_scale: float,
                  gate_scale: float, cu_seqlens=None, chunk_indices=None, chunk_size: int = 64, eps: float = 1e-6,
                  *, config: triton.Config | None = None):
    """``(q, q_rstd, k, k_rstd, v, gc, beta, A)``: ``inputs_fwd``'s seven returns (q, k ``[B, T, H,
    K]`` with any strides, the last 1, l2-normalized into contiguous tensors; v contiguous, copied
    in the launch where strided; gc, beta fp32, an fp32 beta as given handed on) and ``wy_inverse``'s
    A ``[B, T, HV, 64]`` in k's dtype made from the normalized k, gc and beta. One launch."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    BT = chunk_size
    if (BT != 64 or tuple(k.shape) != (B, T, H, K) or v.shape[:2] != (B, T) or tuple(g.shape) != (B, T, HV)
            or tuple(beta.shape) != (B, T, HV) or HV % H):
        raise ValueError(f"inputs_wy_fwd: q {tuple(q.shape)} k {tuple(k.shape)} v {tuple(v.shape)} "
                         f"g {tuple(g.shape)} beta {tuple(beta.shape)} BT={BT}")
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    copy_v = not v.is_contiguous()
    v_out = alloc(tuple(v.shape), dtype=v.dtype, device=v.device) if copy_v else v
    g, beta = g.contiguous(), beta.contiguous()
    is_varlen = cu_seqlens is not None
    NT = len(chunk_indices) if is_varlen else cdiv(T, BT)
    q_out, k_out = (alloc((B, T, H, K), dtype=x.dtype, device=x.device) for x in (q, k))
    q_rstd, k_rstd = (alloc((B, T, H), dtype=torch.float32, device=q.device) for _ in range(2))
    gc = alloc((B, T, HV), dtype=torch.float32, device=q.device)
    store_beta = beta_sigmoid or beta.dtype != torch.float32  # an fp32 beta as given is handed on as it is
    beta_out = alloc((B, T, HV), dtype=torch.float32, device=q.device) if store_beta else beta
    A = alloc((B, T, HV, BT), dtype=k.dtype, device=k.device)
    dummy = gc
    launch(inputs_wy_fwd_kernel_tuned, (NT, B * H), config,
           q=q, k=k, v=v, v_out=v_out, g=g, beta=beta, A_log=A_log if gate_in_kernel else dummy,
           dt_bias=dt_bias if (gate_in_kernel and dt_bias is not None) else dummy,
           q_out=q_out, q_rstd=q_rstd, k_out=k_out, k_rstd=k_rstd, gc=gc, beta_out=beta_out, A=A,
           cu_seqlens=cu_seqlens if is_varlen else dummy, chunk_indices=chunk_indices if is_varlen else dummy, T=T,
           WORK=chunk_work(B, T, BT, H),
           s_qb=q.stride(0), s_qt=q.stride(1), s_qh=q.stride(2), s_kb=k.stride(0), s_kt=k.stride(1), s_kh=k.stride(2),
           s_vb=v.stride(0), s_vt=v.stride(1), s_vh=v.stride(2),
           gate_scale=float(gate_scale), beta_scale=float(beta_scale), eps=float(eps),
           H=H, HV=HV, K=K, BT=BT,
           GATE_IN_KERNEL=bool(gate_in_kernel), HAS_DT_BIAS=bool(gate_in_kernel and dt_bias is not None),
           BETA_SIGMOID=bool(beta_sigmoid), STORE_BETA=store_beta, IS_VARLEN=is_varlen,
           COPY_V=copy_v, V=V, BVC=min(32, max(16, next_pow2(V))),
           DOT_PRECISION="ieee" if k.dtype == torch.float32 else "tf32")
    record_launch("gdn.inputs_wy_fwd")
    return q_out, q_rstd, k_out, k_rstd, v_out, gc, beta_out, A
