"""The KDA chain: the forward and backward as a list of stages, each ours or fla's own stage
function (fla's are fetched through ``_common/compat.py`` so drift is caught at warmup).

Shapes: q, k ``[B, T, H, K]``; v ``[B, T, HV, V]``; g ``[B, T, HV, K]``; beta ``[B, T, HV]``;
states ``[N, HV, K, V]`` fp32. Gates are chunk-local cumulative sums in log2 space.
Which stages are ours is the table ``STAGES`` at the bottom of this module; the README's kda
section has the measured per-stage times.
"""
from __future__ import annotations

import torch
import triton

from .._common.compat import fla_symbol

RCP_LN2 = 1.4426950408889634  # log2(e): fla's gates are cumsummed in log2 space
BT = 64  # chunk size


def _fla(module: str, symbol: str):
    return fla_symbol(module, symbol)


def chunk_meta(cu_seqlens, cu_seqlens_cpu):
    """(chunk_indices, chunk_offsets) for packed documents, or (None, None)."""
    if cu_seqlens is None:
        return None, None
    idx = _fla("fla.ops.utils.index", "prepare_chunk_indices")(cu_seqlens, BT, cu_seqlens_cpu=cu_seqlens_cpu)
    off = _fla("fla.ops.utils.index", "prepare_chunk_offsets")(cu_seqlens, BT)
    return idx, off


def gate_cumsum(g, A_log, dt_bias, use_gate_in_kernel, cu_seqlens, chunk_indices):
    """Chunk-local cumulative log2-space gate ``[B, T, HV, K]`` fp32 (gate function fused in)."""
    if use_gate_in_kernel:
        return _fla("fla.ops.kda.gate", "kda_gate_chunk_cumsum")(
            g=g, A_log=A_log, dt_bias=dt_bias, scale=RCP_LN2, chunk_size=BT,
            cu_seqlens=cu_seqlens, chunk_indices=chunk_indices)
    return _fla("fla.ops.utils.cumsum", "chunk_local_cumsum")(
        g=g, scale=RCP_LN2, chunk_size=BT, cu_seqlens=cu_seqlens, chunk_indices=chunk_indices)


def intra_scores(q, k, gc, beta, scale, cu_seqlens, chunk_indices):
    """fla's ``chunk_kda_fwd_intra`` without its closing ``recompute_w_u_fwd``: the two stages
    that make the scores, (Aqk, Akk) ``[B, T, HV, BT]`` in k's dtype (Aqk's upper triangle
    unwritten, Akk zero there, as fla leaves them)."""
    B, T, H, K = k.shape
    HV = gc.shape[2]
    BC = 16
    NT = triton.cdiv(T, BT) if cu_seqlens is None else len(chunk_indices)
    Aqk = torch.empty(B, T, HV, BT, device=k.device, dtype=k.dtype)
    Akk = torch.zeros(B, T, HV, BT, device=k.device, dtype=k.dtype)
    Akkd = torch.empty(B, T, HV, BC, device=k.device, dtype=torch.float32)  # the fp32 diagonal blocks
    _fla("fla.ops.kda.chunk_intra_token_parallel", "chunk_kda_fwd_intra_token_parallel")(
        q=q, k=k, gk=gc, beta=beta, Aqk=Aqk, Akk=Akkd, scale=scale, cu_seqlens=cu_seqlens, chunk_size=BT,
        sub_chunk_size=BC)
    _fla("fla.ops.kda.chunk_intra", "chunk_kda_fwd_kernel_inter_solve_fused")[(NT, B * HV)](
        q=q, k=k, g=gc, beta=beta, Aqk=Aqk, Akkd=Akkd, Akk=Akk, scale=scale, cu_seqlens=cu_seqlens,
        chunk_indices=chunk_indices, T=T, H=H, HV=HV, K=K, BT=BT, BC=BC, NC=BT // BC, USE_SAFE_GATE=False,
        USE_GRAPH=False)
    return Aqk, Akk


def forward(q, k, v, g, beta, A_log, dt_bias, scale, initial_state, output_final_state,
            use_gate_in_kernel, cu_seqlens, cu_seqlens_cpu):
    """q, k already l2-normalized and beta already activated where the call asks.
    Returns (o, final_state, Aqk, Akk, chunk_indices, chunk_offsets)."""
    chunk_indices, chunk_offsets = chunk_meta(cu_seqlens, cu_seqlens_cpu)
    gc = gate_cumsum(g, A_log, dt_bias, use_gate_in_kernel, cu_seqlens, chunk_indices)
    scan = STAGES.get("state_scan_fwd")
    if scan is not None and FUSE_WY_FWD:
        # w, u and kg formed per chunk inside our scan from Akk, k, v, beta and the gate: only
        # the scores are made before it (ours in one kernel, or fla's two stages), and no w,
        # u, qg, kg are written or read back.
        Aqk, Akk = (STAGES.get("intra_fwd") or intra_scores)(q, k, gc, beta, scale, cu_seqlens, chunk_indices)
        o, final_state, _, _ = scan(
            q, k, None, None, gk=gc, Aqk=Aqk, scale=scale, initial_state=initial_state,
            output_final_state=output_final_state, cu_seqlens=cu_seqlens, chunk_indices=chunk_indices,
            chunk_offsets=chunk_offsets, chunk_size=BT, wy_inputs=(v, beta, Akk))
        return o, final_state, Aqk, Akk, chunk_indices, chunk_offsets
    # With our scan, the w/u pass also writes the gated queries qg = q * exp2(gc) (fla's
    # ``disable_recompute`` switch does only that in this stage): the scan then reads qg instead
    # of q and the gate, 0.93 vs 1.27 ms at B=8 on the H200 for 0.27 GB more written. qg is
    # freed when the forward returns (the backward recomputes it).
    fwd_intra = STAGES.get("fwd_intra") or _fla("fla.ops.kda.chunk_intra", "chunk_kda_fwd_intra")
    w, u, qg, kg, Aqk, Akk = fwd_intra(
        q=q, k=k, v=v, gk=gc, beta=beta, scale=scale, cu_seqlens=cu_seqlens, chunk_size=BT,
        chunk_indices=chunk_indices, disable_recompute=scan is not None)
    if scan is not None:  # ours: o made inside the scan; h and v_new never written
        o, final_state, _, _ = scan(
            qg, kg, w, u, gk=gc, Aqk=Aqk, scale=scale, initial_state=initial_state,
            output_final_state=output_final_state, cu_seqlens=cu_seqlens,
            chunk_indices=chunk_indices, chunk_offsets=chunk_offsets, chunk_size=BT, q_gated=True)
        return o, final_state, Aqk, Akk, chunk_indices, chunk_offsets
    h, v_new, final_state = _fla("fla.ops.common.chunk_delta_h", "chunk_gated_delta_rule_fwd_h")(
        k=kg, w=w, u=u, gk=gc, initial_state=initial_state, output_final_state=output_final_state,
        cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu, chunk_indices=chunk_indices,
        chunk_offsets=chunk_offsets, chunk_size=BT)
    o = _fla("fla.ops.gla.chunk", "chunk_gla_fwd_o_gk")(
        q=q, v=v_new, g=gc, A=Aqk, h=h, scale=scale, cu_seqlens=cu_seqlens, chunk_size=BT,
        chunk_indices=chunk_indices)
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
    # qg, kg, w after the state scan (dhu_args holds them until then); h, dh, v_new and the
    # scan's dv after the WY stage (wy_args); tests/kda/test_chain_cpu.py checks the lifetimes.
    del u
    dhu_args = dict(q=qg, k=kg, w=w, gk=gc, h0=initial_state, dht=dht, do=do, scale=scale, cu_seqlens=cu_seqlens,
                    chunk_size=BT, chunk_indices=chunk_indices, chunk_offsets=chunk_offsets)
    del qg, kg, w
    our_dhu = STAGES.get("state_scan_bwd")
    wy, intra = STAGES.get("wy_bwd"), STAGES.get("intra_bwd")
    fused_wyi = FUSE_WY_INTRA_BWD and wy is not None and intra is not None
    dvd = our_dhu is not None and FUSE_DV_DHU
    daqk_in_wy = dvd and FUSE_DAQK_WY and wy is not None and not fused_wyi
    if dvd:  # dv = Aqk^T do made inside our dhu; dAqk alone here, or in our WY stage
        dAqk = None if daqk_in_wy else score_grad_bwd(
            v_new, do, scale, cu_seqlens=cu_seqlens, chunk_size=BT, chunk_indices=chunk_indices)
        dh, dh0, dv = our_dhu(**dhu_args, dv=None, A=Aqk)
    else:
        dAqk, dv = _fla("fla.ops.kda.chunk_bwd", "chunk_kda_bwd_dAv")(
            q=q, k=k, v=v_new, do=do, A=Aqk, scale=scale, cu_seqlens=cu_seqlens, chunk_size=BT,
            chunk_indices=chunk_indices)
        dhu = our_dhu or _fla("fla.ops.common.chunk_delta_h", "chunk_gated_delta_rule_bwd_dhu")
        dh, dh0, dv = dhu(**dhu_args, dv=dv)
    del dhu_args
    whole_k = (wyi_whole_k_block if fused_wyi else intra_whole_k_block)(K)
    fused_l2 = q_rstd is not None and intra is not None and FUSE_L2NORM_BWD and intra_l2norm_fusable(H, HV, whole_k)
    fused_cs = intra is not None and FUSE_DG_CUMSUM and whole_k
    fused_gate = fused_cs and use_gate_in_kernel and FUSE_GATE_BWD
    extra = dict(l2norm_rstd=(q_rstd, k_rstd), out_dtype=q.dtype) if fused_l2 else {}
    if fused_cs:
        extra["dg_reverse_cumsum"] = True
    if fused_gate:
        extra["gate_bwd"] = (g, A_log, dt_bias)
    if intra is not None and INTRA_BWD_ONE_ANCHOR:
        extra["fast_range"] = INTRA_BWD_FAST_RANGE
        # the gate function's log decays are <= 0, so their chunk cumsum is non-increasing
        extra["gate_monotone"] = use_gate_in_kernel
    wy_args = dict(q=q, k=k, v=v, v_new=v_new, g=gc, beta=beta, A=Akk, h=h, do=do, dh=dh, dv=dv, scale=scale,
                   cu_seqlens=cu_seqlens, chunk_size=BT, chunk_indices=chunk_indices)
    del h, dh, v_new, dv
    if fused_wyi:  # both stages in one kernel: their dq, dk, dg, db, dA never leave L2
        dq, dk, dv, db, dg, *gate_grads = wy_intra_bwd(**wy_args, dAqk=dAqk, **extra)
        del wy_args
    else:
        wy = wy or _fla("fla.ops.kda.chunk_bwd", "chunk_kda_bwd_wy_dqkg_fused")
        if daqk_in_wy:
            dq, dk, dv, db, dg, dAkk, dAqk = wy(**wy_args, chunk_offsets=chunk_offsets, with_score_grad=True)
        else:
            dq, dk, dv, db, dg, dAkk = wy(**wy_args, chunk_offsets=chunk_offsets)
        del wy_args
        intra = intra or _fla("fla.ops.kda.chunk_intra", "chunk_kda_bwd_intra")
        dq, dk, db, dg, *gate_grads = intra(
            q=q, k=k, g=gc, beta=beta, dAqk=dAqk, dAkk=dAkk, dq=dq, dk=dk, db=db, dg=dg,
            cu_seqlens=cu_seqlens, chunk_indices=chunk_indices, chunk_size=BT, **extra)
    if HV > H:  # grouped values: dq, dk come out per value head
        dq = dq.view(*dq.shape[:2], H, HV // H, dq.shape[-1]).sum(dim=3)
        dk = dk.view(*dk.shape[:2], H, HV // H, dk.shape[-1]).sum(dim=3)
    if q_rstd is not None and not fused_l2:
        dq = l2norm_bwd(q, q_rstd, dq)
        dk = l2norm_bwd(k, k_rstd, dk)
    dA_log, ddt_bias = gate_grads if fused_gate else (None, None)
    our_gate = STAGES.get("gate_bwd")
    if our_gate is not None and not fused_cs:  # the reverse cumsum and the gate's backward, one pass
        dg, dA_log, ddt_bias = our_gate(dg, g if use_gate_in_kernel else None, A_log, dt_bias,
                                        cu_seqlens=cu_seqlens, chunk_size=BT, chunk_indices=chunk_indices)
    else:
        if not fused_cs:
            dg = _fla("fla.ops.utils.cumsum", "chunk_local_cumsum")(
                g=dg, chunk_size=BT, reverse=True, cu_seqlens=cu_seqlens, chunk_indices=chunk_indices)
        if use_gate_in_kernel and not fused_gate:
            dg, dA_log, ddt_bias = _fla("fla.ops.kda.gate", "kda_gate_bwd")(
                g=g, A_log=A_log, dt_bias=dt_bias, dyg=dg)
    return dq, dk, dv, db, dg, dh0, dA_log, ddt_bias


def l2norm_fwd(x):
    return _fla("fla.modules.norm.l2norm", "l2norm_fwd")(x)


def l2norm_bwd(y, rstd, dy):
    return _fla("fla.modules.norm.l2norm", "l2norm_bwd")(y, rstd, dy)


def beta_sigmoid_fwd(x, scale):
    return _fla("fla.ops.common.gate", "fused_beta_sigmoid_fwd")(x, scale=scale)


def beta_sigmoid_bwd(x, dy, scale):
    return _fla("fla.ops.common.gate", "fused_beta_sigmoid_bwd")(x, dy, scale=scale)


# Where ours replaces fla's stage function (same arguments, same returns). Measured on the
# H200 at B=8, T=8192, H=HV=16, K=128, V=256 bf16, 2026-11-30 (bench/records/raw/*-r2.json;
# at B=16 in bench/records/2026-11-30-h200-kda-249e593.json):
# intra_bwd 4.25 ms vs fla 7.31; wy_bwd 3.63 vs 6.25; state_scan_fwd reading qg 0.93 vs fla's
# fwd_h + fwd_o 1.86.
from .._delta._kernels.state_scan_bwd import state_scan_bwd  # noqa: E402
from .._delta._kernels.state_scan_fwd import state_scan_fwd  # noqa: E402
from ._kernels.gate_bwd import dg_cumsum_gate_bwd  # noqa: E402
from ._kernels.intra_fwd import chunk_fwd_intra, intra_fwd  # noqa: E402
from ._kernels.intra_bwd import FAST_RANGE as INTRA_BWD_FAST_RANGE  # noqa: E402
from ._kernels.intra_bwd import intra_bwd  # noqa: E402
from ._kernels.intra_bwd import l2norm_fusable as intra_l2norm_fusable  # noqa: E402
from ._kernels.intra_bwd import whole_k_block as intra_whole_k_block  # noqa: E402
from ._kernels.score_grad import score_grad_bwd  # noqa: E402
from ._kernels.wy_bwd import wy_dqkg_bwd  # noqa: E402
from ._kernels.wy_intra_bwd import whole_k_block as wyi_whole_k_block  # noqa: E402
from ._kernels.wy_intra_bwd import wy_intra_bwd  # noqa: E402

STAGES: dict = {"state_scan_fwd": state_scan_fwd, "intra_bwd": intra_bwd, "wy_bwd": wy_dqkg_bwd,
                 "state_scan_bwd": state_scan_bwd, "gate_bwd": dg_cumsum_gate_bwd}
# The backward state scan (our dhu, in place of fla's chunk_gated_delta_rule_bwd_dhu) is shipped
# with FUSE_DV_DHU below: end to end at B=16 on the H200 (scripts/kda_switch_ab.py, 2026-11-30,
# bench/records/raw/2026-11-30-h200-kda-ab-dvd.json) fwd+bwd 32.79 ms alone and 32.10 with
# FUSE_DV_DHU, against 32.93 with fla's dhu and dAv. Its dA_log, the ill-conditioned sum over
# every token and channel, against the fp64 recurrence on seeded inputs (H200, 2026-11-30,
# bench/records/raw/2026-11-30-h200-kda-variants.json): cu_seqlens 2.81e-2 with both (fla's dhu
# and dAv in our chain 2.76e-2; fla's own chunk_kda 4.25e-2), tail_grouped 3.50e-3 (3.53e-3).

# The backward's closing pass over dg (kda/_kernels/gate_bwd.py, in place of fla's
# chunk_local_cumsum (reverse) and kda_gate_bwd, 0.58 + 0.59 ms at B=16 on the H200, record
# 0be0a9c): dg and the raw gate read once and dg_raw written once, about 2.2 GB against 4.3, a
# 0.5 ms floor. End to end at B=16 on the H200 (scripts/kda_switch_ab.py, 2026-11-30,
# bench/records/raw/2026-11-30-h200-kda-ab-gbwd.json): fwd+bwd 31.48 ms against 32.11 without
# it; 30.78 against 31.48 with the one anchor below; dg 2.8e-5 from fla's pair (the sum order).

# Stages of ours built and tested but not shipped; scripts/kda_switch_ab.py times each against
# the shipped chain.
#
# The forward's intra stage in one kernel (kda/_kernels/intra_fwd.py), interpreter-tested
# against the fp64 intra reference and within 3.1e-3 of fla's outputs on the H200: "fwd_intra"
# is fla's whole chunk_kda_fwd_intra (the scores Aqk, Akk = (I + L)^-1 in place of its
# token-parallel stage and inter + solve kernel, and w, u, qg, kg in place of its
# recompute_w_u_fwd pass); "intra_fwd" the scores alone (with FUSE_WY_FWD). Slower than fla's
# at B=16 on the H200 even with the block anchors (scripts/kda_stage_bench.py --only fwdi,
# 2026-11-30, bench/records/raw/2026-11-30-h200-kda-stage-ianc-wyi-fwdi.json): the whole stage
# 5.51 ms at its best (tf32 diagonal and solve) against fla's 4.55; the scores alone 4.15 ms
# against the 3.14 of fla's two score stages.
CANDIDATE_STAGES: dict = {"fwd_intra": chunk_fwd_intra, "intra_fwd": intra_fwd}

# Forward: w, u and kg formed inside our forward scan (state_scan_fwd's wy_inputs) from Akk,
# k, v, beta and the gate, instead of fla's recompute_w_u_fwd writing w, u, qg, kg (2.7 GB at
# B=16) for the scan to read back. Interpreter-tested (tests/delta/test_state_scan_fwd.py, the
# CPU chain test). Slower on the H200 at B=16 (scripts/kda_switch_ab.py "l2+wyf", 2026-11-30,
# bench/records/raw/2026-11-30-h200-kda-ab-r2.json): fwd 8.46 ms against 7.65, fwd+bwd 33.59
# against 32.72. Off.
FUSE_WY_FWD = False

# Backward: our WY and intra stages in one kernel (kda/_kernels/wy_intra_bwd.py), so the WY
# stage's dq, dk, dg, db and dA (about 3.7 GB at B=16) are read back from L2 by the program
# that wrote them instead of from HBM by the intra stage's. Interpreter-tested (bit for bit
# the two stage kernels' outputs, tests/kda/test_wy_intra_bwd.py). Slower on the H200 at B=16
# (scripts/kda_stage_bench.py --only wyi, 2026-11-30): 16.35 ms at its best configuration
# against 15.72 for the two launches. Off.
FUSE_WY_INTRA_BWD = False

# Backward: our intra stage's diagonal blocks by one anchor where the gate's range over the
# 16-row block stays within FAST_RANGE log2 units on every channel (kda/_kernels/intra_bwd.py):
# four dots and two exp2 per element instead of the bit levels' eight and four; blocks past
# the range take the bit levels. Timed on the H200 at B=16, T=8192, H=HV=16, K=128
# (2026-11-30) with the block's first row as anchor and a range of 120: the stage 7.36 ms
# against 8.48 by the levels alone (fla's 14.69) on scripts/kda_stage_bench.py's gates
# (bench/records/raw/2026-11-30-h200-kda-stage-ianc-wyi-fwdi.json), within 5.1e-4 of fla's
# outputs; in the chain on the kernel-fun bench's steeper gates 8.61 ms against 8.91. That
# anchor put factors out to 2^+-120 (denormal flush, overflow: see intra_bwd.py); the anchor
# is now the middle of the block's range and the range 192 (factors within 2^+-96),
# interpreter-tested. In the chain at B=16 it is slower (scripts/kda_switch_ab.py "l2+ianc+dhu",
# H200 2026-11-30, bench/records/raw/2026-11-30-h200-kda-ab-dvd.json): 33.43 ms against 32.79
# without it, 33.11 against 32.45 with dvd+daqk; on seeded inputs its dA_log from fp64 is 2.90e-2
# at cu_seqlens against 2.76e-2 without (bench/records/raw/2026-11-30-h200-kda-variants.json).
# With the gate in the op the chain now also passes gate_monotone (the block's range read from
# its first and last rows, not reduced over its 16; same bits, interpreter-tested): then it wins
# (scripts/kda_switch_ab.py, H200 2026-11-30, bench/records/raw/2026-11-30-h200-kda-ab-gbwd.json):
# 31.48 ms against 32.11 without it, 30.78 against 31.48 with our gate pass; dq, dk 8e-4 from
# the chain without it (tf32 rounding of the other split). On.
INTRA_BWD_ONE_ANCHOR = True

# Backward, with our backward state scan in the chain: fla's chunk_kda_bwd_dAv (1.00 ms at
# B=16, at its bytes' floor: it reads do, v_new, Aqk and writes dAqk and the intra-chunk dv,
# 4.0 GB) replaced by our score gradient alone (kda/_kernels/score_grad.py: reads do and v_new,
# writes dAqk, 2.7 GB) and dv = Aqk^T do made inside our dhu, which loads do anyway, so the
# 1.07 GB dv is neither written nor read back (the project notes on KDA: "dAv can disappear").
# On the H200 at B=16 (scripts/kda_switch_ab.py, 2026-11-30, bench/records/raw/
# 2026-11-30-h200-kda-ab-dvd.json): fwd+bwd 32.10 ms against 32.79 without it. On.
FUSE_DV_DHU = True
# With it, the score gradient made in a prologue of our WY backward (wy_bwd with_score_grad),
# which reads do and v_new anyway, instead of by score_grad.py's own pass over them (2.1 GB at
# B=16). Interpreter- and GPU-tested; slower in the chain (same run): 32.45 ms against 32.10
# (the prologue's registers cost the WY stage more than the pass it saves). Off.
FUSE_DAQK_WY = False

# The switches below are epilogues of our intra backward (they need a K block covering K).
# Measured end to end at B=16, T=8192, H=HV=16, K=128, V=256 bf16 on the H200, 2026-11-30
# (scripts/kda_switch_ab.py, bench/records/raw/2026-11-30-h200-kda-ab.json; fwd+bwd 33.26-33.57
# ms without any of them; each checked against the unfused chain there, dq/dk 1e-5 apart):
# the l2norm backward of q and k (HV == H): saves fla's l2norm_bwd and the fp32 dq/dk round
# trip, -0.61 to -0.63 ms. On.
FUSE_L2NORM_BWD = True
# the chunk-local reverse cumsum of dg: +1.08 ms on top of the l2norm one (it was to save fla's
# chunk_local_cumsum, 0.58 ms). Off.
FUSE_DG_CUMSUM = False
# with it, the gate's backward (dA_log, ddt_bias from per-program partials): +1.00 ms more
# (it was to save kda_gate_bwd, 0.59 ms). Off.
FUSE_GATE_BWD = False
