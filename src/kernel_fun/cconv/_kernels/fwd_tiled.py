"""cconv forward, tiled alternative to `fwd`'s time scan (D-contiguous x only).

A program owns a [BT rows, BD channels] tile of y and reads the W shifted [BT, BD] tiles of x
it needs (rows t, t-1, .., t-(W-1)): one HBM read of x per tile, the W-1 shifted re-reads are
meant to hit L1 (the tile itself) or L2 (the previous tile's last W-1 rows). SYNC places a
barrier between the first tile's use and the shifted loads, so that those are issued only once
the tile's lines are in L1 (without it the compiler issues all W loads at once and the shifted
ones can miss L1 while the first is still in flight). No loop, no state across rows: parallelism
is the grid's (B x T/BT x D/BD programs), as in a copy kernel.

Whether this beats the scan is a measurement (scripts/cconv_sweep.py); `fwd.conv_fwd` routes
here when `fwd._FWD_DESIGN == "tile"` and x is D-contiguous. The loser should be deleted.
"""
from __future__ import annotations

import triton
import triton.language as tl

from kernel_fun._common.tuning import autotune_configs, install_interpreter_shims

from .fwd import load_taps

install_interpreter_shims()

_TILE_CONFIGS = [
    # BT rows x BD channels, 8 channels per thread for BD >= 256 (16 B vectors), 32 elements
    # per thread (64 per thread took 206 registers); SYNC: barrier before the shifted loads.
    # Registers (ptxas sm_90a, bf16, W=4, silu): 122-128. Not yet timed.
    triton.Config({"BT": 16, "BD": 256, "SYNC": True}, num_warps=4),
    triton.Config({"BT": 16, "BD": 256, "SYNC": False}, num_warps=4),
    triton.Config({"BT": 32, "BD": 256, "SYNC": True}, num_warps=8),
    triton.Config({"BT": 16, "BD": 512, "SYNC": True}, num_warps=8),
    triton.Config({"BT": 8, "BD": 256, "SYNC": True}, num_warps=2),
    triton.Config({"BT": 32, "BD": 128, "SYNC": True}, num_warps=4),
]


@triton.jit
def doc_starts(cu_seqlens, N_SEQ, N_STEPS, rows):
    """Start of the document holding each of `rows` (vector binary search over cu_seqlens)."""
    lo = rows * 0
    hi = lo + N_SEQ
    for _ in range(N_STEPS):
        mid = (lo + hi) // 2
        go = tl.load(cu_seqlens + mid).to(tl.int32) <= rows
        lo = tl.where(go, mid, lo)
        hi = tl.where(go, hi, mid)
    return tl.load(cu_seqlens + lo).to(tl.int32)


@triton.autotune(
    configs=autotune_configs(_TILE_CONFIGS),
    key=["D", "W", "HAS_BIAS", "SILU", "IS_VARLEN", "VEC16"],
)
@triton.jit
def conv_fwd_kernel_tiled(
    x, weight, bias, y, cu_seqlens,
    T, D, N_SEQ, N_STEPS,
    s_xb, s_xt, s_xd, s_wd, s_wi,
    W: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr, IS_VARLEN: tl.constexpr,
    VEC16: tl.constexpr,  # autotune key only: fwd.aligned16(x)
    BT: tl.constexpr, BD: tl.constexpr, SYNC: tl.constexpr,
):
    n_d = tl.cdiv(D, BD)  # grid (channel blocks x row tiles, B), channel block fastest
    pid = tl.program_id(0)
    pid_t = pid // n_d
    pid_d = pid - pid_t * n_d
    pid_b = tl.program_id(1).to(tl.int64)
    cols = pid_d * BD + tl.arange(0, BD)
    cmask = cols < D
    cols64 = cols.to(tl.int64)
    rows = pid_t * BT + tl.arange(0, BT)
    rmask = rows < T
    c0, c1, c2, c3 = load_taps(weight, cols64, cmask, s_wd, s_wi, W)

    start = rows * 0
    if IS_VARLEN:
        start = doc_starts(cu_seqlens, N_SEQ, N_STEPS, tl.minimum(rows, T - 1))
    px = x + pid_b * s_xb + cols64[None, :] * s_xd
    x0 = tl.load(px + rows.to(tl.int64)[:, None] * s_xt, mask=rmask[:, None] & cmask[None, :], other=0.0)
    acc = c0[None, :] * x0.to(tl.float32)
    if HAS_BIAS:
        acc += tl.load(bias + cols64, mask=cmask, other=0.0).to(tl.float32)[None, :]
    if SYNC:
        tl.debug_barrier()
    for k in tl.static_range(1, W):
        if k == 1:
            ck = c1
        elif k == 2:
            ck = c2
        else:
            ck = c3
        r = rows - k
        m = (r >= start) & rmask
        xk = tl.load(px + r.to(tl.int64)[:, None] * s_xt, mask=m[:, None] & cmask[None, :], other=0.0)
        acc += ck[None, :] * xk.to(tl.float32)
    if SILU:
        acc = acc * tl.sigmoid(acc)
    py = y + pid_b * T * D + rows.to(tl.int64)[:, None] * D + cols64[None, :]  # y contiguous
    tl.store(py, acc.to(y.dtype.element_ty), mask=rmask[:, None] & cmask[None, :])


def launch_tiled(x, weight, bias, y, silu, cu_seqlens, n_seq, n_steps, vec16):
    """Fill y (contiguous [B, T, D]) with the tiled kernel; arguments as in `fwd.conv_fwd`."""
    B, T, D = x.shape
    conv_fwd_kernel_tiled[lambda meta: (triton.cdiv(D, meta["BD"]) * triton.cdiv(T, meta["BT"]), B)](
        x, weight, bias if bias is not None else weight, y,
        cu_seqlens if cu_seqlens is not None else weight,
        T, D, n_seq, n_steps,
        x.stride(0), x.stride(1), x.stride(2), weight.stride(0), weight.stride(1),
        W=weight.shape[1], HAS_BIAS=bias is not None, SILU=bool(silu), IS_VARLEN=cu_seqlens is not None,
        VEC16=vec16,
    )
