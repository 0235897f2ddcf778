"""The score gradient of the chunked delta rule with a precomputed Aqk (KDA's chain):
``dAqk = scale * tril(do v_new^T)`` per 64-token chunk, diagonal included, fp32; the first half of fla 0.6.0's ``chunk_kda_bwd_dAv`` (``fla/ops/kda/chunk_bwd.py``).

Its other half, the intra-chunk ``dv = Aqk^T do``, is then made inside our backward state
scan (``_delta/_kernels/state_scan_bwd.py`` with ``A=``), which reads do anyway: fla's
stage writes that dv (``[B, T, HV, V]``, 1.07 GB in bf16 at B=16) for dhu to read it back.
This kernel reads do and v_new once and writes dA: about 2.7 GB at B=16 against fla's
stage's 4.0 GB.

One program per (chunk, batch x value head), grid ``(NT, B * HV)``; the V blocks accumulate
one [BT, BT] product each (bf16 operands, fp32 accumulation, M = 64 rows: wgmma-eligible on
4 or 8 warps). Rows past a sequence's end are not written (as fla); above the diagonal,
zeros.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernel_fun._common.tuning import (  # noqa: F401
    alloc, autotune_cache, autotune_configs, chunk_work, config_name, launch)
from kernel_fun._common.witness import record_launch
from kernel_fun._delta.chunking import chunk_grid, chunk_program



# What the autotuner may pick (the interpreter runs only the first, BV=32, so the CPU tests
# cross V blocks); the autotuned pick 0.63 ms at B=16 on the H200 (record 0dab741).
CONFIGS = [triton.Config({"BV": bv}, num_warps=nw, num_stages=ns)
           for bv, nw, ns in [(32, 4, 2), (64, 4, 3), (128, 4, 2), (128, 8, 3)]]
CANDIDATES: list = []


@triton.autotune(configs=autotune_configs(CONFIGS), **autotune_cache(), key=["HV", "V", "BT", "IS_VARLEN", "WORK"])
@triton.jit(do_not_specialize=["T"])
def _score_grad_kernel(v, do, dA, cu_seqlens, chunk_indices, scale, T,
                       WORK,  # autotune key only: tuning.chunk_work(chunks x value heads)
                       HV: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
                       IS_VARLEN: tl.constexpr):
    _, i_hv, _, _, t0, n_valid = chunk_program(cu_seqlens, chunk_indices, T, HV, HV, BT, IS_VARLEN)
    HVV: tl.constexpr = HV * V
    HVBT: tl.constexpr = HV * BT
    v += t0 * HVV + i_hv * V
    do += t0 * HVV + i_hv * V
    dA += t0 * HVBT + i_hv * BT
    o_t = tl.arange(0, BT)
    m_t = o_t < n_valid
    b_dA = tl.zeros([BT, BT], dtype=tl.float32)
    for i_v in range(0, tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < V
        b_do = tl.load(do + o_t[:, None] * HVV + o_v[None, :], mask=m_t[:, None] & m_v[None, :], other=0.)
        # v^T [BV, BT] loaded transposed from memory (not a transposed dot result)
        b_vt = tl.load(v + o_t[None, :] * HVV + o_v[:, None], mask=m_v[:, None] & m_t[None, :], other=0.)
        b_dA = tl.dot(b_do, b_vt, b_dA)
    b_dA = tl.where(o_t[:, None] >= o_t[None, :], b_dA * scale, 0.)
    tl.store(dA + o_t[:, None] * HVBT + o_t[None, :], b_dA.to(dA.dtype.element_ty), mask=m_t[:, None])


def score_grad_bwd(
    v: torch.Tensor,
    do: torch.Tensor,
    scale: float,
    cu_seqlens: torch.LongTensor | None = None,
    chunk_size: int = 64,
    chunk_indices: torch.LongTensor | None = None,
    *,
    config: triton.Config | None = None,
) -> torch.Tensor:
    """``dAqk [B, T, HV, BT]`` fp32 from v (v_new) and do ``[B, T, HV, V]``: fla's
    ``chunk_kda_bwd_dAv(...)[0]``. ``config``: one of ``CONFIGS`` / ``CANDIDATES`` instead of autotuning."""
    if v.shape != do.shape or v.dim() != 4:
        raise ValueError(f"score_grad_bwd: v {tuple(v.shape)} and do {tuple(do.shape)} must be one [B, T, HV, V] shape")
    B, T, HV, V = v.shape
    BT = chunk_size
    if BT not in (16, 32, 64):
        raise ValueError(f"score_grad_bwd: chunk_size 16, 32 or 64, got {BT}")
    chunk_indices, NT = chunk_grid("score_grad_bwd", B, T, BT, cu_seqlens, chunk_indices)
    v, do = v.contiguous(), do.contiguous()
    dA = alloc((B, T, HV, BT), torch.float32, v.device)
    if NT > 0:
        launch(_score_grad_kernel, (NT, B * HV), config, v, do, dA, cu_seqlens, chunk_indices, float(scale), T,
               WORK=chunk_work(B, T, BT, HV), HV=HV, V=V, BT=BT, IS_VARLEN=cu_seqlens is not None)
        record_launch("delta.score_grad")
    return dA
