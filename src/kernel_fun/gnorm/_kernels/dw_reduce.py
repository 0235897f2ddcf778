"""The fixed-order sum of the backward's per-program dw/db partials: deterministic, no atomics.

cconv has a reduce of the same idea over its own [chunks, W + 1, D] layout; this one reads
gnorm's [programs, 2, V] (row 0 dw, row 1 db) and writes either or both. A few hundred partial
rows (the persistent backward) take one pass; more (a plain-grid backward has one per program,
tens of thousands at 2M rows) take two: groups of GROUP rows into a [groups, 2, V] fp32 buffer,
then that. The order depends on the partial count alone, so the bits do too.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernel_fun._common.tuning import alloc, cdiv, install_interpreter_shims
from kernel_fun._common.witness import record_launch

install_interpreter_shims()

GROUP = 512  # partial rows per program of the first pass, when there are more than this


@triton.jit
def dw_reduce_kernel(part, out_w, out_b, n_part, group, s_out, V, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                     BP: tl.constexpr, BM: tl.constexpr):
    """Column block program_id(0) of rows [j * group, (j + 1) * group) of the partials (row 0 dw,
    row 1 db), j = program_id(1): each of the BP lanes sums its rows lane, lane + BP, ... in
    sequence, then a fixed-shape tree over the lanes; the sums land at out_w / out_b + j * s_out."""
    offs = tl.program_id(0) * BM + tl.arange(0, BM)
    j = tl.program_id(1)
    m = offs < V
    lanes = tl.arange(0, BP)
    acc_w = tl.zeros((BP, BM), dtype=tl.float32)
    acc_b = tl.zeros((BP, BM), dtype=tl.float32)
    lo = j * group
    hi = tl.minimum(lo + group, n_part)
    for p0 in range(lo, hi, BP):
        p = p0 + lanes
        ptr = part + p.to(tl.int64)[:, None] * (2 * V) + offs[None, :]
        pm = (p < hi)[:, None] & m[None, :]
        if HAS_W:
            acc_w += tl.load(ptr, mask=pm, other=0.0)
        if HAS_B:
            acc_b += tl.load(ptr + V, mask=pm, other=0.0)
    o = j.to(tl.int64) * s_out + offs
    if HAS_W:
        tl.store(out_w + o, tl.sum(acc_w, axis=0).to(out_w.dtype.element_ty), mask=m)
    if HAS_B:
        tl.store(out_b + o, tl.sum(acc_b, axis=0).to(out_b.dtype.element_ty), mask=m)


def dw_reduce(part: torch.Tensor, n_part: int, dw: torch.Tensor | None, db: torch.Tensor | None) -> None:
    """dw[v] = sum_p part[p, 0, v], db[v] = sum_p part[p, 1, v] over the first n_part rows.
    Fixed configs: the summation order, hence the bits, must not depend on an autotune pick."""
    V = part.shape[2]
    BM = 128
    has_w, has_b = dw is not None, db is not None
    if n_part > GROUP:  # first pass: groups of GROUP rows, in fp32
        n_grp = cdiv(n_part, GROUP)
        mid = alloc((n_grp, 2, V), dtype=torch.float32, device=part.device)
        dw_reduce_kernel[(cdiv(V, BM), n_grp)](
            part, mid, mid[:, 1], n_part, GROUP, 2 * V, V,
            HAS_W=has_w, HAS_B=has_b, BP=32, BM=BM, num_warps=4,
        )
        part, n_part = mid, n_grp
    dw_reduce_kernel[(cdiv(V, BM), 1)](
        part, dw if has_w else part, db if has_b else part, n_part, max(n_part, 1), 0, V,
        HAS_W=has_w, HAS_B=has_b, BP=32, BM=BM, num_warps=4,
    )
    record_launch("gnorm.dw_reduce")
