"""The KDA chain as shipped: the forward and backward as straight-line pipelines of stages,
ours or fla's own stage functions (fla's fetched through ``_common/compat.py`` so drift is
caught at warmup).

Shapes: q, k ``[B, T, H, K]``; v ``[B, T, HV, V]``; g ``[B, T, HV, K]``; beta ``[B, T, HV]``;
states ``[N, HV, K, V]`` fp32. Gates are chunk-local cumulative sums in log2 space.

Forward: gate cumsum (fla) -> intra scores, w, u, qg, kg (fla's ``chunk_kda_fwd_intra``) ->
our forward state scan, which makes o (in place of fla's fwd_h + fwd_o).
Backward: gate cumsum, w/u and h recompute (fla) -> our score gradient -> our backward state
scan, which also makes the intra-chunk dv -> our WY backward -> our intra backward (one
anchor, l2norm backward fused when HV == H) -> fla's l2norm backward (HV > H) -> our gate pass.
The decisions and their measurements: docs/kda.md ("How each stage was chosen").
"""
from __future__ import annotations

from .._common.compat import fla_symbol
from .._delta import chunking
from .._delta.inputs import l2norm_bwd
from .._delta._kernels.score_grad import score_grad_bwd
from .._delta._kernels.state_scan_bwd import state_scan_bwd
from .._delta._kernels.state_scan_fwd import state_scan_fwd
from ._kernels.gate_bwd import dg_cumsum_gate_bwd
from ._kernels.intra_bwd import FAST_RANGE as INTRA_BWD_FAST_RANGE
from ._kernels.intra_bwd import can_fuse_l2norm, intra_bwd
from ._kernels.wy_bwd import wy_dqkg_bwd

INTRA_BWD_DOTS = "ieee"  # the intra backward's dot precision (see backward)
RCP_LN2 = 1.4426950408889634  # log2(e): fla's gates are cumsummed in log2 space
BT = 64  # chunk size


def _fla(module: str, symbol: str):
    return fla_symbol(module, symbol)


def chunk_meta(cu_seqlens, cu_seqlens_cpu):
    """(chunk_indices, chunk_offsets) for packed documents, or (None, None)."""
    return chunking.chunk_meta(cu_seqlens, BT, cu_seqlens_cpu)


def gate_cumsum(g, A_log, dt_bias, use_gate_in_kernel, cu_seqlens, chunk_indices):
    """Chunk-local cumulative log2-space gate ``[B, T, HV, K]`` fp32 (gate function fused in)."""
    if use_gate_in_kernel:
        return _fla("fla.ops.kda.gate", "kda_gate_chunk_cumsum")(
            g=g, A_log=A_log, dt_bias=dt_bias, scale=RCP_LN2, chunk_size=BT,
            cu_seqlens=cu_seqlens, chunk_indices=chunk_indices)
    return _fla("fla.ops.utils.cumsum", "chunk_local_cumsum")(
        g=g, scale=RCP_LN2, chunk_size=BT, cu_seqlens=cu_seqlens, chunk_indices=chunk_indices)


def forward(q, k, v, g, beta, A_log, dt_bias, scale, initial_state, output_final_state,
            use_gate_in_kernel, cu_seqlens, cu_seqlens_cpu):
    """q, k already l2-normalized and beta already activated where the call asks.
    Returns (o, final_state, Aqk, Akk, chunk_indices, chunk_offsets)."""
    chunk_indices, chunk_offsets = chunk_meta(cu_seqlens, cu_seqlens_cpu)
    gc = gate_cumsum(g, A_log, dt_bias, use_gate_in_kernel, cu_seqlens, chunk_indices)
    # disable_recompute also returns the gated queries qg = q * exp2(gc), which our scan reads
    # in place of q and the gate: 0.93 against 1.27 ms at B=8 on the H200 (2026-11-30).
    w, u, qg, kg, Aqk, Akk = _fla("fla.ops.kda.chunk_intra", "chunk_kda_fwd_intra")(
        q=q, k=k, v=v, gk=gc, beta=beta, scale=scale, cu_seqlens=cu_seqlens, chunk_size=BT,
        chunk_indices=chunk_indices, disable_recompute=True)
    # o made inside the scan; h and v_new never written. qg is freed when this returns.
    o, final_state, _, _ = state_scan_fwd(
        qg, kg, w, u, gk=gc, Aqk=Aqk, scale=scale, initial_state=initial_state,
        output_final_state=output_final_state, cu_seqlens=cu_seqlens, chunk_indices=chunk_indices,
        chunk_offsets=chunk_offsets, chunk_size=BT, q_gated=True)
    return o, final_state, Aqk, Akk, chunk_indices, chunk_offsets


def backward(q, k, v, g, beta, A_log, dt_bias, scale, initial_state, Aqk, Akk, do, dht,
             use_gate_in_kernel, cu_seqlens, chunk_indices, chunk_offsets, q_rstd=None, k_rstd=None):
    """Gradients w.r.t. q, k, v, the raw gate g, the (activated) beta, the initial state, and
    A_log / dt_bias when the gate is in the op. q and k are the normalized ones when
    ``q_rstd``/``k_rstd`` (l2norm_fwd's) are given, and dq, dk then are those of the raw q, k."""
    H, HV, K = q.shape[2], v.shape[2], q.shape[3]
    gc = gate_cumsum(g, A_log, dt_bias, use_gate_in_kernel, cu_seqlens, chunk_indices)
    w, u, qg, kg = _fla("fla.ops.kda.wy_fast", "recompute_w_u_fwd")(
        q=q, k=k, v=v, beta=beta, A=Akk, gk=gc, cu_seqlens=cu_seqlens, chunk_indices=chunk_indices)
    h, v_new, _ = _fla("fla.ops.common.chunk_delta_h", "chunk_gated_delta_rule_fwd_h")(
        k=kg, w=w, u=u, gk=gc, initial_state=initial_state, output_final_state=False,
        cu_seqlens=cu_seqlens, chunk_indices=chunk_indices, chunk_offsets=chunk_offsets, chunk_size=BT)
    # Each intermediate is released as soon as its last reader has run (peak memory): u here;
    # qg, kg, w after the state scan; h, dh, v_new and the scan's dv after the WY stage;
    # tests/kda/test_chain_cpu.py checks the lifetimes.
    del u
    # fla's chunk_kda_bwd_dAv split: dAqk alone here, dv = Aqk^T do inside our state scan.
    dAqk = score_grad_bwd(v_new, do, scale, cu_seqlens=cu_seqlens, chunk_size=BT, chunk_indices=chunk_indices)
    dh, dh0, dv = state_scan_bwd(
        q=qg, k=kg, w=w, gk=gc, h0=initial_state, dht=dht, do=do, dv=None, A=Aqk, scale=scale,
        cu_seqlens=cu_seqlens, chunk_size=BT, chunk_indices=chunk_indices, chunk_offsets=chunk_offsets)
    del qg, kg, w
    dq, dk, dv, db, dg, dAkk = wy_dqkg_bwd(
        q=q, k=k, v=v, v_new=v_new, g=gc, beta=beta, A=Akk, h=h, do=do, dh=dh, dv=dv, scale=scale,
        cu_seqlens=cu_seqlens, chunk_size=BT, chunk_indices=chunk_indices, chunk_offsets=chunk_offsets)
    del h, dh, v_new
    # The l2norm backward of q and k in the intra stage's epilogue needs one q/k head per value
    # head (grouped heads are summed after the stage) and a K block covering K.
    fused_l2 = q_rstd is not None and can_fuse_l2norm(H, HV, K)
    l2 = dict(l2norm_rstd=(q_rstd, k_rstd), out_dtype=q.dtype) if fused_l2 else {}
    # The gate function's log decays are <= 0, so their chunk cumsum is non-increasing. fp32 dots:
    # dg's terms cancel (the gate's gradient is invariant to a shift of every g), and dA_log and
    # ddt_bias sum dg over every token and channel; with tf32 dots they had 2-16x fla's error on
    # some calls (docs/kda.md, "Errors"). 1% of this stage's time on an H100.
    dq, dk, db, dg = intra_bwd(
        q=q, k=k, g=gc, beta=beta, dAqk=dAqk, dAkk=dAkk, dq=dq, dk=dk, db=db, dg=dg,
        cu_seqlens=cu_seqlens, chunk_indices=chunk_indices, chunk_size=BT, dot_precision=INTRA_BWD_DOTS,
        fast_range=INTRA_BWD_FAST_RANGE, gate_monotone=use_gate_in_kernel, **l2)
    if HV > H:  # grouped values: dq, dk come out per value head
        dq = dq.view(*dq.shape[:2], H, HV // H, dq.shape[-1]).sum(dim=3)
        dk = dk.view(*dk.shape[:2], H, HV // H, dk.shape[-1]).sum(dim=3)
    if q_rstd is not None and not fused_l2:
        dq = l2norm_bwd(q, q_rstd, dq)
        dk = l2norm_bwd(k, k_rstd, dk)
    # dg's chunk-local reverse cumsum and (gate in the op) the gate's backward, one pass.
    dg, dA_log, ddt_bias = dg_cumsum_gate_bwd(dg, g if use_gate_in_kernel else None, A_log, dt_bias,
                                              cu_seqlens=cu_seqlens, chunk_size=BT, chunk_indices=chunk_indices)
    return dq, dk, dv, db, dg, dh0, dA_log, ddt_bias
