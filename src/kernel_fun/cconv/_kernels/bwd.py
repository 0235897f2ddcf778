"""cconv backward: dx, dw, db in one pass over x and dy, plus a tiny deterministic dw/db reduce.

With pre[t] = bias + sum_i weight[:, i] x[t-(W-1)+i] and dpre = dy * silu'(pre) (or dy):
    dx[t]    = sum_i weight[:, i] * dpre[t + (W-1) - i]   (same document only)
    dw[:, i] = sum_t dpre[t] * x[t - (W-1) + i]
    db       = sum_t dpre[t]

Same work layout as `fwd`: a program owns BD channels x a chunk of TC rows of one batch row
and walks "lead" rows u = t_begin .. t_end + W - 2 in order. At lead row u it loads x[u] and
dy[u] once, rebuilds pre[u] from the x window in registers (no forward re-run), forms
dpre[u] once (one sigmoid per element: recomputing it for W shifted rows would cost 8 MUFU
ops per element, ~0.5 ms at [16, 8192, 2048] on H200, more than the whole memory floor),
keeps the last W dpre rows in registers and emits dx[u - (W-1)]. Rows past t_end only feed
dx (their dpre belongs to the next chunk's dw). dw/db accumulate per thread in fp32 over the
whole chunk and land in an fp32 partial buffer [n_chunks_total, W (+1 for db), D], which
`dw_reduce_kernel` sums in a fixed order: deterministic, no atomics.

Floor (H200, bf16 [16, 8192, 2048]): x + dy in, dx out = 1.61 GB = 0.375 ms at 4.24 TB/s.
Issue: the loop is ~34 SASS instructions per element (sm_90a, 4 channels per thread: ~12 FMA
for pre/dx/dw, the 4-instruction fast sigmoid, 3 converts, addresses), ~285 M
warp-instructions, ~0.27 ms at 4 per clock per SM on 132 SMs; MUFU 2 per element, ~0.13 ms.
So the backward is memory-bound with little to spare, and every instruction counts (Nsight
Compute, 2026-11-30: 0.71-0.81 warps issued per scheduler-cycle): tl.sigmoid's 13
instructions and a 64-bit row product per row had made the loop 47 per element, 0.516 ms.
Measured (H200, 2026-11-30, e5fe2db): 0.404 ms at its sizing (93% of copy), the bench's
autograd path 0.43 before that sizing.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernel_fun._common.fastmath import FAST_MATH, sigmoid
from kernel_fun._common.tuning import (  # noqa: F401
    alloc, autotune_cache, autotune_configs, cdiv, config_name, launch)
from kernel_fun._common.witness import record_launch

from .fwd import (aligned16, block_coords, conv_row, load_rows, seq_advance, t_major, time_chunks,
                  varlen_args, window_setup)


# Grid sizing (fwd.time_chunks), set from scripts/cconv_sweep.py (since replaced by `kernel-fun
# bench --stages cconv`; H200, bf16, W=4, silu, 2026-11-30;
# bench/records/raw/2026-11-30-h200-cconv-sweep-e5fe2db.json). Dense input: one
# wave of long chunks (8 one-warp programs per SM, at least 32 rows: B=16 T=8192 D=2048 in
# 2048-row chunks), 0.404 ms with the first config below against 0.428 at 512-row chunks and
# 0.424 at 1024: fewer dw partials and halo rows, and with the loads staged by cp.async a warp
# keeps its own bytes in flight. Packed documents: 512-row chunks (their best config, R8 with
# register prefetch: 0.437 ms there, 0.448 in one wave). The dw partials are
# B x n_chunks x (W+1) x D x 4 B, written and read once (0.5 MB at that dense shape).
_MAX_ROWS_BWD = 10 ** 9
_WARPS_PER_SM_BWD = 8
_MIN_ROWS_BWD = 32
_VARLEN_MAX_ROWS_BWD = 512  # cu_seqlens: chunks of at most min(this, _MAX_ROWS_BWD) rows,
_VARLEN_WARPS_PER_SM_BWD = 16  # and at least this many warp-units per SM

CONFIGS = [
    # BD channels per program (4 per thread; 8 per thread with register prefetch needs 255
    # registers and spills at R=8), R rows per trip, PF: prefetch the next trip's rows into registers,
    # NS > 1: Triton's loop pipeliner instead (cp.async into shared memory, NS stages; used for
    # D-major aligned inputs only, else the plain loop). The sweep's winners (H200, 2026-11-30,
    # e5fe2db; ms at B=16 T=8192 D=2048 / D=4096 / column slice / varlen / B=1 T=2048, each at
    # its sizing above), registers (ptxas sm_90a, bf16, W=4, silu, aligned D-major) in brackets.
    # 96 registers: ptxas gives the first 104 (19 one-warp programs per SM, not 21); held to
    # 96 its 2 spill instructions are outside the loop, and it runs 8% faster.
    triton.Config({"BD": 128, "R": 4, "PF": False, "NS": 4}, num_warps=1, maxnreg=96),  # 0.404 / 0.817 / 0.210 / - / 0.070 [96, 6 KB]
    triton.Config({"BD": 128, "R": 8, "PF": True, "NS": 1}, num_warps=1),   # 0.485 / 0.949 / 0.251 / 0.437 [206]
    triton.Config({"BD": 256, "R": 4, "PF": False, "NS": 4}, num_warps=1),  # - / - / 0.221 [12 KB]
]
# Timed, not kept (2026-11-30, e5fe2db): the first config without the register cap (0.439 /
# 0.831 at their best sizing), with 6 stages (0.468), with cache hints (x and dy rows loaded
# evict_first; with NS > 1 Triton's pipeliner turns the loads into cp.async, which carries no
# hint, so only the .cs dx stores change: 0.439; R8: 0.496; the hints are removed), BD256/R8
# on 2 warps. `kernel-fun bench --stages cconv` still forces the uncapped one.
CANDIDATES = [
    triton.Config({"BD": 128, "R": 4, "PF": False, "NS": 4}, num_warps=1),
]

@triton.jit
def bwd_row(x0, g, u, t_begin, t_end, T, x1, x2, x3, d1, d2, d3, st1, st2, st3, a0, a1, a2, a3, ab,
            c0, c1, c2, c3, b, prow, cmask, cu_seqlens, s, start, end,
            W: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr, IS_VARLEN: tl.constexpr,
            ACC_DW: tl.constexpr, FAST: tl.constexpr):
    """Lead row u: dpre[u] from the x window, dw/db partial sums (ACC_DW: u is one of the
    chunk's own rows, or past T where dpre is 0), dx[u - (W-1)] (at `prow`, the [BD] pointers
    of that dx row); returns the new state."""
    if IS_VARLEN:
        s, start, end = seq_advance(cu_seqlens, s, start, end, tl.minimum(u, T - 1))
        x1 = tl.where(u - 1 >= start, x1, 0.0)
        x2 = tl.where(u - 2 >= start, x2, 0.0)
        x3 = tl.where(u - 3 >= start, x3, 0.0)
    if SILU:
        pre = conv_row(x0, x1, x2, x3, c0, c1, c2, c3, b, W, HAS_BIAS)
        sg = sigmoid(pre, FAST)
        d0 = g * sg * (1.0 + pre * (1.0 - sg))
    else:
        d0 = g
    if ACC_DW:
        ab += d0
        a0 += d0 * x0
        if W >= 2:
            a1 += d0 * x1
        if W >= 3:
            a2 += d0 * x2
        if W >= 4:
            a3 += d0 * x3
    # dx[u-(W-1)] = sum_j weight[:, j] dpre[u-j] = sum_j c_{W-1-j} d_j, where with packed
    # documents d_j counts only if row u-j shares a document with row u-(W-1).
    # (Masked copies only: the same d_j may count for the next rows' dx.)
    if W == 1:
        gx = c0 * d0
    elif W == 2:
        e0 = d0
        if IS_VARLEN:
            e0 = tl.where(start == st1, d0, 0.0)
        gx = c1 * e0 + c0 * d1
    elif W == 3:
        e0 = d0
        e1 = d1
        if IS_VARLEN:
            e0 = tl.where(start == st2, d0, 0.0)
            e1 = tl.where(st1 == st2, d1, 0.0)
        gx = c2 * e0 + c1 * e1 + c0 * d2
    else:
        e0 = d0
        e1 = d1
        e2 = d2
        if IS_VARLEN:
            e0 = tl.where(start == st3, d0, 0.0)
            e1 = tl.where(st1 == st3, d1, 0.0)
            e2 = tl.where(st2 == st3, d2, 0.0)
        gx = c3 * e0 + c2 * e1 + c1 * e2 + c0 * d3
    t = u - (W - 1)
    m = cmask & (False | (t >= t_begin)) & (False | (t < t_end))  # the form: see fwd
    tl.store(prow, gx.to(prow.dtype.element_ty), mask=m)
    return x0, x1, x2, d0, d1, d2, start, st1, st2, a0, a1, a2, a3, ab, s, start, end


@triton.jit
def bwd_trip(xs, gs, u0, t_begin, t_end, T, x1, x2, x3, d1, d2, d3, st1, st2, st3, a0, a1, a2, a3, ab,
             c0, c1, c2, c3, b, pdx, D, cmask, cu_seqlens, s, start, end,
             W: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr, IS_VARLEN: tl.constexpr,
             R: tl.constexpr, FAST: tl.constexpr):
    """Lead rows u0 .. u0+R-1 of the chunk (already loaded: `xs`, `gs`) through `bwd_row`."""
    # dx rows addressed from one base per trip (a 64-bit row product per trip, not per row)
    dbase = pdx + tl.cast(u0 - (W - 1), tl.int64) * D
    D64 = tl.cast(D, tl.int64)
    for r in tl.static_range(R):
        x1, x2, x3, d1, d2, d3, st1, st2, st3, a0, a1, a2, a3, ab, s, start, end = bwd_row(
            xs[r].to(tl.float32), gs[r].to(tl.float32), u0 + r, t_begin, t_end, T,
            x1, x2, x3, d1, d2, d3, st1, st2, st3, a0, a1, a2, a3, ab,
            c0, c1, c2, c3, b, dbase + r * D64, cmask, cu_seqlens, s, start, end,
            W, HAS_BIAS, SILU, IS_VARLEN, True, FAST)
    return x1, x2, x3, d1, d2, d3, st1, st2, st3, a0, a1, a2, a3, ab, s, start, end


def tc_bucket(rows: int) -> int:
    """The backward's autotune key for its rows per chunk: their bit length, capped at 4,096 rows
    (at most 9 values). The rows follow T (one wave of chunks: T / 4 at the GDN layer's D = 8,192),
    so keyed on the rows themselves every new T re-tuned the kernel (Triton's autotuner timing each
    of its configs), where fla's conv, keyed on D and W, does not: training whose T changes every
    step stalled on each new one."""
    return min(rows, 4096).bit_length()


@triton.autotune(
    configs=autotune_configs(CONFIGS), **autotune_cache(),
    key=["D", "TC_BUCKET", "W", "HAS_BIAS", "SILU", "IS_VARLEN", "X_TMAJOR", "DY_TMAJOR", "VEC16"],
)
@triton.jit
def conv_bwd_kernel(
    x, weight, bias, dy, dx, part, cu_seqlens,
    T, D, TC, N_SEQ, N_STEPS,
    s_xb, s_xt, s_xd, s_gb, s_gt, s_gd, s_wd, s_wi,
    W: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr, IS_VARLEN: tl.constexpr,
    X_TMAJOR: tl.constexpr, DY_TMAJOR: tl.constexpr,  # contiguous along T (see fwd.load_rows)
    VEC16: tl.constexpr,  # autotune key only: fwd.aligned16 of x and dy
    TC_BUCKET,  # autotune key only: tc_bucket(TC)
    BD: tl.constexpr, R: tl.constexpr, PF: tl.constexpr, NS: tl.constexpr,
    FAST: tl.constexpr = False,  # fastmath.sigmoid's short form (fastmath.FAST_MATH: not interpreted)
):
    pid_b, cols64, cmask, t_begin, t_end = block_coords(D, T, TC, BD)
    px = x + pid_b * s_xb + cols64 * s_xd
    pg = dy + pid_b * s_gb + cols64 * s_gd
    pdx = dx + pid_b * T * D + cols64  # dx is contiguous [B, T, D]
    c0, c1, c2, c3, b, x1, x2, x3, s, start, end = window_setup(
        px, weight, bias, cu_seqlens, cols64, cmask, t_begin, T, N_SEQ, N_STEPS, s_xt, s_wd, s_wi,
        W, HAS_BIAS, IS_VARLEN)

    # d_j = dpre[u - j]; a_k = sum of dpre[u] x[u-k] over own rows (-> dw[:, W-1-k]).
    d1 = tl.zeros_like(c0)
    d2 = tl.zeros_like(c0)
    d3 = tl.zeros_like(c0)
    a0 = tl.zeros_like(c0)
    a1 = tl.zeros_like(c0)
    a2 = tl.zeros_like(c0)
    a3 = tl.zeros_like(c0)
    ab = tl.zeros_like(c0)

    # st_j = start of the document of row u - j (varlen): dpre[u-j] reaches dx[u-(W-1)] only
    # when both rows are in one document, i.e. st_j == st_{W-1}.
    st1 = t_begin * 0
    st2 = st1
    st3 = st1

    # Main loop: the chunk's own rows, in trips of R (TC is a multiple of R, so only the last
    # chunk of a sequence has a partial trip, whose rows past T load as 0 and give dpre = 0:
    # no dw masking per element). Then the W-1 rows after t_end, for dx only. Loads of a trip
    # are all issued before its math; PF also issues the next trip's (see fwd).
    lim = tl.minimum(t_end + (W - 1), T)
    u_end = t_begin + tl.cdiv(t_end - t_begin, R) * R
    if PF:
        nx = load_rows(px, t_begin, s_xt, lim, cmask, R, BD, X_TMAJOR)
        ng = load_rows(pg, t_begin, s_gt, lim, cmask, R, BD, DY_TMAJOR)
        for u0 in range(t_begin, t_end, R):
            xs = nx
            gs = ng
            nx = load_rows(px, u0 + R, s_xt, lim, cmask, R, BD, X_TMAJOR)
            ng = load_rows(pg, u0 + R, s_gt, lim, cmask, R, BD, DY_TMAJOR)
            x1, x2, x3, d1, d2, d3, st1, st2, st3, a0, a1, a2, a3, ab, s, start, end = bwd_trip(
                xs, gs, u0, t_begin, t_end, T, x1, x2, x3, d1, d2, d3, st1, st2, st3, a0, a1, a2, a3, ab,
                c0, c1, c2, c3, b, pdx, D, cmask, cu_seqlens, s, start, end, W, HAS_BIAS, SILU, IS_VARLEN, R,
                FAST)
        tx = nx  # the prefetched trip after the last starts with the tail rows
        tg = ng
    else:
        for u0 in tl.range(t_begin, t_end, R, num_stages=NS):
            xs = load_rows(px, u0, s_xt, lim, cmask, R, BD, X_TMAJOR)
            gs = load_rows(pg, u0, s_gt, lim, cmask, R, BD, DY_TMAJOR)
            x1, x2, x3, d1, d2, d3, st1, st2, st3, a0, a1, a2, a3, ab, s, start, end = bwd_trip(
                xs, gs, u0, t_begin, t_end, T, x1, x2, x3, d1, d2, d3, st1, st2, st3, a0, a1, a2, a3, ab,
                c0, c1, c2, c3, b, pdx, D, cmask, cu_seqlens, s, start, end, W, HAS_BIAS, SILU, IS_VARLEN, R,
                FAST)
        tx = load_rows(px, u_end, s_xt, lim, cmask, 4, BD, X_TMAJOR)
        tg = load_rows(pg, u_end, s_gt, lim, cmask, 4, BD, DY_TMAJOR)
    # Tail: rows u_end .. u_end + W-2 (the next chunk's, or past T) complete dx[t_end-(W-1)..].
    for r in tl.static_range(W - 1):
        x1, x2, x3, d1, d2, d3, st1, st2, st3, a0, a1, a2, a3, ab, s, start, end = bwd_row(
            tx[r].to(tl.float32), tg[r].to(tl.float32), u_end + r, t_begin, t_end, T,
            x1, x2, x3, d1, d2, d3, st1, st2, st3, a0, a1, a2, a3, ab,
            c0, c1, c2, c3, b, pdx + tl.cast(u_end + r - (W - 1), tl.int64) * D, cmask, cu_seqlens, s, start, end,
            W, HAS_BIAS, SILU, IS_VARLEN, False, FAST)

    # Partials: [B x n_chunks, W + HAS_BIAS, D] fp32, row W-1-k holds sum dpre[u] x[u-k].
    NROW: tl.constexpr = W + HAS_BIAS
    pid_c = tl.program_id(0) // tl.cdiv(D, BD)  # this chunk (as in block_coords)
    pp = part + (pid_b * tl.cdiv(T, TC) + pid_c) * (NROW * D) + cols64
    tl.store(pp + (W - 1) * D, a0, mask=cmask)
    if W >= 2:
        tl.store(pp + (W - 2) * D, a1, mask=cmask)
    if W >= 3:
        tl.store(pp + (W - 3) * D, a2, mask=cmask)
    if W >= 4:
        tl.store(pp + (W - 4) * D, a3, mask=cmask)
    if HAS_BIAS:
        tl.store(pp + W * D, ab, mask=cmask)


@triton.jit
def dw_reduce_kernel(part, dw, db, n_part, D, W: tl.constexpr, HAS_BIAS: tl.constexpr,
                     BP: tl.constexpr, BM: tl.constexpr):
    """dw[d, i] (and db[d]) = sum over the n_part partial rows, in a fixed order: each lane
    sums its rows p = lane, lane + BP, ... in sequence, then a fixed-shape tree over BP."""
    M = (W + HAS_BIAS) * D
    offs = tl.program_id(0) * BM + tl.arange(0, BM)
    m = offs < M
    rows = tl.arange(0, BP)
    acc = tl.zeros((BP, BM), dtype=tl.float32)
    for p0 in range(0, n_part, BP):
        p = p0 + rows
        ptr = part + p.to(tl.int64)[:, None] * M + offs[None, :]
        acc += tl.load(ptr, mask=(p < n_part)[:, None] & m[None, :], other=0.0)
    tot = tl.sum(acc, axis=0)
    i = offs // D
    d = offs - i * D
    tl.store(dw + d * W + i, tot.to(dw.dtype.element_ty), mask=m & (i < W))
    if HAS_BIAS:
        tl.store(db + d, tot.to(db.dtype.element_ty), mask=m & (i == W))


def conv_bwd(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dy: torch.Tensor,
             silu: bool, cu_seqlens: torch.Tensor | None = None, *, config: triton.Config | None = None):
    """(dx, dw, db): dx `[B, T, D]` contiguous in x.dtype, dw `[D, W]` in weight.dtype, db `[D]`
    in bias.dtype or None without a bias. x and dy any strides; fp32 accumulation throughout;
    dw/db bitwise reproducible run to run (fixed-order reduction, no atomics). `config`: one of
    `CONFIGS` / `CANDIDATES` for the main kernel instead of the autotuner's pick."""
    B, T, D = x.shape
    W = weight.shape[1]
    assert weight.shape[0] == D and 1 <= W <= 4, (tuple(x.shape), tuple(weight.shape))
    assert tuple(dy.shape) == (B, T, D), (tuple(dy.shape), tuple(x.shape))
    assert cu_seqlens is None or B == 1, "cu_seqlens needs B == 1"
    has_bias = bias is not None
    dx = alloc((B, T, D), dtype=x.dtype, device=x.device)
    dw = alloc((D, W), dtype=weight.dtype, device=x.device)
    db = alloc((D,), dtype=bias.dtype, device=x.device) if has_bias else None
    if x.numel() == 0:
        dw.zero_()
        if db is not None:
            db.zero_()
        return dx, dw, db
    sizing = ((_MAX_ROWS_BWD, _WARPS_PER_SM_BWD, _MIN_ROWS_BWD) if cu_seqlens is None else
              (min(_MAX_ROWS_BWD, _VARLEN_MAX_ROWS_BWD), max(_WARPS_PER_SM_BWD, _VARLEN_WARPS_PER_SM_BWD),
               _MIN_ROWS_BWD))
    n_chunks, rows = time_chunks(B, T, D, x.device, *sizing)
    n_part = B * n_chunks
    part = alloc((n_part, W + int(has_bias), D), dtype=torch.float32, device=x.device)
    n_seq, n_steps = varlen_args(cu_seqlens)
    launch(conv_bwd_kernel, lambda meta: (cdiv(D, meta["BD"]) * n_chunks, B), config,
        x, weight, bias if has_bias else weight, dy, dx, part,
        cu_seqlens if cu_seqlens is not None else weight,
        T, D, rows, n_seq, n_steps,
        x.stride(0), x.stride(1), x.stride(2), dy.stride(0), dy.stride(1), dy.stride(2),
        weight.stride(0), weight.stride(1),
        W=W, HAS_BIAS=has_bias, SILU=bool(silu), IS_VARLEN=cu_seqlens is not None,
        X_TMAJOR=t_major(x), DY_TMAJOR=t_major(dy), VEC16=aligned16(x) and aligned16(dy),
        TC_BUCKET=tc_bucket(rows), FAST=FAST_MATH,
    )
    record_launch("cconv.bwd")
    # [64 partial rows x 128 columns] per program: (W+1) x D / 128 programs, each summing
    # n_part / 64 tiles (3 trips at B=16, T=8192, D=2048). Fixed config: the summation order,
    # hence the bits of dw, must not depend on an autotune pick.
    BM = 128
    dw_reduce_kernel[(cdiv((W + int(has_bias)) * D, BM),)](
        part, dw, db if has_bias else dw, n_part, D, W=W, HAS_BIAS=has_bias, BP=64, BM=BM,
        num_warps=4,
    )
    record_launch("cconv.dw_reduce")
    return dx, dw, db
