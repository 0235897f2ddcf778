"""GDN's inputs, backward, in one launch (and one sum): the l2norm backward of q and k, beta's
sigmoid backward and the in-op gate's backward, where fla's entry runs ``l2norm_bwd`` twice,
``fused_beta_sigmoid_bwd`` and ``gdn_gate_bwd`` (a kernel and two sums).

Per chunk (BT = 64 tokens) and value head (grid (NT, B x HV)), as fla's kernels compute them:

    dbeta_raw = dbeta * beta_scale * s (1 - s),   s = sigmoid(beta_raw)
    x = g_raw + dt_bias,  dg_raw = -exp(A_log) * sigmoid(x) * dg,
    dA_log += sum_t dg * (-exp(A_log) softplus(x)),  ddt_bias += sum_t dg_raw

(dg: the gradient of the per-token natural-log gate, as the chain returns it). The sums toward
dA_log and ddt_bias are written per program, ``[chunks, 2, HV]`` fp32, and summed by one
``sum(0)`` (a fixed order: no atomics). The group's value heads also make their qk head's
``dx = rstd (dy - y sum(dy y))`` for q and k (y the normalized rows), as fla's ``l2norm_bwd``, RB
rows of the chunk each, and every program issues all its loads before its first store, as
``inputs_fwd.py``: 118 us at the model A/B's layer for 402 MB (94 us at the copy rate), the first
form (the first value head taking all 64 rows, each tensor loaded then stored in turn) 127 us.
Taken with ``inputs_fwd.py`` (``gdn.chain.inputs_backward``).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernel_fun._common.tuning import (  # noqa: F401  (config_name: every kernel module names its configs)
    alloc, autotune_cache, autotune_configs, cdiv, chunk_work, config_name, install_interpreter_shims, launch, next_pow2,
    row_stride)
from kernel_fun._common.witness import record_launch
from kernel_fun._delta.chunking import chunk_program
from kernel_fun._delta.gate import gate_grad
from kernel_fun.gdn._kernels.inputs_fwd import rows_per_head

install_interpreter_shims()

# The first is the interpreter's. Timed by `bench --stages gdn --kernel gdn.inputs_bwd`. sm_90a (Triton 3.6, H=16 HV=32 K=128,
# the layer's flags, loads first, 2026-12-03): registers w4 128, w2 251, w8 64; no stack.
CONFIGS = [triton.Config({}, num_warps=nw) for nw in (4, 2, 8)]
# At fla's default heads (K = 256, G = 1) w4 spills 384 B and w8 takes 245 registers; w16 113, no stack
# (sm_90a, 2026-12-05), but no faster (H100, B=4 T=4096 H=6 V=512: w8 0.119 ms, w16 0.121, w4 0.180;
# bench/records/2026-12-05-h100-stages-gdn-inputs-k256-4c875cc.json): not kept.
CANDIDATES: list = []


@triton.jit(do_not_specialize=["T"])
def inputs_bwd_kernel(
    q, q_rstd, dq, dq_out, k, k_rstd, dk, dk_out,  # [B, T, H, K] (q, k normalized), rstd [B, T, H]
    beta, dbeta, dbeta_out,  # [B, T, HV]: raw beta, the gradient of the activated one (fp32), out
    g, A_log, dt_bias, dg, dg_out,  # [B, T, HV] raw gate input; [HV]; [HV]; fp32 [B, T, HV]; out
    part,  # [chunks, 2, HV] fp32 out: per program, the sums toward dA_log and ddt_bias
    cu_seqlens, chunk_indices,
    T,
    WORK,  # autotune key only: tuning.chunk_work(chunks x value heads)
    s_dqk,  # the row stride of dq_out and dk_out (H * K, or a fused q/k/v gradient's row)
    beta_scale,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, BT: tl.constexpr, RB: tl.constexpr,
    GATE_IN_KERNEL: tl.constexpr, HAS_DT_BIAS: tl.constexpr, BETA_SIGMOID: tl.constexpr, IS_VARLEN: tl.constexpr,
    PARTS: tl.constexpr = 1,  # dq, dk given as [B, T, H * PARTS, K]: the group's value heads' shares, summed here
):
    _, i_hv, i_h, i_tg, row0, n_valid = chunk_program(cu_seqlens, chunk_indices, T, H, HV, BT, IS_VARLEN)
    o_i = tl.arange(0, BT)
    m_t = o_i < n_valid
    p = row0 * HV + i_hv + o_i * HV
    # Every load is issued before the first store (as in inputs_fwd.py).
    if BETA_SIGMOID:
        b_b = tl.load(beta + p, mask=m_t, other=0.0)
        b_db = tl.load(dbeta + p, mask=m_t, other=0.0)
    if GATE_IN_KERNEL:
        b_x = tl.load(g + p, mask=m_t, other=0.0)
        b_dyg = tl.load(dg + p, mask=m_t, other=0.0)  # 0 past the end: so are both terms
    # The group's value heads share its qk head's rows of the chunk, RB rows each (inputs_fwd.py).
    o_r = (i_hv % (HV // H)) * RB + tl.arange(0, RB)
    m_r = o_r < n_valid
    o_k = tl.arange(0, KP)
    m_rk = m_r[:, None] & (o_k < K)[None, :]
    p_r = (row0 + o_r) * H + i_h
    p_rk = p_r[:, None] * K + o_k[None, :]
    b_qy = tl.load(q + p_rk, mask=m_rk, other=0.0)
    b_qr = tl.load(q_rstd + p_r, mask=m_r, other=0.0)
    b_ky = tl.load(k + p_rk, mask=m_rk, other=0.0)
    b_kr = tl.load(k_rstd + p_r, mask=m_r, other=0.0)
    if PARTS == 1:
        b_qdy = tl.load(dq + p_rk, mask=m_rk, other=0.0).to(tl.float32)
        b_kdy = tl.load(dk + p_rk, mask=m_rk, other=0.0).to(tl.float32)
    else:  # the shares of the qk head's value heads (i_h * PARTS + j), added in a fixed order
        p_pk = ((row0 + o_r) * (H * PARTS) + i_h * PARTS)[:, None] * K + o_k[None, :]
        b_qdy = tl.zeros([RB, KP], dtype=tl.float32)
        b_kdy = tl.zeros([RB, KP], dtype=tl.float32)
        for j in tl.static_range(PARTS):
            b_qdy += tl.load(dq + p_pk + j * K, mask=m_rk, other=0.0).to(tl.float32)
            b_kdy += tl.load(dk + p_pk + j * K, mask=m_rk, other=0.0).to(tl.float32)

    if BETA_SIGMOID:
        b_s = tl.sigmoid(b_b.to(tl.float32))
        b_db = b_db.to(tl.float32) * beta_scale * b_s * (1.0 - b_s)
        tl.store(dbeta_out + p, b_db.to(dbeta_out.dtype.element_ty), mask=m_t)
    if GATE_IN_KERNEL:
        b_x = b_x.to(tl.float32)
        if HAS_DT_BIAS:
            b_x += tl.load(dt_bias + i_hv).to(tl.float32)
        b_dg, b_dA = gate_grad(b_dyg.to(tl.float32), b_x, -tl.exp(tl.load(A_log + i_hv).to(tl.float32)))
        tl.store(dg_out + p, b_dg.to(dg_out.dtype.element_ty), mask=m_t)
        tl.store(part + (i_tg * 2) * HV + i_hv, tl.sum(b_dA, axis=0))
        tl.store(part + (i_tg * 2 + 1) * HV + i_hv, tl.sum(b_dg, axis=0))
    # l2norm backward, as fla's l2norm_bwd: dx = rstd (dy - y sum(dy y)), y the normalized rows
    p_out = (row0 + o_r)[:, None] * s_dqk + i_h * K + o_k[None, :]
    b_qy = b_qy.to(tl.float32)
    b_dx = (b_qdy - b_qy * tl.sum(b_qdy * b_qy, axis=1)[:, None]) * b_qr[:, None]
    tl.store(dq_out + p_out, b_dx.to(dq_out.dtype.element_ty), mask=m_rk)
    b_ky = b_ky.to(tl.float32)
    b_dx = (b_kdy - b_ky * tl.sum(b_kdy * b_ky, axis=1)[:, None]) * b_kr[:, None]
    tl.store(dk_out + p_out, b_dx.to(dk_out.dtype.element_ty), mask=m_rk)


inputs_bwd_kernel_tuned = triton.autotune(
    configs=autotune_configs(CONFIGS), **autotune_cache(),
    key=["H", "HV", "K", "BT", "GATE_IN_KERNEL", "HAS_DT_BIAS", "BETA_SIGMOID", "IS_VARLEN", "PARTS", "WORK"],
)(inputs_bwd_kernel)


def inputs_bwd(q, q_rstd, dq, k, k_rstd, dk, beta, dbeta, beta_sigmoid: bool, beta_scale: float, g, A_log, dt_bias,
               dg, gate_in_kernel: bool, cu_seqlens=None, chunk_indices=None, chunk_size: int = 64,
               dq_out=None, dk_out=None, *, config: triton.Config | None = None):
    """``(dq, dk, dbeta, dg, dA_log, ddt_bias)``: the gradients through the l2norm of q and k (q, k
    the normalized ``[B, T, H, K]``, dq, dk those of the normalized), beta's sigmoid (with
    ``beta_sigmoid``; else dbeta as given) and the in-op gate (with ``gate_in_kernel``; else dg as
    given, dA_log and ddt_bias None), in q's, beta's and g's dtypes, dA_log and ddt_bias in A_log's
    and dt_bias's. One launch and one sum. ``dq_out``, ``dk_out`` (both or neither): where to write
    dq, dk, ``[B, T, H, K]`` views with one row stride (the q and k parts of a fused q/k/v
    gradient), else new tensors. dq, dk may also come as ``[B, T, HV, K]``: each value head's share of
    its qk head's gradient (``wy_dqk_bwd(per_head=True)``), added here."""
    B, T, H, K = q.shape
    HV = g.shape[2]
    BT = chunk_size
    parts = dq.shape[2] // H
    if tuple(dq.shape) not in ((B, T, H, K), (B, T, HV, K)) or dk.shape != dq.shape:
        raise ValueError(f"inputs_bwd: dq {tuple(dq.shape)}, dk {tuple(dk.shape)} must be {(B, T, H, K)} or {(B, T, HV, K)}")
    is_varlen = cu_seqlens is not None
    NT = len(chunk_indices) if is_varlen else cdiv(T, BT)
    q, dq, k, dk, beta, dbeta, g, dg = (x.contiguous() for x in (q, dq, k, dk, beta, dbeta, g, dg))
    if dq_out is None:
        dq_out, dk_out = alloc(q.shape, dtype=q.dtype, device=q.device), alloc(k.shape, dtype=k.dtype, device=k.device)
    elif (tuple(dq_out.shape) != (B, T, H, K) or tuple(dk_out.shape) != (B, T, H, K) or dq_out.dtype != q.dtype
          or dk_out.dtype != k.dtype):
        raise ValueError(f"inputs_bwd: dq_out {tuple(dq_out.shape)} {dq_out.dtype}, dk_out {tuple(dk_out.shape)} "
                         f"{dk_out.dtype} must be {(B, T, H, K)} {q.dtype}")
    s_dqk = row_stride(dq_out, "dq_out")
    if row_stride(dk_out, "dk_out") != s_dqk:
        raise ValueError(f"inputs_bwd: dq_out and dk_out rows {s_dqk} and {dk_out.stride(1)} apart (one stride)")
    dbeta_out = alloc(beta.shape, dtype=beta.dtype, device=q.device) if beta_sigmoid else dbeta
    dg_out = alloc(g.shape, dtype=g.dtype, device=q.device) if gate_in_kernel else dg
    n_chunks = NT if is_varlen else B * NT
    part = alloc((n_chunks, 2, HV), dtype=torch.float32, device=q.device) if gate_in_kernel else None
    dummy = q_rstd
    has_bias = gate_in_kernel and dt_bias is not None
    launch(inputs_bwd_kernel_tuned, (NT, B * HV), config,
           q=q, q_rstd=q_rstd, dq=dq, dq_out=dq_out, k=k, k_rstd=k_rstd, dk=dk, dk_out=dk_out,
           beta=beta, dbeta=dbeta, dbeta_out=dbeta_out, g=g, A_log=A_log if gate_in_kernel else dummy,
           dt_bias=dt_bias if has_bias else dummy, dg=dg, dg_out=dg_out, part=part if gate_in_kernel else dummy,
           cu_seqlens=cu_seqlens if is_varlen else dummy, chunk_indices=chunk_indices if is_varlen else dummy, T=T,
           WORK=chunk_work(B, T, BT, HV),
           s_dqk=s_dqk, beta_scale=float(beta_scale), H=H, HV=HV, K=K, KP=max(16, next_pow2(K)), BT=BT,
           RB=rows_per_head(BT, HV // H),
           GATE_IN_KERNEL=bool(gate_in_kernel), HAS_DT_BIAS=has_bias, BETA_SIGMOID=bool(beta_sigmoid),
           IS_VARLEN=is_varlen, PARTS=parts)
    record_launch("gdn.inputs_bwd")
    dA_log = ddt_bias = None
    if gate_in_kernel:
        sums = part.sum(0)  # [2, HV], a fixed order
        dA_log = sums[0].view_as(A_log).to(A_log.dtype)
        ddt_bias = sums[1].to(dt_bias.dtype) if dt_bias is not None else None
    return dq_out, dk_out, dbeta_out, dg_out, dA_log, ddt_bias
