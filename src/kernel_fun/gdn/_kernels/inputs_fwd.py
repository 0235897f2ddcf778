"""GDN's inputs, forward, in one launch: the l2norm of q and k, beta's sigmoid and the gate with its
chunk-local cumulative sum, where fla's entry runs four kernels (``l2norm_fwd`` twice,
``fused_beta_sigmoid_fwd``, ``gdn_gate_chunk_cumsum``) behind four Python wrappers, after
``.contiguous()`` copies of q, k and v (GatedDeltaNet's fused q/k/v conv hands over column
slices of one buffer; here they are read through their strides).

Per chunk (BT = 64 tokens) and value head (grid (NT, B x HV), ``_delta.chunking.chunk_program``):

    beta   = beta_scale * sigmoid(beta_raw)                  (fp32; or beta as given)
    gate   = -exp(A_log) * softplus(g + dt_bias)            (or g as given: the precomputed gate)
    gc     = gate_scale * cumsum_within_chunk(gate)          (fp32, log2 units with gate_scale = log2 e)

and the group's value heads (G = HV / H) share the normalization of their qk head's q and k rows
of the chunk, RB = BT / G (rounded up to a power of two) rows each: ``y = x / sqrt(sum(x^2) +
eps)`` in x's dtype, ``rstd`` fp32, as fla's ``l2norm_fwd``. softplus as fla's (``_delta.gate``).
Every program issues all its loads before its first store. At the model A/B's layer (B=4, T=4096,
H=16, HV=32, K=V=128, v a column slice) the kernel moves 536 MB, 125 us at the H200's copy rate: this
form 152 us, the first one (the group's first value head normalizing all 64 rows, each tensor
loaded, then stored, in turn) 165 us (``bench/records/2026-12-03-h200-stages-gdn-inputs-scores-*.json``).
A strided v (the buffer's column slice) is copied, each program its value
head's rows, into the contiguous tensor the chain's kernels read and the backward keeps (in place
of torch's strided copy, 0.16 ms a call in the model A/B at B=4, T=4096, HV=32, V=128); a
contiguous v is not copied.
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

install_interpreter_shims()

# The first is the interpreter's. Timed by `bench --stages gdn --kernel gdn.inputs_fwd` (docs/gdn.md).
# sm_90a (Triton 3.6, H=16 HV=32 K=128, the layer's flags, v copied, loads first, 2026-12-03):
# registers w4 180, w8 96, no stack (w2 spilled 296 B: dropped).
CONFIGS = [triton.Config({}, num_warps=nw) for nw in (4, 8)]
# At fla's default heads (K = 256, V = 512, G = 1: a program holds 64 rows of q, k and v) w4 spills 512 B
# and w8 takes 244 registers (8 warps an SM); w16 128, no stack (sm_90a, 2026-12-05), but no faster (H100,
# B=4 T=4096 H=6: w8 0.149 ms, w16 0.149, w4 0.208; bench/records/2026-12-05-h100-stages-gdn-inputs-k256-4c875cc.json):
# not kept.
CANDIDATES: list = []


@triton.jit(do_not_specialize=["T"])
def inputs_fwd_kernel(
    q, k,  # [B, T, H, K], any strides with the last 1
    v, v_out,  # [B, T, HV, V], any strides with the last 1; its contiguous copy (COPY_V)
    g,  # [B, T, HV]: the raw gate input (GATE_IN_KERNEL) or the per-token log gate
    beta,  # [B, T, HV]: raw (BETA_SIGMOID) or as given
    A_log, dt_bias,  # [HV] fp32 (GATE_IN_KERNEL; dt_bias when HAS_DT_BIAS)
    q_out, q_rstd, k_out, k_rstd,  # [B, T, H, K] in q's dtype; [B, T, H] fp32
    gc,  # [B, T, HV] fp32 out: the chunk-local cumulative gate times gate_scale
    beta_out,  # [B, T, HV] fp32 out (STORE_BETA): beta_scale * sigmoid(beta) (BETA_SIGMOID) or beta as given
    cu_seqlens, chunk_indices,
    T,
    WORK,  # autotune key only: tuning.chunk_work(chunks x value heads)
    s_qb, s_qt, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh,
    gate_scale, beta_scale, eps,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, BT: tl.constexpr, RB: tl.constexpr,
    GATE_IN_KERNEL: tl.constexpr, HAS_DT_BIAS: tl.constexpr, BETA_SIGMOID: tl.constexpr, IS_VARLEN: tl.constexpr,
    COPY_V: tl.constexpr = False, V: tl.constexpr = 64, VP: tl.constexpr = 64, STORE_BETA: tl.constexpr = True,
):
    i_b, i_hv, i_h, _, row0, n_valid = chunk_program(cu_seqlens, chunk_indices, T, H, HV, BT, IS_VARLEN)
    t_local = row0 - i_b * T  # the token within its batch row (varlen: B == 1, so row0)
    o_i = tl.arange(0, BT)
    m_t = o_i < n_valid
    p = row0 * HV + i_hv + o_i * HV
    # Every load is issued before the first store, so that a program's reads are in flight together
    # (not one tensor's load, then its store, then the next load).
    b_g = tl.load(g + p, mask=m_t, other=0.0)
    if STORE_BETA:
        b_b = tl.load(beta + p, mask=m_t, other=0.0)
    if COPY_V:
        o_v = tl.arange(0, VP)
        m_tv = m_t[:, None] & (o_v < V)[None, :]
        b_v = tl.load(v + i_b * s_vb + (t_local + o_i)[:, None] * s_vt + i_hv * s_vh + o_v[None, :], mask=m_tv,
                      other=0.0)
    # The group's value heads share its qk head's rows of the chunk, RB rows each.
    o_r = (i_hv % (HV // H)) * RB + tl.arange(0, RB)
    m_r = o_r < n_valid
    o_k = tl.arange(0, KP)
    m_rk = m_r[:, None] & (o_k < K)[None, :]
    b_q = tl.load(q + i_b * s_qb + (t_local + o_r)[:, None] * s_qt + i_h * s_qh + o_k[None, :], mask=m_rk,
                  other=0.0)
    b_k = tl.load(k + i_b * s_kb + (t_local + o_r)[:, None] * s_kt + i_h * s_kh + o_k[None, :], mask=m_rk,
                  other=0.0)

    b_g = b_g.to(tl.float32)
    if GATE_IN_KERNEL:
        if HAS_DT_BIAS:
            b_g += tl.load(dt_bias + i_hv).to(tl.float32)
        b_g = gate_value(b_g, -tl.exp(tl.load(A_log + i_hv).to(tl.float32)))
    b_g = tl.where(m_t, b_g, 0.0)
    tl.store(gc + p, tl.cumsum(b_g, axis=0) * gate_scale, mask=m_t)
    if BETA_SIGMOID:
        tl.store(beta_out + p, beta_scale * tl.sigmoid(b_b.to(tl.float32)), mask=m_t)
    elif STORE_BETA:  # the value as given, in fp32 (exact): see inputs_fwd
        tl.store(beta_out + p, b_b.to(tl.float32), mask=m_t)
    if COPY_V:
        tl.store(v_out + (row0 + o_i)[:, None] * (HV * V) + i_hv * V + o_v[None, :], b_v, mask=m_tv)
    # l2norm: y = x / sqrt(sum(x^2) + eps) in x's dtype, rstd fp32 (as fla's l2norm_fwd)
    p_r = (row0 + o_r) * H + i_h
    b_q = b_q.to(tl.float32)
    b_k = b_k.to(tl.float32)
    b_rq = 1.0 / tl.sqrt(tl.sum(b_q * b_q, axis=1) + eps)
    tl.store(q_out + p_r[:, None] * K + o_k[None, :], (b_q * b_rq[:, None]).to(q_out.dtype.element_ty), mask=m_rk)
    tl.store(q_rstd + p_r, b_rq, mask=m_r)
    b_rk = 1.0 / tl.sqrt(tl.sum(b_k * b_k, axis=1) + eps)
    tl.store(k_out + p_r[:, None] * K + o_k[None, :], (b_k * b_rk[:, None]).to(k_out.dtype.element_ty), mask=m_rk)
    tl.store(k_rstd + p_r, b_rk, mask=m_r)


def rows_per_head(BT: int, G: int) -> int:
    """Rows of a qk head's chunk that each of its G value heads' programs normalizes (RB): BT / G
    rounded up to a power of two (programs past the chunk's end have none)."""
    return next_pow2(cdiv(BT, G))


inputs_fwd_kernel_tuned = triton.autotune(
    configs=autotune_configs(CONFIGS), **autotune_cache(),
    key=["H", "HV", "K", "BT", "GATE_IN_KERNEL", "HAS_DT_BIAS", "BETA_SIGMOID", "IS_VARLEN", "COPY_V", "V", "WORK"],
)(inputs_fwd_kernel)


def inputs_fwd(q, k, v, g, beta, A_log, dt_bias, gate_in_kernel: bool, beta_sigmoid: bool, beta_scale: float,
               gate_scale: float, cu_seqlens=None, chunk_indices=None, chunk_size: int = 64, eps: float = 1e-6,
               *, config: triton.Config | None = None):
    """``(q, q_rstd, k, k_rstd, v, gc, beta)``: q, k ``[B, T, H, K]`` (any strides, the last 1)
    l2-normalized into contiguous tensors of their dtype with fp32 rstd ``[B, T, H]``; v ``[B, T,
    HV, V]`` contiguous (copied in the launch where it is strided); gc ``[B, T, HV]`` fp32, the
    chunk-local cumulative sum of the gate (``-exp(A_log) softplus(g + dt_bias)`` with
    ``gate_in_kernel``, else g itself) times ``gate_scale``; beta ``beta_scale * sigmoid(beta)``
    with ``beta_sigmoid``, else beta as given, in fp32 either way (an fp32 one itself, not copied):
    the scans load beta once a chunk as a strided [BT] vector, which Triton 3.6's pipeliner copies
    ahead at 4 bytes an element and leaves synchronous at 2 (a bf16 beta, what modeling code that
    applies the sigmoid itself passes, put that load on each scan's dependent chain; sm_90a TTGIR).
    One launch."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    BT = chunk_size
    if (tuple(k.shape) != (B, T, H, K) or v.shape[:2] != (B, T) or tuple(g.shape) != (B, T, HV)
            or tuple(beta.shape) != (B, T, HV) or HV % H):
        raise ValueError(f"inputs_fwd: q {tuple(q.shape)} k {tuple(k.shape)} v {tuple(v.shape)} g {tuple(g.shape)} "
                         f"beta {tuple(beta.shape)}")
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    copy_v = not v.is_contiguous()
    v_out = alloc(tuple(v.shape), dtype=v.dtype, device=v.device) if copy_v else v
    g, beta = g.contiguous(), beta.contiguous()
    is_varlen = cu_seqlens is not None
    NT = len(chunk_indices) if is_varlen else cdiv(T, BT)
    q_out, k_out = alloc((B, T, H, K), dtype=q.dtype, device=q.device), alloc((B, T, H, K), dtype=k.dtype,
                                                                            device=k.device)
    q_rstd, k_rstd = (alloc((B, T, H), dtype=torch.float32, device=q.device) for _ in range(2))
    gc = alloc((B, T, HV), dtype=torch.float32, device=q.device)
    store_beta = beta_sigmoid or beta.dtype != torch.float32  # an fp32 beta as given is handed on as it is
    beta_out = alloc((B, T, HV), dtype=torch.float32, device=q.device) if store_beta else beta
    dummy = gc
    launch(inputs_fwd_kernel_tuned, (NT, B * HV), config,
           q=q, k=k, v=v, v_out=v_out, g=g, beta=beta, A_log=A_log if gate_in_kernel else dummy,
           dt_bias=dt_bias if (gate_in_kernel and dt_bias is not None) else dummy,
           q_out=q_out, q_rstd=q_rstd, k_out=k_out, k_rstd=k_rstd, gc=gc, beta_out=beta_out,
           cu_seqlens=cu_seqlens if is_varlen else dummy, chunk_indices=chunk_indices if is_varlen else dummy, T=T,
           WORK=chunk_work(B, T, BT, HV),
           s_qb=q.stride(0), s_qt=q.stride(1), s_qh=q.stride(2), s_kb=k.stride(0), s_kt=k.stride(1), s_kh=k.stride(2),
           s_vb=v.stride(0), s_vt=v.stride(1), s_vh=v.stride(2),
           gate_scale=float(gate_scale), beta_scale=float(beta_scale), eps=float(eps),
           H=H, HV=HV, K=K, KP=max(16, next_pow2(K)), BT=BT, RB=rows_per_head(BT, HV // H),
           GATE_IN_KERNEL=bool(gate_in_kernel),
           HAS_DT_BIAS=bool(gate_in_kernel and dt_bias is not None), BETA_SIGMOID=bool(beta_sigmoid),
           STORE_BETA=store_beta,
           IS_VARLEN=is_varlen, COPY_V=copy_v, V=V, VP=max(16, next_pow2(V)))
    record_launch("gdn.inputs_fwd")
    return q_out, q_rstd, k_out, k_rstd, v_out, gc, beta_out
