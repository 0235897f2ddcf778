"""gnorm forward: per row of x `[N, V]`,

    h    = x (+ residual)                      in fp32
    rstd = 1 / sqrt(mean(h^2) + eps)           saved, fp32 `[N]`
    y    = (h * rstd * weight (+ bias)) * act(g)

with act(g) = g * sigmoid(g) (swish/silu) or sigmoid(g). h is stored (in the residual's dtype,
or fp32 under residual_in_fp32) when there is a residual or residual_in_fp32 asks for it: the
backward and the caller's prenorm output read it.

Work layout: a program owns BR whole rows (a [BR, BV] tile, BV = V padded to a power of two,
BR * BV = TILE elements), so the row's sum of squares is a reduction inside the tile (within a
warp for V <= 256 at 8 elements per thread) and every tensor is read once. No reduction across
programs, so the grid is simply one program per tile: many small programs keep enough loads in
flight (the same shape as fla's forward, which runs at the copy ceiling:
shared/baselines/h200-2026-11-30.md, 0.752 ms at N = 2,097,152, V = 256, 4.29 TB/s).

Floor (H200, bf16, no residual): x and g in, y out = 6 B per element; N = 2,097,152 rows at
V = 256 is 3.22 GB = 0.76 ms at the 4.24 TB/s copy ceiling, 0.38 ms at V = 128. Issue per
element is ~12 SASS instructions (converts, the sum of squares, the 4-instruction fast
sigmoid of `_common.fastmath`, the products): far below the memory time.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernel_fun._common.fastmath import FAST_MATH
from kernel_fun._common.tuning import (  # noqa: F401
    alloc, autotune_cache, autotune_configs, cdiv, config_name, install_interpreter_shims, launch)
from kernel_fun._common.witness import record_launch

from .common import GATES, block_v, gate_fwd, n_bucket, prune_by_registers, rows_per_tile

install_interpreter_shims()


# TILE elements per program ([BR, BV] with BR = TILE // BV), num_warps. Not yet timed on a GPU:
# the autotuner picks among tiles of 16-64 KB of bf16 traffic per program (x, g, y), 4 to 16
# elements per thread per tensor; the first is what the interpreter runs.
CONFIGS = [
    triton.Config({"TILE": 2048}, num_warps=4),
    triton.Config({"TILE": 4096}, num_warps=4),
    triton.Config({"TILE": 4096}, num_warps=8),
    triton.Config({"TILE": 8192}, num_warps=8),
    triton.Config({"TILE": 2048}, num_warps=2),
    triton.Config({"TILE": 8192}, num_warps=16),
]
# Extra configs a bench may force (none yet: nothing is timed).
CANDIDATES: list = []


@triton.autotune(
    configs=autotune_configs(CONFIGS), **autotune_cache(),
    key=["V", "N_BUCKET", "GATE", "HAS_W", "HAS_B", "HAS_RES", "STORE_RES"],
    prune_configs_by={"early_config_prune": prune_by_registers(32)},
)
@triton.heuristics({"BR": lambda a: rows_per_tile(a["TILE"], a["BV"])})
@triton.jit
def gnorm_fwd_kernel(
    x, g, w, b, res, res_out, y, rstd,
    N, eps, s_x, s_g, s_r,
    V: tl.constexpr, BV: tl.constexpr, GATE: tl.constexpr,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_RES: tl.constexpr, STORE_RES: tl.constexpr,
    N_BUCKET: tl.constexpr,  # autotune key only (common.n_bucket)
    TILE: tl.constexpr, BR: tl.constexpr,
    FAST: tl.constexpr = False,  # fastmath.sigmoid's short form (FAST_MATH: not interpreted)
):
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    cols = tl.arange(0, BV)
    rmask = rows < N
    cmask = cols < V
    m = rmask[:, None] & cmask[None, :]
    r64 = rows.to(tl.int64)[:, None]  # N * V may pass 2**31 elements

    h = tl.load(x + r64 * s_x + cols[None, :], mask=m, other=0.0).to(tl.float32)
    if HAS_RES:
        h += tl.load(res + r64 * s_r + cols[None, :], mask=m, other=0.0).to(tl.float32)
    if STORE_RES:  # res_out is contiguous [N, V]
        tl.store(res_out + r64 * V + cols[None, :], h.to(res_out.dtype.element_ty), mask=m)
    gv = tl.load(g + r64 * s_g + cols[None, :], mask=m, other=0.0).to(tl.float32)

    # masked columns loaded as 0: the sum covers the V real ones
    r = 1.0 / tl.sqrt_rn(tl.sum(h * h, axis=1) / V + eps)
    tl.store(rstd + rows, r, mask=rmask)
    out = h * r[:, None]
    if HAS_W:
        out = out * tl.load(w + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    if HAS_B:
        out = out + tl.load(b + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    out = out * gate_fwd(gv, GATE, FAST)
    tl.store(y + r64 * V + cols[None, :], out.to(y.dtype.element_ty), mask=m)


def gnorm_fwd(x: torch.Tensor, g: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
              residual: torch.Tensor | None, res_dtype: torch.dtype | None, eps: float, activation: str,
              *, config: triton.Config | None = None):
    """(y, rstd, h): y `[N, V]` contiguous in x.dtype, rstd fp32 `[N]`, h = x (+ residual)
    `[N, V]` contiguous in `res_dtype` (None when `res_dtype` is None: nothing stored).

    x, g, residual: `[N, V]` with unit column stride (any row stride); weight, bias `[V]` or None.
    `config`: one of `CONFIGS` / `CANDIDATES` instead of the autotuner's pick.
    """
    N, V = x.shape
    y = alloc((N, V), dtype=x.dtype, device=x.device)
    rstd = alloc((N,), dtype=torch.float32, device=x.device)
    h = alloc((N, V), dtype=res_dtype, device=x.device) if res_dtype is not None else None
    if N == 0:
        return y, rstd, h
    BV = block_v(V)
    launch(gnorm_fwd_kernel, lambda meta: (cdiv(N, meta["BR"]),), config,
        x, g, weight if weight is not None else x, bias if bias is not None else x,
        residual if residual is not None else x, h if h is not None else y, y, rstd,
        N, float(eps), x.stride(0), g.stride(0), residual.stride(0) if residual is not None else 0,
        V=V, BV=BV, GATE=GATES[activation], HAS_W=weight is not None, HAS_B=bias is not None,
        HAS_RES=residual is not None, STORE_RES=h is not None, N_BUCKET=n_bucket(N), FAST=FAST_MATH,
    )
    record_launch("gnorm.fwd")
    return y, rstd, h
