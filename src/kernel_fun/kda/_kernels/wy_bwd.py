"""KDA WY / state-gradient backward: the gradients through ``w = Akk (beta k exp2(g))``,
``u = Akk (beta v)``, the inter-chunk output ``scale (q exp2(g)) h`` and the state update
``h_next = exp2(g_last) h + (k exp2(g_last - g))^T v_new``, plus the gradient of ``L``
(the pre-inverse WY matrix) for the intra stage.

Drop-in for fla 0.6.0's ``chunk_kda_bwd_wy_dqkg_fused`` (``fla/ops/kda/chunk_bwd.py``,
``state_v_first=False``): same arguments, same outputs. The math is
``reference_stages.wy_dqkg_bwd_reference``.

Kernel design (one program = one 64-token chunk x one value head):

* V-only work first, once: ``dA += dv v^T``, ``dvw = A^T dv`` -> ``dv_out = beta dvw``,
  ``db += sum_V dvw v`` (fla runs it inside its K loop behind an ``if i_k == 0``).
* Then per K block, one loop over V blocks with three dots that share their loads:
  ``do h^T``, ``dv h^T`` and ``v_new dh^T``, plus ``sum_V h dh``; when one K block covers K
  (``BK >= K``) the V-only work joins this loop and v_new/do/dv are read exactly once.
* All dots have M = 64 rows (the chunk) and configurations use 4 or 8 warps, so Hopper can
  run them as wgmma.
* The ``dA`` chain ``-A^T dA A^T`` runs at the end on the register-resident ``A^T``; no dot
  result is transposed into another dot (the Triton 3.4-3.7.0 Hopper miscompile).

Precision: products of bf16 inputs run in bf16 with fp32 accumulation (exact products);
products with an fp32 intermediate (``dw (k E)^T``, ``A^T dw``, the final ``A^T dA A^T``)
use ``DOT_PRECISION`` (tf32 by default; fla rounds those operands to bf16).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernel_fun._common.tuning import (  # noqa: F401
    alloc, autotune_cache, autotune_configs, chunk_work, config_name, launch)
from kernel_fun._common.witness import record_launch
from kernel_fun._delta.chunking import chunk_grid, chunk_program



def _cfg(bk, bv, early_epi, warps, stages):
    return triton.Config({"BK": bk, "BV": bv, "EARLY_EPI": early_epi}, num_warps=warps, num_stages=stages)


# What the autotuner may pick (the interpreter runs only the first).
# Measured on the H200 (B=8, T=8192, H=HV=16, K=128, V=256 bf16, every configuration forced
# and checked against fla, 2026-11-30, bench/records/raw/2026-11-30-h200-kda-stage-bench-r2.json;
# fla 6.25 ms): these four 3.63, 3.75, 4.19 and 4.29 ms; eight others 4.33-6.94 ms (BK=32 or
# 128 on 8 warps, BV=128, 2 stages, a 128-register cap) were dropped. 8 warps: two warpgroups
# share the M=64 wgmma tiles. ``EARLY_EPI`` issues the epilogue's loads before the V loop.
CONFIGS = [_cfg(*c) for c in [(64, 64, False, 8, 4), (32, 64, True, 4, 3), (64, 64, False, 8, 3), (64, 32, False, 8, 4)]]
# Not yet timed or checked on a GPU (``kernel-fun bench --stages kda`` and the GPU tests force them):
# they extend the measured trend, deeper pipelining won (s4 3.63, s3 4.19, s2 4.78 ms).
CANDIDATES = [_cfg(*c) for c in [(64, 64, False, 8, 5), (64, 64, True, 8, 4), (32, 64, True, 4, 4)]]


@triton.jit
def _v_only(b_At, b_beta, v, dv, dv2, o_t, m_t, o_v, HVV: tl.constexpr, V: tl.constexpr,
            b_dA, b_db):
    """One V block of the V-only work: dA += dv v^T; dv2 = beta A^T dv; db += sum dvw v."""
    m_tv = m_t[:, None] & (o_v < V)[None, :]
    off = o_t[:, None] * HVV + o_v[None, :]
    b_v = tl.load(v + off, mask=m_tv, other=0.)
    b_dv = tl.load(dv + off, mask=m_tv, other=0.)
    b_dA = tl.dot(b_dv, tl.trans(b_v), b_dA)
    b_dvw = tl.dot(b_At, b_dv.to(b_At.dtype))
    tl.store(dv2 + off, (b_dvw * b_beta[:, None]).to(dv2.dtype.element_ty), mask=m_tv)
    b_db += tl.sum(b_dvw * b_v.to(tl.float32), axis=1)
    return b_dA, b_db


@triton.autotune(configs=autotune_configs(CONFIGS), **autotune_cache(),
                 key=["H", "HV", "K", "V", "BT", "IS_VARLEN", "DOT_PRECISION", "WORK"])
@triton.jit(do_not_specialize=["T"])
def _wy_bwd_kernel(
    q, k, v, v_new, g, beta, A, h, do, dh, dv,
    dq, dk, dv2, dg, db, dA,
    cu_seqlens, chunk_indices, scale, T,
    WORK,  # autotune key only: tuning.chunk_work(chunks x value heads)
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, IS_VARLEN: tl.constexpr, DOT_PRECISION: tl.constexpr,
    EARLY_EPI: tl.constexpr = False,
):
    """One program: one chunk x one value head (``chunk_program``); h / dh are indexed by
    the global chunk number i_tg."""
    _, i_hv, i_h, i_tg, t0, n_valid = chunk_program(cu_seqlens, chunk_indices, T, H, HV, BT, IS_VARLEN)
    NEG_INF: tl.constexpr = float("-inf")
    HK: tl.constexpr = H * K
    HVK: tl.constexpr = HV * K
    HVV: tl.constexpr = HV * V
    HVBT: tl.constexpr = HV * BT
    q += t0 * HK + i_h * K
    k += t0 * HK + i_h * K
    g += t0 * HVK + i_hv * K
    dq += t0 * HVK + i_hv * K
    dk += t0 * HVK + i_hv * K
    dg += t0 * HVK + i_hv * K
    v += t0 * HVV + i_hv * V
    v_new += t0 * HVV + i_hv * V
    do += t0 * HVV + i_hv * V
    dv += t0 * HVV + i_hv * V
    dv2 += t0 * HVV + i_hv * V
    beta += t0 * HV + i_hv
    db += t0 * HV + i_hv
    A += t0 * HVBT + i_hv * BT
    dA += t0 * HVBT + i_hv * BT
    h += (i_tg * HV + i_hv) * (K * V)
    dh += (i_tg * HV + i_hv) * (K * V)

    o_t = tl.arange(0, BT)
    m_t = o_t < n_valid
    b_beta = tl.load(beta + o_t * HV, mask=m_t, other=0.).to(tl.float32)
    # A^T: b_At[a, t] = Akk[t, a], loaded transposed (never a transposed dot result)
    b_At = tl.load(A + o_t[None, :] * HVBT + o_t[:, None], mask=m_t[None, :], other=0.)

    b_dA = tl.zeros([BT, BT], dtype=tl.float32)
    b_db = tl.zeros([BT], dtype=tl.float32)
    FUSE_V: tl.constexpr = BK >= K
    if not FUSE_V:
        for i_v in range(0, tl.cdiv(V, BV)):
            o_v = i_v * BV + tl.arange(0, BV)
            b_dA, b_db = _v_only(b_At, b_beta, v, dv, dv2, o_t, m_t, o_v, HVV, V, b_dA, b_db)

    i_last = n_valid - 1
    for i_k in range(0, tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        b_dqa = tl.zeros([BT, BK], dtype=tl.float32)
        b_dka = tl.zeros([BT, BK], dtype=tl.float32)
        b_dwa = tl.zeros([BT, BK], dtype=tl.float32)
        b_hdh = tl.zeros([BK], dtype=tl.float32)
        m_tk = m_t[:, None] & m_k[None, :]
        off_k = o_t[:, None] * HVK + o_k[None, :]
        if EARLY_EPI:  # the epilogue's loads in flight during the V loop
            b_g = tl.load(g + off_k, mask=m_tk, other=0.)
            b_gn = tl.load(g + i_last * HVK + o_k, mask=m_k, other=0.)
            b_k = tl.load(k + o_t[:, None] * HK + o_k[None, :], mask=m_tk, other=0.)
            b_q = tl.load(q + o_t[:, None] * HK + o_k[None, :], mask=m_tk, other=0.)
        for i_v in range(0, tl.cdiv(V, BV)):
            o_v = i_v * BV + tl.arange(0, BV)
            m_v = o_v < V
            m_tv = m_t[:, None] & m_v[None, :]
            off = o_t[:, None] * HVV + o_v[None, :]
            b_do = tl.load(do + off, mask=m_tv, other=0.)
            b_vn = tl.load(v_new + off, mask=m_tv, other=0.)
            b_dv = tl.load(dv + off, mask=m_tv, other=0.)
            m_kv = m_k[:, None] & m_v[None, :]
            off_h = o_k[:, None] * V + o_v[None, :]
            b_h = tl.load(h + off_h, mask=m_kv, other=0.)
            b_dh = tl.load(dh + off_h, mask=m_kv, other=0.)
            b_dqa = tl.dot(b_do, tl.trans(b_h).to(b_do.dtype), b_dqa)
            b_dwa = tl.dot(b_dv, tl.trans(b_h).to(b_dv.dtype), b_dwa)
            b_dka = tl.dot(b_vn, tl.trans(b_dh).to(b_vn.dtype), b_dka)
            b_hdh += tl.sum(b_h.to(tl.float32) * b_dh.to(tl.float32), axis=1)
            if FUSE_V:
                b_dA, b_db = _v_only(b_At, b_beta, v, dv, dv2, o_t, m_t, o_v, HVV, V, b_dA, b_db)

        if not EARLY_EPI:
            b_g = tl.load(g + off_k, mask=m_tk, other=0.)
            b_gn = tl.load(g + i_last * HVK + o_k, mask=m_k, other=0.)
            b_k = tl.load(k + o_t[:, None] * HK + o_k[None, :], mask=m_tk, other=0.)
            b_q = tl.load(q + o_t[:, None] * HK + o_k[None, :], mask=m_tk, other=0.)
        b_g = b_g.to(tl.float32)
        b_gn = b_gn.to(tl.float32)
        b_k = b_k.to(tl.float32)
        b_q = b_q.to(tl.float32)
        b_e = tl.exp2(tl.where(m_t[:, None], b_g, NEG_INF))
        b_dq = b_dqa * b_e * scale
        b_dks = b_dka * tl.exp2(tl.where(m_t[:, None], b_gn[None, :] - b_g, NEG_INF))
        b_dw = -b_dwa
        b_ke = b_k * b_e
        b_dA = tl.dot(b_dw, tl.trans(b_ke), b_dA, input_precision=DOT_PRECISION)
        b_dkw = tl.dot(b_At.to(tl.float32), b_dw, input_precision=DOT_PRECISION)
        b_db += tl.sum(b_dkw * b_ke, axis=1)
        b_dgk = b_hdh * tl.exp2(b_gn) + tl.sum(b_k * b_dks, axis=0)
        b_bdkw = b_dkw * b_beta[:, None]
        b_dg = b_q * b_dq - b_k * b_dks + b_bdkw * b_ke + tl.where((o_t == i_last)[:, None], b_dgk[None, :], 0.)
        b_dk = b_dks + b_bdkw * b_e
        tl.store(dq + off_k, b_dq.to(dq.dtype.element_ty), mask=m_tk)
        tl.store(dk + off_k, b_dk.to(dk.dtype.element_ty), mask=m_tk)
        tl.store(dg + off_k, b_dg.to(dg.dtype.element_ty), mask=m_tk)

    # dL = -A^T strict_lower(dA diag(beta)) A^T
    m_s = (o_t[:, None] > o_t[None, :]) & m_t[:, None] & m_t[None, :]
    b_dA = tl.where(m_s, b_dA * b_beta[None, :], 0.)
    b_Atf = b_At.to(tl.float32)
    b_dA = tl.dot(b_dA, b_Atf, input_precision=DOT_PRECISION)
    b_dA = tl.dot(b_Atf, b_dA, input_precision=DOT_PRECISION)
    b_dA = tl.where(m_s, -b_dA, 0.)
    tl.store(dA + o_t[:, None] * HVBT + o_t[None, :], b_dA.to(dA.dtype.element_ty), mask=m_t[:, None])
    tl.store(db + o_t * HV, b_db.to(db.dtype.element_ty), mask=m_t)


def wy_dqkg_bwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    v_new: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    A: torch.Tensor,
    h: torch.Tensor,
    do: torch.Tensor,
    dh: torch.Tensor,
    dv: torch.Tensor,
    scale: float | None = None,
    state_v_first: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    chunk_size: int = 64,
    chunk_indices: torch.LongTensor | None = None,
    chunk_offsets: torch.LongTensor | None = None,
    use_graph: bool = False,
    dot_precision: str = "tf32",
    config=None,
):
    """WY / state backward of KDA; drop-in for fla's ``chunk_kda_bwd_wy_dqkg_fused``.

    Args:
        q, k: ``[B, T, H, K]``; v, v_new, do, dv: ``[B, T, HV, V]`` (dv: the full gradient of
        v_new, after dhu); g: ``[B, T, HV, K]`` (chunk-local cumsum, log2 units);
        beta: ``[B, T, HV]``; A: ``[B, T, HV, BT]`` fla's ``Akk`` = ``(I + L)^-1``;
        h, dh: ``[B, NT, HV, K, V]`` (``[1, NT_total, HV, K, V]`` with cu_seqlens);
        scale: defaults to ``K ** -0.5``; cu_seqlens / chunk_indices: varlen as in fla.
        chunk_offsets: accepted for parity (unused, as in fla).
        state_v_first: only False (h stored ``[K, V]``) is supported.
        use_graph: fla's static-buffer capture mode; not supported (raises).
        dot_precision: ``tl.dot`` input precision of the fp32-operand products.
        config: a ``triton.Config`` from ``CONFIGS`` / ``CANDIDATES`` to run instead of autotuning.

    Returns:
        ``(dq, dk, dv, db, dg, dA)``: dq, dk, dg ``[B, T, HV, K]`` fp32 (the caller reduces
        grouped heads), dv ``[B, T, HV, V]`` in v's dtype (the gradient of v),
        db ``[B, T, HV]`` fp32, dA ``[B, T, HV, BT]`` fp32 (gradient of L, strictly lower).
    """
    if state_v_first:
        raise NotImplementedError("kernel_fun wy_dqkg_bwd: state_v_first=True is not supported")
    if use_graph:
        raise NotImplementedError("kernel_fun wy_dqkg_bwd: use_graph (static buffers) is not supported")
    B, T, H, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    BT = chunk_size
    if BT not in (32, 64):
        raise ValueError(f"wy_dqkg_bwd supports chunk_size 32 or 64, got {BT}")
    if HV % H != 0:
        raise ValueError(f"HV={HV} must be a multiple of H={H}")
    if scale is None:
        scale = K ** -0.5
    chunk_indices, NT = chunk_grid("wy_dqkg_bwd", B, T, BT, cu_seqlens, chunk_indices)
    q, k, v, v_new, g, beta, A, h, do, dh, dv = (
        x.contiguous() for x in (q, k, v, v_new, g, beta, A, h, do, dh, dv))
    dev = k.device
    dq = alloc((B, T, HV, K), torch.float32, dev)
    dk = alloc((B, T, HV, K), torch.float32, dev)
    dv2 = alloc(v.shape, v.dtype, dev)
    dg = alloc(g.shape, torch.float32, dev)
    db = alloc(beta.shape, torch.float32, dev)
    dA = alloc(A.shape, torch.float32, dev)
    if NT > 0:
        launch(_wy_bwd_kernel, (NT, B * HV), config, q, k, v, v_new, g, beta, A, h, do, dh, dv,
               dq, dk, dv2, dg, db, dA, cu_seqlens, chunk_indices, scale, T,
               WORK=chunk_work(B, T, BT, HV), H=H, HV=HV, K=K, V=V, BT=BT, IS_VARLEN=cu_seqlens is not None,
               DOT_PRECISION=dot_precision)
        record_launch("kda.wy_bwd")
    return dq, dk, dv2, db, dg, dA
