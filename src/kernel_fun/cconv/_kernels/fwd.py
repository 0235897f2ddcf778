"""cconv forward: y[b, t, d] = act(bias[d] + sum_{i<W} weight[d, i] * x[b, t - (W-1) + i, d]).

Work layout (shared with `bwd`): a program owns a block of BD channels and a chunk of TC
consecutive time steps of one batch row, and walks that chunk one time step ("row") at a
time, R rows per loop trip. Each thread owns a few channels and keeps the last W-1 rows of x
for them in registers, so x is read once (plus W-1 halo rows per chunk: Nsight Compute counted
DRAM reads 2.4% over x at 128-row chunks, the halo missing L2) and every row is one coalesced [BD] load along the contiguous D axis: no shifted re-loads, no shared
memory. Floor reasoning (H200, bf16 [16, 8192, 2048]): x in + y out = 1.07 GB = 0.25 ms at
the 4.24 TB/s copy ceiling. The loop issues ~17 SASS instructions per element (sm_90a, R=8:
the conv, the 4-instruction fast sigmoid of `_common.fastmath`, converts, one 64-bit row
base per trip; tl.sigmoid alone is 13) and 2 MUFU (~0.13 ms), below it, so the kernel has to
keep enough bytes in flight: R rows per trip loaded before any math, the next trip's rows
prefetched into registers, and chunks short enough for many programs (`time_chunks`).
Measured (H200, 2026-11-30): 91.6% of copy (0.273 ms) with R=16 in 64-row chunks, as fast
as the same kernel at W=1 without silu (its bytes and walk alone: 0.274 ms) and within 2% of
a flat Triton copy of the same bytes (0.269 ms); 87.5% with tl.sigmoid; a one-wave grid of
long chunks 79%; Triton's cp.async pipeliner in place of the register prefetch at best 83%;
a tiled design (row blocks with a halo) 66%.

Two kernels walk this layout. `conv_fwd_kernel` loads rows by pointer into registers (any
strides, T-major x included). `conv_fwd_tma_kernel` has the tensor-memory accelerator fetch
[R, BD] boxes into shared memory, in 32-row chunks: 96.6% of copy (0.259 ms) at the shape
above, past the flat Triton copy. It is the default (`use_tma`) for x of 32 MB and up that a
descriptor can read (sm_90+, D contiguous, 16-byte aligned base and strides).

Packed documents (`cu_seqlens`, B == 1): a program finds the document of its first row by a
binary search over cu_seqlens, then advances document by document as its rows cross
boundaries (scalar, per row, uniform across the program); the x window is zeroed for rows
before the current document's start. No host sync.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from kernel_fun._common import device as D
from kernel_fun._common import hardware, switches
from kernel_fun._common.fastmath import FAST_MATH, sigmoid
from kernel_fun._common.tuning import (  # noqa: F401
    alloc, autotune_cache, autotune_configs, cdiv, config_name, install_interpreter_shims, launch)
from kernel_fun._common.witness import record_launch


install_interpreter_shims()


# Grid sizing (`time_chunks`): chunks of at most `_MAX_ROWS_FWD` rows; more (shorter) ones,
# down to `_MIN_ROWS_FWD` rows, while the grid has fewer than `_WARPS_PER_SM_FWD` warp-units per
# SM. Set from scripts/cconv_sweep.py (since replaced by `kernel-fun bench --stages cconv`;
# H200, bf16, W=4, silu, 2026-11-30; records bench/records/raw/2026-11-30-h200-cconv-sweep-*.json):
# with the fast sigmoid, 64-row chunks beat 128 (B=16 T=8192 D=2048: 0.2727-0.2741 ms against
# 0.2736-0.2751 with R=16, 0.2745 against 0.2796 with R=8; D=4096: 0.5336 against 0.5367);
# 256 rows and one wave of long chunks are slower still. Not kept: the W-1 halo rows read at
# the chunk's end, when the previous chunk's program reads them (they missed L2: Nsight Compute counted DRAM reads 2.4%
# over x at 128-row chunks), +2% at 128 rows and nothing at 64; x rows loaded .cg, nothing.
_MAX_ROWS_FWD = 64
_WARPS_PER_SM_FWD = 32
_MIN_ROWS_FWD = 16
_ROW_ALIGN = 16  # chunk starts: multiples of 16 rows, so Triton sees aligned T-major vectors


def time_chunks(B: int, T: int, D: int, device: torch.device, max_rows: int, warps_per_sm: int,
                min_rows: int):
    """(n_chunks, rows_per_chunk), rows a multiple of `_ROW_ALIGN`: chunks of at most
    `max_rows` rows, and more (shorter) chunks while the grid has fewer than `warps_per_sm`
    warp-units (128 channels of one chunk) per SM, down to `min_rows` rows per chunk.
    A huge `max_rows` gives one wave of long chunks (the 2026-11-30 sizing)."""
    units = max(1, B * cdiv(D, 128))
    fill = min(hardware.sm_count(device) * warps_per_sm // units, cdiv(T, max(1, min_rows)))
    n = max(1, cdiv(T, max(1, max_rows)), fill)
    rows = cdiv(cdiv(T, n), _ROW_ALIGN) * _ROW_ALIGN
    return cdiv(T, rows), rows


def t_major(t: torch.Tensor) -> bool:
    """Whether a [B, T, D] tensor is contiguous along T rather than D (a transposed buffer)."""
    return t.stride(1) == 1 and t.stride(2) != 1 and t.shape[1] > 1


def aligned16(t: torch.Tensor) -> bool:
    """Whether Triton will see t's base and strides as multiples of 16 (its specialisation),
    i.e. whether row loads can be 16 B vectors. Autotune key: without it each element needs its
    own 64-bit address, registers roughly double, and other configs win."""
    return t.data_ptr() % 16 == 0 and all(s % 16 == 0 for s in t.stride() if s != 1)


def varlen_args(cu_seqlens: torch.Tensor | None):
    """(n_seq, n_search_steps) for the in-kernel binary search over cu_seqlens (shape only)."""
    if cu_seqlens is None:
        return 1, 1
    n_seq = cu_seqlens.shape[0] - 1
    return n_seq, max(1, n_seq.bit_length())


# Row masks are written `cmask & (False | ok)` for a scalar condition `ok` (this row exists).
# Triton 3.9's interpreter types a comparison's result like its left operand (an int32 scalar
# here), so `cmask & ok` splats it into an int32 array, which its loads and stores reject as a
# mask ("mask has unsupported dtype"); `False | ok` takes the type of the boolean literal. The
# compiler folds it away: sm_90a PTX and SASS identical to `cmask & ok` (Triton 3.6, every
# config of tools/sass_stats.py cconv). Inline, not a helper: ptxas schedules an inlined
# function's debug scope differently (one FADD/FFMA swap in three backward configs).


@triton.jit
def seq_locate(cu_seqlens, N_SEQ, N_STEPS, t):
    """(s, start, end) of the document holding token t: cu[s] <= t < cu[s+1] (empty documents
    skipped). Invariant cu[lo] <= t < cu[hi]; N_STEPS = bit_length(N_SEQ) halvings suffice."""
    lo = t * 0
    hi = lo + N_SEQ
    for _ in range(N_STEPS):
        mid = (lo + hi) // 2
        go = tl.load(cu_seqlens + mid).to(tl.int32) <= t
        lo = tl.where(go, mid, lo)
        hi = tl.where(go, hi, mid)
    start = tl.load(cu_seqlens + lo).to(tl.int32)
    end = tl.load(cu_seqlens + lo + 1).to(tl.int32)
    return lo, start, end


@triton.jit
def seq_advance(cu_seqlens, s, start, end, u):
    """Move (s, start, end) forward to the document holding token u (u < total tokens)."""
    while u >= end:
        s += 1
        start = end
        end = tl.load(cu_seqlens + s + 1).to(tl.int32)
    return s, start, end


@triton.jit
def load_taps(weight, cols64, cmask, s_wd, s_wi, W: tl.constexpr):
    """c_k = weight[:, W-1-k] in fp32: the coefficient of x[t-k] (k = 0..3, zero for k >= W)."""
    pw = weight + cols64 * s_wd
    c0 = tl.load(pw + (W - 1) * s_wi, mask=cmask, other=0.0).to(tl.float32)
    c1 = tl.zeros_like(c0)
    c2 = tl.zeros_like(c0)
    c3 = tl.zeros_like(c0)
    if W >= 2:
        c1 = tl.load(pw + (W - 2) * s_wi, mask=cmask, other=0.0).to(tl.float32)
    if W >= 3:
        c2 = tl.load(pw + (W - 3) * s_wi, mask=cmask, other=0.0).to(tl.float32)
    if W >= 4:
        c3 = tl.load(pw + (W - 4) * s_wi, mask=cmask, other=0.0).to(tl.float32)
    return c0, c1, c2, c3


@triton.jit
def load_halo(px, t_begin, s_xt, cmask, W: tl.constexpr):
    """x[t_begin-1], x[t_begin-2], x[t_begin-3] in fp32 (zero before t=0 or for k >= W)."""
    x1 = tl.zeros(cmask.shape, tl.float32)
    x2 = tl.zeros(cmask.shape, tl.float32)
    x3 = tl.zeros(cmask.shape, tl.float32)
    if W >= 2:
        x1 = tl.load(px + (t_begin - 1).to(tl.int64) * s_xt, mask=cmask & (False | (t_begin >= 1)), other=0.0).to(tl.float32)
    if W >= 3:
        x2 = tl.load(px + (t_begin - 2).to(tl.int64) * s_xt, mask=cmask & (False | (t_begin >= 2)), other=0.0).to(tl.float32)
    if W >= 4:
        x3 = tl.load(px + (t_begin - 3).to(tl.int64) * s_xt, mask=cmask & (False | (t_begin >= 3)), other=0.0).to(tl.float32)
    return x1, x2, x3


@triton.jit
def block_coords(D, T, TC, BD: tl.constexpr):
    """This program's (batch row, int64 channel indices, channel mask, first row, row end).
    Grid (channel blocks x time chunks, B), channel block fastest: programs that run together
    read neighbouring columns of the same rows (and chunk counts past 65535 fit)."""
    n_d = tl.cdiv(D, BD)
    pid = tl.program_id(0)
    pid_c = pid // n_d
    pid_d = pid - pid_c * n_d
    cols = pid_d * BD + tl.arange(0, BD)
    t_begin = pid_c * TC
    return tl.program_id(1).to(tl.int64), cols.to(tl.int64), cols < D, t_begin, tl.minimum(t_begin + TC, T)


@triton.jit
def window_setup(px, weight, bias, cu_seqlens, cols64, cmask, t_begin, T, N_SEQ, N_STEPS, s_xt, s_wd, s_wi,
                 W: tl.constexpr, HAS_BIAS: tl.constexpr, IS_VARLEN: tl.constexpr):
    """Taps, bias, the x window before the chunk and the document of its first row:
    (c0, c1, c2, c3, b, x1, x2, x3, s, start, end), shared by the forward and the backward."""
    c0, c1, c2, c3 = load_taps(weight, cols64, cmask, s_wd, s_wi, W)
    b = tl.zeros_like(c0)
    if HAS_BIAS:
        b = tl.load(bias + cols64, mask=cmask, other=0.0).to(tl.float32)
    x1, x2, x3 = load_halo(px, t_begin, s_xt, cmask, W)
    s = t_begin * 0
    start = s
    end = s + T
    if IS_VARLEN:
        s, start, end = seq_locate(cu_seqlens, N_SEQ, N_STEPS, t_begin)
    return c0, c1, c2, c3, b, x1, x2, x3, s, start, end


@triton.jit
def split_rows(tile, R: tl.constexpr, BD: tl.constexpr):
    """[BD, R] -> a tuple of its R columns ([BD] rows of x), by halving the last axis."""
    out = ()
    if R == 2:
        e, o = tl.split(tile)
        out = (e, o)
    else:
        e, o = tl.split(tl.reshape(tile, (BD, R // 2, 2)))  # rows 0, 2, 4.. and 1, 3, 5..
        re = split_rows(e, R // 2, BD)
        ro = split_rows(o, R // 2, BD)
        for i in tl.static_range(R // 2):
            out = out + (re[i], ro[i])
    return out


@triton.jit
def load_rows(p, u0, s_t, lim, cmask, R: tl.constexpr, BD: tl.constexpr, T_MAJOR: tl.constexpr):
    """R rows u0 .. u0+R-1 (raw dtype; rows >= lim read as 0) from the [BD] channel pointers
    p, all issued before any is used. D-contiguous tensors: one coalesced [BD] load per row.
    T-contiguous ones (a [B, D, T] buffer seen as [B, T, D]): one [BD, R] tile with R
    consecutive time steps per thread (16 B vectors for R=8 bf16), split into rows in
    registers; a row load there would be BD scattered 2-byte reads."""
    rows = ()
    if T_MAJOR:
        rr = u0 + tl.arange(0, R)
        ptr = p[:, None] + rr.to(tl.int64)[None, :] * s_t
        if u0 + R <= lim:  # a mask constant along T keeps the loads vectorised
            tile = tl.load(ptr, mask=cmask[:, None], other=0.0)
        else:
            tile = tl.load(ptr, mask=cmask[:, None] & (rr < lim)[None, :], other=0.0)
        rows = split_rows(tile, R, BD)
    else:
        base = p + tl.cast(u0, tl.int64) * s_t
        s_t64 = tl.cast(s_t, tl.int64)  # tl.cast: u0, s_t may be Python ints (interpreter, or a stride of 1)
        for r in tl.static_range(R):
            u = u0 + r
            m = cmask & (False | (u < lim))
            rows = rows + (tl.load(base + r * s_t64, mask=m, other=0.0),)
    return rows


@triton.jit
def conv_row(x0, x1, x2, x3, c0, c1, c2, c3, b, W: tl.constexpr, HAS_BIAS: tl.constexpr):
    """The pre-activation of one row: bias + sum_k c_k x[t-k]."""
    acc = c0 * x0
    if W >= 2:
        acc += c1 * x1
    if W >= 3:
        acc += c2 * x2
    if W >= 4:
        acc += c3 * x3
    if HAS_BIAS:
        acc += b
    return acc


@triton.jit
def fwd_trip(xs, u0, t_end, T, x1, x2, x3, c0, c1, c2, c3, b, py, D, cmask, cu_seqlens, s, start, end,
             W: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr, IS_VARLEN: tl.constexpr,
             R: tl.constexpr, FAST: tl.constexpr):
    """Rows u0 .. u0+R-1 (already loaded, `xs`) through the window: y stores, the new window."""
    ybase = py + tl.cast(u0, tl.int64) * D
    D64 = tl.cast(D, tl.int64)
    for r in tl.static_range(R):
        u = u0 + r
        x0 = xs[r].to(tl.float32)
        if IS_VARLEN:
            # x before the start of u's own document does not exist for u (zeroing the
            # window in place is safe: a later row's document starts no earlier).
            s, start, end = seq_advance(cu_seqlens, s, start, end, tl.minimum(u, T - 1))
            x1 = tl.where(u - 1 >= start, x1, 0.0)
            x2 = tl.where(u - 2 >= start, x2, 0.0)
            x3 = tl.where(u - 3 >= start, x3, 0.0)
        acc = conv_row(x0, x1, x2, x3, c0, c1, c2, c3, b, W, HAS_BIAS)
        if SILU:
            acc = acc * sigmoid(acc, FAST)
        m = cmask & (False | (u < t_end))
        tl.store(ybase + r * D64, acc.to(py.dtype.element_ty), mask=m)
        x3 = x2
        x2 = x1
        x1 = x0
    return x1, x2, x3, s, start, end


CONFIGS = [
    # BD channels per program, R rows per trip; BD / (32 x num_warps) channels per thread
    # (8 gives 16 B vectors). The sweep's winners (H200, 2026-11-30; ms at B=16 T=8192
    # D=2048 / D=4096 in 64-row chunks, fast sigmoid; the latency pick from the first sweep),
    # registers (ptxas sm_90a, bf16, W=4, silu) in brackets.
    triton.Config({"BD": 128, "R": 16}, num_warps=1),  # 0.2727 / 0.5336 [166]
    triton.Config({"BD": 128, "R": 8}, num_warps=1),   # 0.2745 / 0.5402 [96]
    triton.Config({"BD": 256, "R": 8}, num_warps=2),   # 0.2759 / 0.5406 [96]
    triton.Config({"BD": 512, "R": 4}, num_warps=4),   # 0.2807 / 0.5466 / B=1 T=2048 0.0122 [72]
]
# Timed on the H200 (2026-11-30), not kept: cache hints (x rows loaded evict_first, each read
# once, the halo rows a neighbouring chunk reads again at the default policy; y stored
# streaming, .cs), 1-3% slower at every config and sizing (removed), although cache hints
# have bought a few percent in other bandwidth-bound Triton kernels (pytorch/pytorch#91316,
# #108841, pytorch/helion#660); 8 channels per thread (16-byte row loads, BD 256 on one warp), 4-9%
# slower; R=16 held to 144 registers (14 one-warp programs per SM instead of 12; one spill
# pair in the loop) 3% slower, R=16 on two warps and chunks of 48 or 96 rows no faster
# (bench/records/raw/2026-11-30-h200-cconv-sweep-fwd-ba312f7.json); programs spanning whole
# rows (BD 1024 on 8 warps, 2048 on 16: 2-4 KB contiguous per row and program, as a copy
# streams) 4-11% slower, BD 512 x R16 on 4 warps 1% slower
# (bench/records/raw/2026-11-30-h200-cconv-sweep-fwd-dedc2fa.json). The sweep still forces
# the ones listed here.
CANDIDATES = [
    triton.Config({"BD": 256, "R": 4}, num_warps=1),
    triton.Config({"BD": 256, "R": 8}, num_warps=1),
]


@triton.autotune(
    configs=autotune_configs(CONFIGS), **autotune_cache(),
    # dtypes of the tensor arguments are part of Triton's autotune key already. TC (rows per
    # chunk) separates small grids (B=1, T=2048: 16-row chunks) from production ones.
    key=["D", "TC", "W", "HAS_BIAS", "SILU", "IS_VARLEN", "X_TMAJOR", "VEC16"],
)
@triton.jit
def conv_fwd_kernel(
    x, weight, bias, y, cu_seqlens,
    T, D, TC, N_SEQ, N_STEPS,
    s_xb, s_xt, s_xd, s_wd, s_wi,
    W: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr, IS_VARLEN: tl.constexpr,
    X_TMAJOR: tl.constexpr,  # x contiguous along T, not D (see load_rows)
    VEC16: tl.constexpr,  # autotune key only: aligned16(x)
    BD: tl.constexpr, R: tl.constexpr,
    FAST: tl.constexpr = False,  # fastmath.sigmoid's short form (fastmath.FAST_MATH: not interpreted)
):
    pid_b, cols64, cmask, t_begin, t_end = block_coords(D, T, TC, BD)
    px = x + pid_b * s_xb + cols64 * s_xd
    py = y + pid_b * T * D + cols64  # y is contiguous [B, T, D]
    c0, c1, c2, c3, b, x1, x2, x3, s, start, end = window_setup(
        px, weight, bias, cu_seqlens, cols64, cmask, t_begin, T, N_SEQ, N_STEPS, s_xt, s_wd, s_wi,
        W, HAS_BIAS, IS_VARLEN)

    # Each loop trip loads its R rows before any math: a store between two loads would keep
    # the next load from issuing (y may alias x as far as the compiler knows), and the rows of
    # the next trip are loaded before this trip's math (double buffering in registers), so a
    # warp keeps loads in flight while it computes.
    nxt = load_rows(px, t_begin, s_xt, t_end, cmask, R, BD, X_TMAJOR)
    for u0 in range(t_begin, t_end, R):
        xs = nxt
        nxt = load_rows(px, u0 + R, s_xt, t_end, cmask, R, BD, X_TMAJOR)
        x1, x2, x3, s, start, end = fwd_trip(xs, u0, t_end, T, x1, x2, x3, c0, c1, c2, c3, b, py, D,
                                             cmask, cu_seqlens, s, start, end,
                                             W, HAS_BIAS, SILU, IS_VARLEN, R, FAST)


# The forward with its rows fetched by the tensor-memory accelerator (TMA, sm_90+): a
# [1, R, BD] box per trip into shared memory, NS - 1 trips ahead (Triton's loop pipeliner),
# so the bytes in flight cost no registers (64 against the register-prefetch kernel's 166 at
# R=16), and short chunks (`_MAX_ROWS_TMA`) whose programs request their whole chunk at once.
# The tile is read from shared memory straight into the per-thread row layout. Timed with
# scripts/cconv_sweep.py (since replaced by `kernel-fun bench --stages cconv`; H200, bf16, W=4,
# silu, 2026-11-30; records bench/records/raw/2026-11-30-h200-cconv-sweep-tma*-da0b68e.json), ms at B=16 T=8192
# D=2048 / D=4096 / packed (B=1 T=131072 D=2048, 16 documents) / column slice ([8, 8192, 6144]
# [..., 2048:4096]) in 32-row chunks, against the pointer kernel's best 0.2733 / 0.5321 /
# 0.2771 / 0.1394 (0.2788 / 0.5500 at 32-row chunks): R=32 with NS=3, 0.2593 / 0.5108 / 0.2696
# / 0.1352, the fastest or within 0.3% of it in every case, so it is the one config (no
# autotuning: a launch without the autotuner and its box pre-hook costs less host time).
TMA_CONFIGS = [triton.Config({"BD": 128, "R": 32, "NS": 3}, num_warps=1)]
# Timed and not kept (same records; D=2048 / D=4096 / packed / slice): R=8 with 7 trips ahead,
# 0.2588 / 0.5114 / 0.2828 / 0.1352; R=16 with 3, 0.2600 / 0.5224 / 0.2757 / 0.1355; BD=256 on
# two warps, 0.2651 / 0.5238 / 0.2747 / 0.1349; R=8 with 5 trips ahead 0.2604 at D=2048, 3 trips
# 0.2688; R=32 with one buffer (NS=2) 0.2624; R=16 on two warps 0.2616; four warps 0.3019;
# 64-row chunks 0.2661 at best, 16-row ones 0.2652, 48-row ones 0.2628. `kernel-fun bench --stages
# cconv` forces these.
TMA_CANDIDATES = [
    triton.Config({"BD": 128, "R": 8, "NS": 8}, num_warps=1),
    triton.Config({"BD": 128, "R": 16, "NS": 4}, num_warps=1),
    triton.Config({"BD": 256, "R": 32, "NS": 3}, num_warps=2),
    triton.Config({"BD": 128, "R": 8, "NS": 6}, num_warps=1),
    triton.Config({"BD": 128, "R": 32, "NS": 2}, num_warps=1),
    triton.Config({"BD": 128, "R": 16, "NS": 4}, num_warps=2),
    triton.Config({"BD": 256, "R": 16, "NS": 3}, num_warps=2),
]
_MAX_ROWS_TMA = 32
# Below this many bytes of x the pointer kernel runs instead: it is faster on small grids
# (tools/cconv_host.py, H200, bf16 [B, T, 2048], device time of the forward: 8 MB 6.9 us
# against 10.8, 32 MB 21.0 against 20.4, 64 MB 39.4 against 36.0, 512 MB 274.6 against 257.0;
# record bench/records/raw/2026-11-30-h200-cconv-host-3363462.json). Host time per launch: the
# same as the pointer one's in that run (61-96 us per call on that machine's host; the TMA one
# builds a TensorDescriptor, 2.2 us, but skips the autotuner), 234 against 148 us per public
# call in another (-host-public-3363462.json): noisy.
_TMA_MIN_BYTES = 32 << 20


def tma_ok(x: torch.Tensor) -> bool:
    """Whether x can be read through a TMA descriptor: a CUDA tensor on sm_90+ (or under the
    interpreter), D contiguous, base and the other strides 16-byte aligned."""
    if x.stride(2) != 1 or x.data_ptr() % 16 or any((s * x.element_size()) % 16 for s in x.stride()[:2]):
        return False
    if x.device.type != "cuda":
        return True  # the interpreter
    return hardware.device_capability(D.index(x.device))[0] >= 9


def use_tma(x: torch.Tensor) -> bool:
    """Whether conv_fwd takes the TMA forward for x by default (KERNEL_FUN_CCONV_TMA=0: never)."""
    return x.numel() * x.element_size() >= _TMA_MIN_BYTES and tma_ok(x) and switches.cconv_tma()


@triton.jit
def conv_fwd_tma_kernel(
    x_desc, x, weight, bias, y, cu_seqlens,
    T, D, TC, N_SEQ, N_STEPS,
    s_xb, s_xt, s_wd, s_wi,
    W: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr, IS_VARLEN: tl.constexpr,
    BD: tl.constexpr, R: tl.constexpr, NS: tl.constexpr,
    FAST: tl.constexpr = False,
):
    """conv_fwd_kernel's work with x rows fetched through `x_desc` ([B, T, D], box [1, R, BD];
    rows past T and channels past D arrive as zeros); the halo before the chunk by pointer."""
    pid_b, cols64, cmask, t_begin, t_end = block_coords(D, T, TC, BD)
    n_d = tl.cdiv(D, BD)
    d0 = (tl.program_id(0) % n_d) * BD
    px = x + pid_b * s_xb + cols64
    py = y + pid_b * T * D + cols64  # y is contiguous [B, T, D]
    c0, c1, c2, c3, b, x1, x2, x3, s, start, end = window_setup(
        px, weight, bias, cu_seqlens, cols64, cmask, t_begin, T, N_SEQ, N_STEPS, s_xt, s_wd, s_wi,
        W, HAS_BIAS, IS_VARLEN)
    for u0 in tl.range(t_begin, t_end, R, num_stages=NS):
        tile = x_desc.load([tl.program_id(1), u0, d0]).reshape(R, BD)
        xs = split_rows(tl.trans(tile), R, BD)
        x1, x2, x3, s, start, end = fwd_trip(xs, u0, t_end, T, x1, x2, x3, c0, c1, c2, c3, b, py, D,
                                             cmask, cu_seqlens, s, start, end,
                                             W, HAS_BIAS, SILU, IS_VARLEN, R, FAST)


def conv_fwd(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, silu: bool,
             cu_seqlens: torch.Tensor | None = None, tma: bool | None = None, *,
             config: triton.Config | None = None) -> torch.Tensor:
    """y `[B, T, D]` contiguous in x.dtype, computed in fp32.

    x `[B, T, D]` any strides (a column slice of a wider projection, a transposed `[B, D, T]`
    buffer); weight `[D, W]` (W in 1..4) any float dtype and strides; bias `[D]` or None;
    cu_seqlens int32/int64 `[N+1]` with B == 1 for packed documents. `tma`: force the TMA
    forward (x must pass `tma_ok`) or the pointer one; None picks (`use_tma`). `config`: one of
    the kernel's `CONFIGS` / `CANDIDATES` (`TMA_CONFIGS` / `TMA_CANDIDATES` for the TMA forward)
    instead of the autotuner's pick (the TMA forward's one fixed config).
    """
    B, T, D = x.shape
    W = weight.shape[1]
    assert weight.shape[0] == D and 1 <= W <= 4, (tuple(x.shape), tuple(weight.shape))
    assert cu_seqlens is None or B == 1, "cu_seqlens needs B == 1"
    y = alloc((B, T, D), dtype=x.dtype, device=x.device)
    if y.numel() == 0:
        return y
    n_seq, n_steps = varlen_args(cu_seqlens)
    if tma is None:
        tma = use_tma(x)
    elif tma:
        assert tma_ok(x), "the TMA forward needs a D-contiguous, 16-byte aligned x on sm_90+"
    if tma:
        n_chunks, rows = time_chunks(B, T, D, x.device, _MAX_ROWS_TMA, _WARPS_PER_SM_FWD, _MIN_ROWS_FWD)
        cfg = config or TMA_CONFIGS[0]
        BD, R = cfg.kwargs["BD"], cfg.kwargs["R"]
        desc = TensorDescriptor(x, list(x.shape), list(x.stride()), [1, R, BD])
        conv_fwd_tma_kernel[(cdiv(D, BD) * n_chunks, B)](
            desc, x, weight, bias if bias is not None else weight, y,
            cu_seqlens if cu_seqlens is not None else weight,
            T, D, rows, n_seq, n_steps,
            x.stride(0), x.stride(1), weight.stride(0), weight.stride(1),
            W=W, HAS_BIAS=bias is not None, SILU=bool(silu), IS_VARLEN=cu_seqlens is not None,
            BD=BD, R=R, NS=cfg.kwargs["NS"], FAST=FAST_MATH, num_warps=cfg.num_warps,
        )
        record_launch("cconv.fwd_tma")
        record_launch("cconv.fwd")
        return y
    n_chunks, rows = time_chunks(B, T, D, x.device, _MAX_ROWS_FWD, _WARPS_PER_SM_FWD, _MIN_ROWS_FWD)
    launch(conv_fwd_kernel, lambda meta: (cdiv(D, meta["BD"]) * n_chunks, B), config,
        x, weight, bias if bias is not None else weight, y,
        cu_seqlens if cu_seqlens is not None else weight,
        T, D, rows, n_seq, n_steps,
        x.stride(0), x.stride(1), x.stride(2), weight.stride(0), weight.stride(1),
        W=W, HAS_BIAS=bias is not None, SILU=bool(silu), IS_VARLEN=cu_seqlens is not None,
        X_TMAJOR=t_major(x), VEC16=aligned16(x), FAST=FAST_MATH,
    )
    record_launch("cconv.fwd")
    return y
