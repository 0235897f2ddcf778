"""KDA backward, the WY stage and the intra stage in one kernel: ``wy_bwd`` then ``intra_bwd``
for the same (chunk, value head), one program each.

Why: the WY stage writes dq, dk, dg (fp32 ``[B, T, HV, K]``), db and dA (the gradient of L,
fp32 ``[B, T, HV, 64]``) that the intra stage reads straight back, with q, k, the gate and
beta that both read: about 3.7 GB written and read again at B=16, T=8192, H=HV=16, K=128
(about 0.9 ms of HBM time each way at 4.2 TB/s). In one program the intra half reads the WY
half's rows moments after they were written, by the same CTA (a barrier between), about 115 KB
per program: from L2, not HBM, while the grid's resident programs fit in it.

The two halves are the stage kernels' own bodies (``wy_bwd.wy_bwd_program``,
``intra_bwd.intra_bwd_program``), so the math, the precision and every flag (the l2norm
backward, dg's reverse cumsum and the gate backward epilogues) are theirs; one configuration
carries both halves' tile sizes (``WBK``/``WBV``/``EARLY_EPI`` for the WY half, ``IBK``/
``HOIST_S`` for the intra one). The WY half's outputs are still written to global memory (the
intra half reads them as it reads its inputs); only dv leaves from the WY half. The intra half
writes its outputs over the WY half's where the dtype allows (db, dg without the gate
epilogue, dq and dk without the l2norm one), so those lines are written back to HBM once; with
the l2norm epilogue the fp32 dq, dk lines (2.1 GB at B=16) are dead but still written back.

Measured slower on the H200 at B=16 (``scripts/kda_stage_bench.py --only wyi``, 2026-11-30):
16.35 ms at its best configuration against 15.72 for the two stage launches (255 registers, the
WY half's stack), so ``kda.chain.FUSE_WY_INTRA_BWD`` is off.
"""
from __future__ import annotations

import triton
import triton.language as tl

from kernel_fun._common.tuning import autotune_cache, autotune_configs, install_interpreter_shims
from kernel_fun._common.witness import record_launch
from kernel_fun.kda._kernels import chunk_program, launch
from kernel_fun.kda._kernels import intra_bwd as _intra
from kernel_fun.kda._kernels import wy_bwd as _wy
from kernel_fun.kda._kernels.intra_bwd import intra_bwd_program, whole_k_prune
from kernel_fun.kda._kernels.wy_bwd import wy_bwd_program

install_interpreter_shims()


def configs():
    """Every configuration the autotuner may pick (the interpreter runs only the first).
    The halves' measured best (B=8, every configuration forced): WY BK=64 BV=64 on 8 warps, 4
    stages (3.63 ms) and BK=32 BV=64 early epilogue on 4 warps, 3 stages (3.75); intra BK=128
    on 4 warps (the only block its fused epilogues take at K=128) or BK=64. One num_warps and
    one num_stages serve both halves here. Timed together on the H200 at B=16: 16.35 ms at the
    best of them (the module docstring)."""
    return [triton.Config({"WBK": wbk, "WBV": wbv, "EARLY_EPI": ee, "IBK": ibk, "HOIST_S": False},
                          num_warps=w, num_stages=st)
            for wbk, wbv, ee, ibk, w, st in [(32, 64, True, 128, 4, 3), (32, 64, True, 128, 4, 1),
                                            (64, 64, False, 128, 8, 4), (64, 64, False, 128, 8, 1),
                                            (32, 64, True, 64, 4, 3), (64, 64, False, 64, 8, 4)]]


_MAX_IBK = max(c.kwargs["IBK"] for c in autotune_configs(configs()))


@triton.autotune(configs=autotune_configs(configs()), **autotune_cache(),
                 key=["H", "HV", "K", "V", "BT", "IS_VARLEN", "DOT_PRECISION", "L2NORM_BWD", "DG_CUMSUM", "GATE_BWD",
                      "FAST_RANGE", "GATE_MONOTONE"],
                 prune_configs_by={"early_config_prune": whole_k_prune("IBK")})
@triton.jit(do_not_specialize=["T"])
def _wy_intra_bwd_kernel(
    q, k, v, v_new, g, beta, A, h, do, dh, dv,
    dq, dk, dv2, dg, db, dA,
    q_i, k_i, g_i, beta_i, dAqk, dAkk, dq_i, dk_i, db_i, dg_i,
    dq_out, dk_out, db_out, dg_out, q_rstd, k_rstd, g_raw, A_log, dt_bias, dA_part, dbias_part,
    cu_seqlens, chunk_indices, scale, T,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
    IS_VARLEN: tl.constexpr, DOT_PRECISION: tl.constexpr,
    WBK: tl.constexpr, WBV: tl.constexpr, EARLY_EPI: tl.constexpr, IBK: tl.constexpr, HOIST_S: tl.constexpr,
    L2NORM_BWD: tl.constexpr = False, DG_CUMSUM: tl.constexpr = False,
    GATE_BWD: tl.constexpr = False, HAS_DT_BIAS: tl.constexpr = False, FAST_RANGE: tl.constexpr = -1.0,
    GATE_MONOTONE: tl.constexpr = False,
):
    # q_i .. dg_i: the intra half's inputs, the same tensors as the WY half's (q, k, g, beta)
    # and outputs (dq, dk, db, dg, dA); passed again so each half keeps its own pointer offsets
    _, i_hv, i_h, i_tg, t0, n_valid = chunk_program(cu_seqlens, chunk_indices, T, H, HV, BT, IS_VARLEN)
    wy_bwd_program(q, k, v, v_new, g, beta, A, h, do, dh, dv, dq, dk, dv2, dg, db, dA, dA, scale,
                   i_hv, i_h, i_tg, t0, n_valid, H, HV, K, V, BT, WBK, WBV, DOT_PRECISION, EARLY_EPI, False)
    # the WY half's rows of dq, dk, dg, db and dA, written by other threads of this program,
    # are read by the intra half: every write before the barrier is visible after it
    tl.debug_barrier()
    intra_bwd_program(q_i, k_i, g_i, beta_i, dAqk, dAkk, dq_i, dk_i, db_i, dg_i, dq_out, dk_out, db_out, dg_out,
                      q_rstd, k_rstd, g_raw, A_log, dt_bias, dA_part, dbias_part, i_hv, i_h, i_tg, t0, n_valid,
                      H, HV, K, BT, IBK, HOIST_S, DOT_PRECISION, L2NORM_BWD, DG_CUMSUM, GATE_BWD, HAS_DT_BIAS,
                      FAST_RANGE, GATE_MONOTONE)


def whole_k_block(K: int, config=None) -> bool:
    """Whether an intra K block covering K is available (the fused intra epilogues need it)."""
    return (config.kwargs["IBK"] if config is not None else _MAX_IBK) >= K


def wy_intra_bwd(q, k, v, v_new, g, beta, A, h, do, dh, dv, dAqk, scale=None, cu_seqlens=None, chunk_size=64,
                 chunk_indices=None, dot_precision: str = "tf32", config=None, *, l2norm_rstd=None,
                 out_dtype=None, dg_reverse_cumsum: bool = False, gate_bwd=None, fast_range=None,
                 gate_monotone: bool = False):
    """``wy_dqkg_bwd`` followed by ``intra_bwd`` (same arguments: the WY stage's, plus the
    intra stage's ``dAqk`` and keyword extensions), in one launch. Returns
    ``(dq, dk, dv, db, dg)``: what ``intra_bwd`` returns (plus ``dA_log, ddt_bias`` with
    ``gate_bwd``) with the WY stage's dv third, as the chain uses them."""
    wy_ins, wy_outs, meta = _wy.prepare(q, k, v, v_new, g, beta, A, h, do, dh, dv, scale, cu_seqlens,
                                        chunk_size, chunk_indices)
    dq, dk, dv2, dg, db, dA = wy_outs
    q, k, g, beta = (wy_ins[i] for i in (0, 1, 4, 5))  # contiguous now
    K = k.shape[3]
    intra_ptrs, imeta = _intra.prepare(q, k, g, beta, dAqk, dA, dq, dk, db, dg, cu_seqlens, meta["chunk_indices"],
                                       chunk_size, whole_k_block(K, config), config, l2norm_rstd, out_dtype,
                                       dg_reverse_cumsum, gate_bwd, in_place=True, fast_range=fast_range,
                                       gate_monotone=gate_monotone)
    if meta["NT"] > 0:
        launch(_wy_intra_bwd_kernel, meta["grid"], config, *wy_ins, *wy_outs, *intra_ptrs, meta["cu_seqlens"],
               meta["chunk_indices"], meta["scale"], meta["T"], **meta["constexprs"],
               **{n: imeta["constexprs"][n] for n in ("L2NORM_BWD", "DG_CUMSUM", "GATE_BWD", "HAS_DT_BIAS", "FAST_RANGE",
                                                        "GATE_MONOTONE")},
               DOT_PRECISION=dot_precision)
        record_launch("kda.wy_intra_bwd")
    dq_o, dk_o, db_o, dg_o, *gate = imeta["finish"]()
    return (dq_o, dk_o, dv2, db_o, dg_o, *gate)
