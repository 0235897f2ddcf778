"""gnorm backward: dx, dg and the per-program dw/db partials, in one pass over h, g and dy.

With xh = h * rstd, p = xh * w (+ b) (the pre-gate output), a = act(g), a' = act'(g):

    dg  = dy * p * a'
    dyg = dy * a                          (the gradient reaching the norm's output)
    dx  = rstd * (dyg w - xh * mean(xh * dyg w))   (+ the prenorm output's gradient)
    dw  = sum over rows of dyg * xh,  db = sum over rows of dyg

rstd is the forward's (fp32 `[N]`, 4 B per row): h is read once, nothing is re-run. h is the
forward's x + residual (what it stored) or x itself.

Work layout: a persistent grid, PPS programs per SM (`sm_count * PPS` programs, fewer when
there are fewer tiles), each walking [BR, BV] row tiles pid, pid + grid, ... so that
all programs stream neighbouring rows at once and every program has the same number of tiles
to within one. dw/db accumulate per thread in an fp32 [BR, BV] register tile over all the
program's rows and land, summed over the tile's rows, in an fp32 partial buffer
[programs, 2, V] that `dw_reduce` sums in a fixed order: deterministic, no atomics, and few
partials (~500 rows at 4 programs per SM on 132 SMs, 0.5 MB at V = 256).

Slot layout (configs with SLOTS = S > 0; candidates until timed): a plain grid, one tile a
program, the layout whose byte stream alone runs at the copy ceiling (a program that walks
tiles loses ~1.5% a doubling of its trip count, docs/gnorm.md). Tile t's dw/db row sums are
added into partial row t % S in the order t, t + S, t + 2S, ...: the program waits (acquire)
until flag[t % S] says tile t - S has added its own, adds, and releases the flag to t // S + 1.
The S partial rows then go through `dw_reduce` as above, so dw/db are bitwise the same every
run. The add comes before dx's store (TAIL_FIRST), so that the release's fence waits on the
earlier dg store only; TAIL_FIRST=False adds after it. Progress relies on the hardware starting
a 1-D grid's programs in index order (tile t - S then runs, or has run, whenever tile t waits
on it), which CUB's decoupled look-back scans rely on too (NVIDIA/cub#245). The flags are
zeroed before each launch.

Floor (H200, bf16): h, g, dy in, dx, dg out = 10 B per element; N = 2,097,152 rows at V = 256
is 5.37 GB = 1.27 ms at the 4.24 TB/s copy ceiling (fla: 1.424 ms, 88% of copy, with one
program per SM). Issue is ~25 SASS instructions per element (~0.4 ms on 132 SMs) and 2 MUFU
(fast sigmoid: ex2, rcp; ~0.26 ms): memory-bound, so the lever is bytes in flight: several
programs per SM and Triton's loop pipeliner (NS stages of cp.async) in some configs.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernel_fun._common.fastmath import FAST_MATH
from kernel_fun._common.hardware import sm_count
from kernel_fun._common.tuning import (  # noqa: F401
    alloc, autotune_cache, autotune_configs, cdiv, config_name, install_interpreter_shims, launch)
from kernel_fun._common.witness import record_launch

from .common import GATES, block_v, gate_fwd_bwd, n_bucket, prune_by_registers, rows_per_tile
from .dw_reduce import dw_reduce

install_interpreter_shims()


# TILE elements per tile, PPS programs per SM, NS loop stages (1: plain loop; > 1: Triton's
# pipeliner, cp.async into shared memory), num_warps. Each config caps registers so that PPS
# programs fit one SM together (65536 registers / (PPS * 32 * num_warps)): a persistent
# program that is not resident runs after the others, a second wave for its tiles. Uncapped,
# ptxas gives 96-134 registers at V = 128-256 (sm_90a, bf16, 2048-element tiles on 4 warps),
# which would hold 4 programs per SM to 3 at V = 128; capped at 128, none of the first seven
# spills at V = 128, 256, 512, either gate (tests/gnorm/test_compile.py holds them to it).
# Not yet timed on a GPU; the first is what the interpreter runs.
CONFIGS = [
    triton.Config({"TILE": 2048, "PPS": 4, "NS": 2}, num_warps=4, maxnreg=128),
    triton.Config({"TILE": 2048, "PPS": 4, "NS": 1}, num_warps=4, maxnreg=128),
    triton.Config({"TILE": 2048, "PPS": 4, "NS": 3}, num_warps=4, maxnreg=128),
    triton.Config({"TILE": 1024, "PPS": 8, "NS": 2}, num_warps=2, maxnreg=128),
    triton.Config({"TILE": 1024, "PPS": 8, "NS": 1}, num_warps=2, maxnreg=128),
    triton.Config({"TILE": 4096, "PPS": 2, "NS": 1}, num_warps=8, maxnreg=128),
    triton.Config({"TILE": 4096, "PPS": 2, "NS": 2}, num_warps=8, maxnreg=128),
    triton.Config({"TILE": 8192, "PPS": 1, "NS": 1}, num_warps=16, maxnreg=128),  # V up to MAX_V
]
# Extra configs `kernel-fun bench --stages gnorm` may force: the slot layout's below. Twelve others
# were timed on the H200 on 2026-12-02 at the bar's shape (deeper cp.async pipelines, 16 one-warp
# programs an SM, a plain grid of 8-32 tiles a program, register caps of 72-96 for 5-7 programs an
# SM) and none beat the autotuner's pick (1.332-1.342 ms at V = 256, 0.668-0.677 at V = 128; the candidates 1.343-1.575
# and 0.686-0.794; no longer kept): docs/gnorm.md.
# The slot layout (module docstring): one tile a program, S = 2048 partial rows (4 MB at
# V = 256). Its stream with the slot tail and no math (tools/gnorm_streams.py --slots, H100,
# 2026-12-06) ran 1.3% (V = 128) to 2.3% (V = 256) over the plain grid on 8192-element
# tiles, where the persistent backward runs ~5% over it. PPS is unused (1). sm_90a, bf16, the
# layers' flags: no accumulator tile, so 80-113 registers uncapped. A cap of 96 never spills
# (V = 128, 256, 512, both gates, both add orders, Triton 3.6 and 3.9); 64-80 did at some of
# them, so the most programs an SM here is 10 (1024-element tiles on 2 warps).
# tests/gnorm/test_compile.py holds every candidate to no spill.
CANDIDATES: list = [
    triton.Config({"TILE": 8192, "PPS": 1, "NS": 1, "SLOTS": 2048}, num_warps=16, maxnreg=128),
    triton.Config({"TILE": 4096, "PPS": 1, "NS": 1, "SLOTS": 2048}, num_warps=8, maxnreg=128),
    triton.Config({"TILE": 2048, "PPS": 1, "NS": 1, "SLOTS": 2048}, num_warps=4, maxnreg=128),
    triton.Config({"TILE": 2048, "PPS": 1, "NS": 1, "SLOTS": 2048}, num_warps=4, maxnreg=96),
    triton.Config({"TILE": 1024, "PPS": 1, "NS": 1, "SLOTS": 2048}, num_warps=2, maxnreg=128),
    triton.Config({"TILE": 1024, "PPS": 1, "NS": 1, "SLOTS": 2048}, num_warps=2, maxnreg=96),
    # the add after dx's store (its release then also waits on dx's store): the stream's order
    triton.Config({"TILE": 8192, "PPS": 1, "NS": 1, "SLOTS": 2048, "TAIL_FIRST": False},
                  num_warps=16, maxnreg=128),
    triton.Config({"TILE": 2048, "PPS": 1, "NS": 1, "SLOTS": 2048, "TAIL_FIRST": False},
                  num_warps=4, maxnreg=96),
]


def slots_of(config) -> int:
    """S of a config in the slot layout, 0 in the persistent one."""
    return config.kwargs.get("SLOTS", 0)


MAX_PPS = max(c.kwargs["PPS"] for c in CONFIGS)  # of the autotuner's configs (the partials' size)
MAX_SLOTS = max(map(slots_of, CONFIGS))  # 0: no autotuned config takes the slot layout


@triton.jit
def _slot_add(part, flag, t, cw, cb, cols, cmask, V: tl.constexpr, SLOTS: tl.constexpr,
              HAS_W: tl.constexpr, HAS_B: tl.constexpr):
    """Tile t's dw/db row sums (cw, cb: its [BR, BV] terms) added into partial row t % SLOTS
    after tile t - SLOTS added its own (the slot's flag reads t // SLOTS), then the flag released."""
    slot = t % SLOTS
    k = t // SLOTS  # this tile is the slot's k-th
    if HAS_W:
        pw = tl.sum(cw, axis=0)
    if HAS_B:
        pb = tl.sum(cb, axis=0)
    while tl.atomic_add(flag + slot, 0, sem="acquire") < k:  # tile t - S has not added yet
        pass
    pp = part + slot.to(tl.int64) * (2 * V) + cols
    # the slot's first tile writes, the later ones add: read from L2 (another SM wrote it)
    old = cmask & (cols * 0 + k > 0)  # a tensor term: Triton 3.9's interpreter takes no scalar in a mask
    if HAS_W:
        tl.store(pp, tl.load(pp, mask=old, other=0.0, cache_modifier=".cg") + pw, mask=cmask,
                 cache_modifier=".cg")
    if HAS_B:
        tl.store(pp + V, tl.load(pp + V, mask=old, other=0.0, cache_modifier=".cg") + pb, mask=cmask,
                 cache_modifier=".cg")
    tl.debug_barrier()  # every thread's add before the release
    tl.atomic_xchg(flag + slot, k + 1, sem="release")


@triton.autotune(
    configs=autotune_configs(CONFIGS), **autotune_cache(),
    # a slot config's flags start at 0 on every timed run too
    **({"reset_to_zero": ["flag"]} if MAX_SLOTS else {}),
    key=["V", "N_BUCKET", "GATE", "HAS_W", "HAS_B", "HAS_DRES", "STORE_DRES"],
    prune_configs_by={"early_config_prune": prune_by_registers(16)},
)
@triton.heuristics({"BR": lambda a: rows_per_tile(a["TILE"], a["BV"])})
@triton.jit
def gnorm_bwd_kernel(
    h, g, w, b, rstd, dy, dres, dx, dg, dres_in, part, flag,
    N, s_h, s_g, s_dy, s_dres,
    V: tl.constexpr, BV: tl.constexpr, GATE: tl.constexpr,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_DRES: tl.constexpr, STORE_DRES: tl.constexpr,
    N_BUCKET: tl.constexpr,  # autotune key only (common.n_bucket)
    TILE: tl.constexpr, PPS: tl.constexpr, NS: tl.constexpr, BR: tl.constexpr,
    FAST: tl.constexpr = False, SLOTS: tl.constexpr = 0, TAIL_FIRST: tl.constexpr = True,
):
    pid = tl.program_id(0)
    if SLOTS == 0:  # persistent: tiles pid, pid + grid, ...
        t_stop = tl.cdiv(N, BR)
        t_step = tl.num_programs(0)
    else:  # slot layout: tile pid alone
        t_stop = pid + 1
        t_step = 1
    cols = tl.arange(0, BV)
    cmask = cols < V
    if HAS_W:
        wv = tl.load(w + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    if HAS_B:
        bv = tl.load(b + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    acc_w = tl.zeros((BR, BV), dtype=tl.float32)
    acc_b = tl.zeros((BR, BV), dtype=tl.float32)

    for t in tl.range(pid, t_stop, t_step, num_stages=NS):
        rows = t * BR + tl.arange(0, BR)
        rmask = rows < N
        m = rmask[:, None] & cmask[None, :]
        r64 = rows.to(tl.int64)[:, None]
        # rows past N load as 0 (dy = 0): they add nothing to dw/db
        hv = tl.load(h + r64 * s_h + cols[None, :], mask=m, other=0.0).to(tl.float32)
        gv = tl.load(g + r64 * s_g + cols[None, :], mask=m, other=0.0).to(tl.float32)
        dyv = tl.load(dy + r64 * s_dy + cols[None, :], mask=m, other=0.0).to(tl.float32)
        r = tl.load(rstd + rows, mask=rmask, other=0.0)[:, None]

        xh = hv * r
        p = xh
        if HAS_W:
            p = p * wv
        if HAS_B:
            p = p + bv
        a, da = gate_fwd_bwd(gv, GATE, FAST)
        # dg first: its store frees g, p and a' before the row reduction below (register
        # pressure: the swish backward spilled under the 128-register cap with dg stored last)
        tl.store(dg + r64 * V + cols[None, :], (dyv * p * da).to(dg.dtype.element_ty), mask=m)
        dyg = dyv * a
        if SLOTS == 0:
            if HAS_W:
                acc_w += dyg * xh
            if HAS_B:
                acc_b += dyg
        wdy = dyg
        if HAS_W:
            wdy = dyg * wv
        c1 = tl.sum(xh * wdy, axis=1) / V  # masked columns are 0 in xh
        dxv = (wdy - xh * c1[:, None]) * r
        if HAS_DRES:
            dxv += tl.load(dres + r64 * s_dres + cols[None, :], mask=m, other=0.0).to(tl.float32)
        # slot layout (one tile a program): the partial's add before dx's store (TAIL_FIRST), so
        # that the release waits on the dg store alone, or after it
        if SLOTS > 0 and TAIL_FIRST:
            _slot_add(part, flag, t, dyg * xh, dyg, cols, cmask, V, SLOTS, HAS_W, HAS_B)
        # dx, dres_in (and dg above): contiguous [N, V]
        tl.store(dx + r64 * V + cols[None, :], dxv.to(dx.dtype.element_ty), mask=m)
        if STORE_DRES:
            tl.store(dres_in + r64 * V + cols[None, :], dxv.to(dres_in.dtype.element_ty), mask=m)
        if SLOTS > 0 and not TAIL_FIRST:
            _slot_add(part, flag, t, dyg * xh, dyg, cols, cmask, V, SLOTS, HAS_W, HAS_B)

    # partials [programs, 2, V] (the slot layout added its own above): row 0 dw (with a weight),
    # row 1 db (with a bias)
    if SLOTS == 0:
        pp = part + pid.to(tl.int64) * (2 * V) + cols
        if HAS_W:
            tl.store(pp, tl.sum(acc_w, axis=0), mask=cmask)
        if HAS_B:
            tl.store(pp + V, tl.sum(acc_b, axis=0), mask=cmask)


def gnorm_bwd(h, g, weight, bias, rstd, dy, dres, activation: str, x_dtype, res_dtype, need_dw: bool, need_db: bool,
              *, config: triton.Config | None = None):
    """(dx, dg, dw, db, dres_in): dx `[N, V]` in x_dtype, dg in g.dtype, dw/db `[V]` in the
    parameter's dtype (None when not needed or absent), dres_in `[N, V]` in res_dtype when
    res_dtype is given and differs from x_dtype (else None: the residual's gradient is dx).

    h, g, dy, dres: `[N, V]` with unit column stride; rstd fp32 `[N]`. dw/db bitwise
    reproducible run to run for one autotune pick (fixed-order reduction, no atomics). `config`:
    one of `CONFIGS` / `CANDIDATES` instead of the autotuner's pick.
    """
    N, V = h.shape
    dev = h.device
    dx = alloc((N, V), dtype=x_dtype, device=dev)
    dg = alloc((N, V), dtype=g.dtype, device=dev)
    store_dres = res_dtype is not None and res_dtype != x_dtype
    dres_in = alloc((N, V), dtype=res_dtype, device=dev) if store_dres else None
    # dw/db are reduced whenever the parameter exists (a few KB), needed or not, so the reduce's
    # compiled variant depends on the call's signature alone (CUDA graph capture)
    dw = alloc((V,), dtype=weight.dtype, device=dev) if weight is not None else None
    db = alloc((V,), dtype=bias.dtype, device=dev) if bias is not None else None
    if N == 0:
        for t in (dw, db):
            if t is not None:
                t.zero_()
        return dx, dg, dw if need_dw else None, db if need_db else None, dres_in
    BV = block_v(V)
    n_sm = sm_count(dev)
    # one partial row pair per program (persistent layout: the autotuner's configs have at most
    # MAX_PPS programs per SM, a forced config its own PPS) or per slot (slot layout)
    pps, n_slots = (config.kwargs["PPS"], slots_of(config)) if config is not None else (MAX_PPS, MAX_SLOTS)
    part = alloc((max(n_sm * pps, n_slots), 2, V), dtype=torch.float32, device=dev)
    flag = torch.zeros(n_slots, dtype=torch.int32, device=dev) if n_slots else part  # part: never read

    def grid(meta):
        n_tiles = cdiv(N, meta["BR"])
        return (n_tiles,) if meta.get("SLOTS", 0) else (min(n_tiles, n_sm * meta["PPS"]),)

    launch(gnorm_bwd_kernel, grid, config,
        h, g, weight if weight is not None else h, bias if bias is not None else h, rstd, dy,
        dres if dres is not None else dy, dx, dg, dres_in if store_dres else dx, part, flag,
        N, h.stride(0), g.stride(0), dy.stride(0), dres.stride(0) if dres is not None else 0,
        V=V, BV=BV, GATE=GATES[activation], HAS_W=weight is not None,
        HAS_B=bias is not None, HAS_DRES=dres is not None, STORE_DRES=store_dres,
        N_BUCKET=n_bucket(N), FAST=FAST_MATH,
    )
    record_launch("gnorm.bwd")
    if dw is not None or db is not None:
        cfg = config or gnorm_bwd_kernel.best_config
        n_part = min(cdiv(N, rows_per_tile(cfg.kwargs["TILE"], BV)), slots_of(cfg) or n_sm * cfg.kwargs["PPS"])
        dw_reduce(part, n_part, dw, db)
    return dx, dg, dw if need_dw else None, db if need_db else None, dres_in
