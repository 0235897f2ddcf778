"""The fixed-order sum of the backward's per-program dw/db partials: deterministic, no atomics.

cconv has a reduce of the same idea over its own [chunks, W + 1, D] layout; this one reads
gnorm's [programs, 2, V] (row 0 dw, row 1 db) and writes either or both.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernel_fun._common.tuning import cdiv, install_interpreter_shims
from kernel_fun._common.witness import record_launch

install_interpreter_shims()


@triton.jit
def dw_reduce_kernel(part, dw, db, n_part, V, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                     BP: tl.constexpr, BM: tl.constexpr):
    """Column block `pid` of row 0 (dw) and row 1 (db): each of the BP lanes sums its partial
    rows p = lane, lane + BP, ... in sequence, then a fixed-shape tree over the BP lanes."""
    offs = tl.program_id(0) * BM + tl.arange(0, BM)
    m = offs < V
    lanes = tl.arange(0, BP)
    acc_w = tl.zeros((BP, BM), dtype=tl.float32)
    acc_b = tl.zeros((BP, BM), dtype=tl.float32)
    for p0 in range(0, n_part, BP):
        p = p0 + lanes
        ptr = part + p.to(tl.int64)[:, None] * (2 * V) + offs[None, :]
        pm = (p < n_part)[:, None] & m[None, :]
        if HAS_W:
            acc_w += tl.load(ptr, mask=pm, other=0.0)
        if HAS_B:
            acc_b += tl.load(ptr + V, mask=pm, other=0.0)
    if HAS_W:
        tl.store(dw + offs, tl.sum(acc_w, axis=0).to(dw.dtype.element_ty), mask=m)
    if HAS_B:
        tl.store(db + offs, tl.sum(acc_b, axis=0).to(db.dtype.element_ty), mask=m)


def dw_reduce(part: torch.Tensor, n_part: int, dw: torch.Tensor | None, db: torch.Tensor | None) -> None:
    """dw[v] = sum_p part[p, 0, v], db[v] = sum_p part[p, 1, v] over the first n_part rows.
    Fixed config: the summation order, hence the bits, must not depend on an autotune pick."""
    V = part.shape[2]
    BM = 128
    dw_reduce_kernel[(cdiv(V, BM),)](
        part, dw if dw is not None else part, db if db is not None else part, n_part, V,
        HAS_W=dw is not None, HAS_B=db is not None, BP=32, BM=BM, num_warps=4,
    )
    record_launch("gnorm.dw_reduce")
