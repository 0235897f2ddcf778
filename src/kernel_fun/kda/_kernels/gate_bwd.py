"""KDA's gate backward after the intra stage, in one pass: the chunk-local reverse cumsum of dg
(fla 0.6.0's ``chunk_local_cumsum(dg, reverse=True)``: the gradient of the chunk-local cumsum)
and, with the gate in the op, the gate function's own backward (fla's ``kda_gate_bwd``: the
gate is ``-exp(A_log) softplus(g_raw + dt_bias)``), with the sums toward dA_log and ddt_bias.

fla runs these as two bandwidth-bound launches with an fp32 ``[B, T, HV, K]`` between them
(0.58 + 0.59 ms at B=16, T=8192, HV=16, K=128 on the H200): dg is read, the cumsum written and
read back, the raw gate read, dg_raw written, about 4.3 GB. Here dg (fp32) and the raw gate are
read once and dg_raw written once: about 2.2 GB, a 0.5 ms floor at 4.28 TB/s.

One program per (chunk, batch x value head, K block), grid ``(NT, B * HV, cdiv(K, BK))``: the
chunk's rows last to first, one [BK] row at a time, the sum of the later rows carried in
registers (rows past a sequence's end load as 0, so the sums of the valid rows are unchanged,
and they are not written). The sums toward dA_log and
ddt_bias are stored per (chunk, head, channel) and reduced by torch in a fixed order
(deterministic).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernel_fun._common.tuning import (  # noqa: F401
    alloc, autotune_cache, autotune_configs, cdiv, chunk_work, config_name, launch)
from kernel_fun._common.witness import record_launch
from kernel_fun._delta.chunking import chunk_grid, chunk_program
from kernel_fun._delta.gate import gate_grad


# What the autotuner may pick (the interpreter runs only the first, BK=32, so the CPU tests
# cross K blocks); each checked against fla on the H200 (tests/kda/test_stage_kernels_gpu.py),
# the autotuned pick 0.56 ms at B=16 (record 0dab741).
CONFIGS = [triton.Config({"BK": bk}, num_warps=nw, num_stages=1) for bk, nw in [(32, 1), (128, 1), (64, 1), (128, 2)]]
CANDIDATES: list = []


@triton.jit
def _row_mask(r, n_valid, m_k):
    """[BK] valid lanes of row ``r``: a block comparison, not a scalar one and-ed onto the block
    (Triton 3.9's interpreter splats a scalar int1 to int32 data and rejects it as a mask)."""
    return m_k & (tl.full(m_k.shape, r, tl.int32) < n_valid)


@triton.jit
def _row_load(p, base, r, n_valid, m_k, HVK: tl.constexpr):
    """Row ``r`` of the chunk as fp32 [BK] (0 past the sequence's end)."""
    return tl.load(p + base + r * HVK, mask=_row_mask(r, n_valid, m_k), other=0.).to(tl.float32)


@triton.jit
def _row_out(dyg, b_x, b_bias, b_nA, dg_out, base, r, n_valid, m_k, HVK: tl.constexpr, dA_acc, dbias_acc,
             GATE: tl.constexpr, HAS_DT_BIAS: tl.constexpr):
    """Row ``r``'s output from its reverse-cumsummed dg (``dyg``): with GATE the gate's backward
    (``b_x`` the raw gate row), its terms added to the sums; stored where the row is valid."""
    b_dg = dyg
    if GATE:
        if HAS_DT_BIAS:
            b_x += b_bias
        b_dg, b_dA = gate_grad(dyg, b_x, b_nA)  # rows past the end: dyg = 0, so 0
        dA_acc += b_dA
        dbias_acc += b_dg
    tl.store(dg_out + base + r * HVK, b_dg.to(dg_out.dtype.element_ty), mask=_row_mask(r, n_valid, m_k))
    return dA_acc, dbias_acc


@triton.autotune(configs=autotune_configs(CONFIGS), **autotune_cache(),
                 key=["HV", "K", "BT", "IS_VARLEN", "GATE", "HAS_DT_BIAS", "WORK"])
@triton.jit(do_not_specialize=["T"])
def _gate_bwd_kernel(dg, g_raw, A_log, dt_bias, dg_out, dA_part, dbias_part, cu_seqlens, chunk_indices, T,
                     WORK,  # autotune key only: tuning.chunk_work(chunks x value heads)
                     HV: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                     IS_VARLEN: tl.constexpr, GATE: tl.constexpr, HAS_DT_BIAS: tl.constexpr):
    _, i_hv, _, i_tg, t0, n_valid = chunk_program(cu_seqlens, chunk_indices, T, HV, HV, BT, IS_VARLEN)
    i_k = tl.program_id(2)
    HVK: tl.constexpr = HV * K
    o_k = i_k * BK + tl.arange(0, BK)
    m_k = o_k < K
    base = t0 * HVK + i_hv * K + o_k
    b_nA = -tl.exp(tl.load(A_log + i_hv).to(tl.float32)) if GATE else 0.
    b_bias = tl.load(dt_bias + i_hv * K + o_k, mask=m_k, other=0.).to(tl.float32) if HAS_DT_BIAS else 0.
    dA_acc = tl.zeros([BK], dtype=tl.float32)
    dbias_acc = tl.zeros([BK], dtype=tl.float32)
    # rows last to first, one [BK] row at a time with the sum of the later rows carried in
    # registers (a tl.cumsum over a [BT, BK] tile's rows compiles to 255 registers). Four rows
    # per step, their loads issued before any store: a store may alias a later load for the
    # compiler, so loads after it would wait for it.
    carry = tl.zeros([BK], dtype=tl.float32)
    for i_s in range(0, BT // 4):
        r = BT - 1 - 4 * i_s
        d0 = _row_load(dg, base, r, n_valid, m_k, HVK)
        d1 = _row_load(dg, base, r - 1, n_valid, m_k, HVK)
        d2 = _row_load(dg, base, r - 2, n_valid, m_k, HVK)
        d3 = _row_load(dg, base, r - 3, n_valid, m_k, HVK)
        if GATE:
            x0 = _row_load(g_raw, base, r, n_valid, m_k, HVK)
            x1 = _row_load(g_raw, base, r - 1, n_valid, m_k, HVK)
            x2 = _row_load(g_raw, base, r - 2, n_valid, m_k, HVK)
            x3 = _row_load(g_raw, base, r - 3, n_valid, m_k, HVK)
        else:
            x0, x1, x2, x3 = d0, d1, d2, d3  # unused
        carry += d0
        dA_acc, dbias_acc = _row_out(carry, x0, b_bias, b_nA, dg_out, base, r, n_valid, m_k, HVK, dA_acc,
                                     dbias_acc, GATE, HAS_DT_BIAS)
        carry += d1
        dA_acc, dbias_acc = _row_out(carry, x1, b_bias, b_nA, dg_out, base, r - 1, n_valid, m_k, HVK, dA_acc,
                                     dbias_acc, GATE, HAS_DT_BIAS)
        carry += d2
        dA_acc, dbias_acc = _row_out(carry, x2, b_bias, b_nA, dg_out, base, r - 2, n_valid, m_k, HVK, dA_acc,
                                     dbias_acc, GATE, HAS_DT_BIAS)
        carry += d3
        dA_acc, dbias_acc = _row_out(carry, x3, b_bias, b_nA, dg_out, base, r - 3, n_valid, m_k, HVK, dA_acc,
                                     dbias_acc, GATE, HAS_DT_BIAS)
    if GATE:
        i_p = i_tg * HV + i_hv  # partial rows: [B * NT, HV, K], one per (chunk, head)
        tl.store(dA_part + i_p * K + o_k, dA_acc, mask=m_k)
        tl.store(dbias_part + i_p * K + o_k, dbias_acc, mask=m_k)


def dg_cumsum_gate_bwd(
    dg: torch.Tensor,
    g: torch.Tensor | None = None,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    cu_seqlens: torch.LongTensor | None = None,
    chunk_size: int = 64,
    chunk_indices: torch.LongTensor | None = None,
    *,
    config: triton.Config | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """``(dg_out, dA_log, ddt_bias)`` from dg ``[B, T, HV, K]`` (the gradient of the chunk-local
    cumsummed gate).

    Without ``g``: dg_out is fla's ``chunk_local_cumsum(dg, chunk_size, reverse=True,
    cu_seqlens=...)`` (fp32), dA_log and ddt_bias None. With ``g`` (the raw gate input, its
    shape) and ``A_log [HV]`` (``dt_bias [HV*K]`` optional): fla's ``kda_gate_bwd(g, A_log,
    dt_bias, dyg=<that cumsum>)``: dg_out in g's dtype, dA_log in A_log's, ddt_bias in
    dt_bias's (None without it). ``config``: one of ``CONFIGS`` / ``CANDIDATES`` instead of autotuning."""
    if dg.dim() != 4:
        raise ValueError(f"dg_cumsum_gate_bwd: dg must be [B, T, HV, K], got {tuple(dg.shape)}")
    B, T, HV, K = dg.shape
    BT = chunk_size
    if BT not in (16, 32, 64):
        raise ValueError(f"dg_cumsum_gate_bwd: chunk_size 16, 32 or 64, got {BT}")
    gate = g is not None
    if gate and (g.shape != dg.shape or A_log is None or A_log.numel() != HV
                 or (dt_bias is not None and dt_bias.numel() != HV * K)):
        raise ValueError(f"dg_cumsum_gate_bwd: g {tuple(g.shape)} must be dg's shape {tuple(dg.shape)}, A_log "
                         f"[HV={HV}] and dt_bias [HV*K={HV * K}] or None; got A_log "
                         f"{None if A_log is None else tuple(A_log.shape)}, dt_bias "
                         f"{None if dt_bias is None else tuple(dt_bias.shape)}")
    chunk_indices, NT = chunk_grid("dg_cumsum_gate_bwd", B, T, BT, cu_seqlens, chunk_indices)
    dg = dg.contiguous()
    dev = dg.device
    out = alloc((B, T, HV, K), g.dtype if gate else torch.float32, dev)
    # sums per (chunk, head, channel), reduced here in a fixed order
    n_part = B * NT * HV  # (varlen: B == 1)
    dA_part = alloc((n_part, K), torch.float32, dev) if gate else None
    dbias_part = alloc((n_part, K), torch.float32, dev) if gate else None
    if NT > 0:
        grid = lambda meta: (NT, B * HV, cdiv(K, meta["BK"]))  # noqa: E731
        launch(_gate_bwd_kernel, grid, config, dg,
               g.contiguous() if gate else dg, A_log if gate else dg,
               dt_bias if dt_bias is not None and gate else dg, out, dA_part, dbias_part,
               cu_seqlens, chunk_indices, T, WORK=chunk_work(B, T, BT, HV), HV=HV, K=K, BT=BT,
               IS_VARLEN=cu_seqlens is not None,
               GATE=gate, HAS_DT_BIAS=gate and dt_bias is not None)
        record_launch("kda.gate_bwd")
    if not gate:
        return out, None, None
    dA_log = dA_part.view(-1, HV, K).sum(dim=(0, 2)).view_as(A_log).to(A_log.dtype)
    ddt_bias = None
    if dt_bias is not None:
        ddt_bias = dbias_part.view(-1, HV * K).sum(dim=0).view_as(dt_bias).to(dt_bias.dtype)
    return out, dA_log, ddt_bias
