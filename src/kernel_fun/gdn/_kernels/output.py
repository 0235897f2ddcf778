"""GDN's chunk output, the second half of the split forward (``chain.forward`` where the state scan
does not make o itself):

    o = scale * diag(exp2(G)) Q S + Aqk v_new        per chunk and value head

with S = h the state before the chunk and v_new, both written by the state scan run without its
output (``state_scan_fwd(save_h=True, save_v_new=True, store_o=False)``, the backward's recompute
scan), and Aqk = ``gated_scores(q, k, G, scale)`` (scale and gate in it, zero above the diagonal);
G the chunk-local cumulative log2 gate. This is fla's ``chunk_fwd_o`` with the scores read, not
formed. Every chunk is independent: the grid has NT x NV programs a head, where the fused scan
carries o along its chain of chunks, and the state scan alone holds fewer registers (no q, no
output tile): at K = 256 the fused scan spills in every configuration (sm_90a, docs/gdn.md).

Grid: one program per (chunk, V-block, batch x value head), the V-blocks of a chunk adjacent
(``chunk_program``'s SPLIT), so their reads of the chunk's q and Aqk meet in L2.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernel_fun._common.tuning import (  # noqa: F401  (config_name: every kernel module names its configs)
    alloc, autotune_cache, autotune_configs, cdiv, chunk_work, config_name, fitting_blocks, install_interpreter_shims,
    launch)
from kernel_fun._common.witness import record_launch
from kernel_fun._delta.chunking import chunk_grid, chunk_program

install_interpreter_shims()

# The first is the interpreter's. sm_90a (Triton 3.6, 2026-12-05), H=HV=6 K=256 V=512: 64-128 registers,
# no stack in any; autotuned, 0.92 ms at fla_default_heads_b8 on an H100 (no config timed alone).
CONFIGS = [triton.Config({"BV": bv, "BK": bk}, num_warps=nw, num_stages=ns)
           for bv, bk, nw, ns in [(64, 64, 4, 2), (128, 64, 8, 2), (64, 128, 4, 2), (32, 64, 4, 3), (128, 128, 8, 3)]]
CANDIDATES: list = []


def _prune(configs, named_args, **kwargs):
    """Drop V-blocks wider than V and K-blocks wider than K (all masked lanes); at least one."""
    K, V = (kwargs.get(n, named_args.get(n)) for n in ("K", "V"))
    return fitting_blocks(configs, {"BV": max(V, 32), "BK": max(K, 64)})


@triton.jit(do_not_specialize=["T", "NT"])
def chunk_output_kernel(
    q,  # [B, T, H, K]
    h,  # [B, NT, HV, K, V] (the state before each chunk; NT summed over sequences when varlen)
    v_new,  # [B, T, HV, V]
    A,  # [B, T, HV, BT] the gated scores, scale in them, zero above the diagonal
    g,  # [B, T, HV] fp32, the chunk-local cumulative log2 gate
    o,  # [B, T, HV, V]
    cu_seqlens,
    chunk_indices,
    scale,
    T,
    NT,  # chunks in the batch (h's chunk axis)
    WORK,  # autotune key only: tuning.chunk_work(chunks x value heads)
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, IS_VARLEN: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    NV: tl.constexpr = (V + BV - 1) // BV
    _, i_hv, i_h, i_tg, row0, n_valid = chunk_program(cu_seqlens, chunk_indices, T, H, HV, BT, IS_VARLEN, NV)
    i_v = tl.program_id(0) % NV
    o_i = tl.arange(0, BT)
    m_t = o_i < n_valid
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    # the inter-chunk part, Q S over K in BK-wide slices
    b_o = tl.zeros([BT, BV], dtype=tl.float32)
    for i_k in tl.static_range(0, (K + BK - 1) // BK):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        b_q = tl.load(q + (row0 * H + i_h) * K + o_i[:, None] * (H * K) + o_k[None, :],
                      mask=m_t[:, None] & m_k[None, :], other=0.0)
        b_h = tl.load(h + ((i_tg * HV + i_hv) * K + o_k[:, None]) * V + o_v[None, :],
                      mask=m_k[:, None] & m_v[None, :], other=0.0)
        b_o += tl.dot(b_q, b_h, input_precision=DOT_PRECISION)
    b_g = tl.load(g + (row0 + o_i) * HV + i_hv, mask=m_t, other=0.0).to(tl.float32)
    b_o = b_o * (tl.exp2(b_g) * scale)[:, None]
    # the intra-chunk part; a row past the chunk's end is another sequence's (varlen) or past T
    b_a = tl.load(A + (row0 * HV + i_hv) * BT + o_i[:, None] * (HV * BT) + o_i[None, :],
                  mask=m_t[:, None] & m_t[None, :], other=0.0)
    b_vn = tl.load(v_new + (row0 * HV + i_hv) * V + o_i[:, None] * (HV * V) + o_v[None, :],
                   mask=m_t[:, None] & m_v[None, :], other=0.0)
    b_o += tl.dot(b_a, b_vn, input_precision=DOT_PRECISION)
    tl.store(o + (row0 * HV + i_hv) * V + o_i[:, None] * (HV * V) + o_v[None, :],
             b_o.to(o.dtype.element_ty), mask=m_t[:, None] & m_v[None, :])
    if IS_VARLEN:
        # the tokens after the last sequence belong to no chunk: zeros, as the fused scan writes them
        if i_tg == NT - 1:
            end = row0 + n_valid
            for i_p in range(tl.cdiv(T - end, BT)):
                o_p = end + i_p * BT + o_i
                tl.store(o + (o_p[:, None] * HV + i_hv) * V + o_v[None, :],
                         tl.zeros([BT, BV], dtype=tl.float32).to(o.dtype.element_ty),
                         mask=(o_p < T)[:, None] & m_v[None, :])


chunk_output_kernel_tuned = triton.autotune(
    configs=autotune_configs(CONFIGS), **autotune_cache(), prune_configs_by={"early_config_prune": _prune},
    key=["H", "HV", "K", "V", "BT", "IS_VARLEN", "WORK"],
)(chunk_output_kernel)


def chunk_output(q, h, v_new, Aqk, g, scale, cu_seqlens=None, chunk_indices=None, chunk_size: int = 64,
                 *, config: triton.Config | None = None):
    """``o [B, T, HV, V]`` (v_new's dtype; zero past ``cu_seqlens[-1]``) from q ``[B, T, H, K]``, h
    ``[B, NT, HV, K, V]``, v_new ``[B, T, HV, V]``, Aqk ``[B, T, HV, BT]`` (``gated_scores``) and g
    ``[B, T, HV]`` fp32 (the chunk-local cumulative log2 gate)."""
    B, T, H, K = q.shape
    HV, V = v_new.shape[2], v_new.shape[3]
    BT = chunk_size
    is_varlen = cu_seqlens is not None
    chunk_indices, NT = chunk_grid("chunk_output", B, T, BT, cu_seqlens, chunk_indices)
    if (HV % H or tuple(v_new.shape[:2]) != (B, T) or tuple(Aqk.shape) != (B, T, HV, BT)
            or tuple(g.shape) != (B, T, HV) or tuple(h.shape) != (B, NT, HV, K, V) or (is_varlen and B != 1)):
        raise ValueError(f"chunk_output: q {tuple(q.shape)} h {tuple(h.shape)} v_new {tuple(v_new.shape)} "
                         f"Aqk {tuple(Aqk.shape)} g {tuple(g.shape)} do not agree")
    q, h, v_new, Aqk, g = (x.contiguous() for x in (q, h, v_new, Aqk, g))
    if NT == 0:  # packed documents all empty: every token is padding
        return torch.zeros((B, T, HV, V), dtype=v_new.dtype, device=v_new.device)
    o = alloc((B, T, HV, V), dtype=v_new.dtype, device=v_new.device)
    args = dict(q=q, h=h, v_new=v_new, A=Aqk, g=g, o=o, cu_seqlens=cu_seqlens if is_varlen else o,
                chunk_indices=chunk_indices if is_varlen else o, scale=float(scale), T=T, NT=NT,
                WORK=chunk_work(B, T, BT, HV), H=H, HV=HV, K=K, V=V, BT=BT, IS_VARLEN=is_varlen,
                DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32")
    grid = (lambda meta: (NT * cdiv(V, meta["BV"]), B * HV))
    launch(chunk_output_kernel_tuned, grid, config, **args)
    record_launch("gdn.chunk_output")
    return o
