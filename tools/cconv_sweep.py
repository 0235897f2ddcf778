#!/usr/bin/env python
"""Sweep: every cconv kernel variant, forced one at a time, at the bench's shapes, on one GPU.

    python scripts/cconv_sweep.py out.json [--cases prod2048,latency,prod4096,slice,varlen]
                                           [--budget 225] [--no-fla] [--dirs fwd,bwd] [--no-defaults]

For each case (bf16 x, fp32 weight, no bias, silu, W=4; as in `kernel-fun bench`):

* prod2048  B=16 T=8192 D=2048 contiguous        * prod4096  same, D=4096
* latency   B=1  T=2048 D=2048                    * slice     x = [8, 8192, 6144][..., 2048:4096]
* varlen    B=1  T=131072 D=2048, 16 documents (every config, three sizings, no autotuning)

it times (`triton.testing.do_bench`, warmup=25, rep=100, median) the launchers `conv_fwd` /
`conv_bwd` with each autotune config forced (`kernel.configs = [cfg]`) under several grid
sizings (`fwd._MAX_ROWS_FWD` etc.), the autotuned default, the public entry (`cconv.causal_conv1d`, through autograd for
bwd), and fla's `causal_conv1d` (triton backend). Every variant's output is checked against
an fp32 torch reference (relative RMS error; y 5e-3, dx 8e-3, dw 1e-3 flag "BAD").
The latency case also reports the GPU-only time (CUDA graph of 20 calls) and the host time
per call of each entry (`cpu_us`), to separate launch overhead from kernel time.

Prints one line per variant as it goes, then per (case, dir) a table sorted by time (ms,
TB/s, % of a 4 GiB device copy measured first), and writes JSON to argv[1] after every case.
A variant that fails prints its error and the sweep continues; a sticky CUDA error stops it
(the JSON so far is kept). Variants past --budget seconds are skipped (listed as skipped).
Expected runtime: ~3-3.5 min on an H200 from a cold Triton cache (~30 compiles).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import subprocess
import sys
import time
import traceback

if "--smoke" in sys.argv:  # before triton is imported: jit reads it then
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402

T0 = time.time()
ROWS: list[dict] = []
ONE_WAVE = "1wave"  # the 2026-11-30 sizing: one wave of long chunks
DEV = "cuda"
SMOKE = False  # --smoke: tiny shapes on CPU through the interpreter, to test this script itself


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def bench(fn) -> float:
    if SMOKE:
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


def rel(a, b) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def cfg_name(c) -> str:
    kw = ",".join(f"{k}{int(v) if isinstance(v, bool) else v}" for k, v in c.kwargs.items())
    extra = f",mr{c.maxnreg}" if getattr(c, "maxnreg", None) else ""
    return f"{kw},w{c.num_warps}{extra}"


class Sticky(Exception):
    """A CUDA error that poisons the context: nothing after it can be trusted."""


# ----------------------------------------------------------------------------- forcing
@contextlib.contextmanager
def forced(fwd_cfg=None, bwd_cfg=None, fwd_chunk=None, bwd_chunk=None):
    """Pin configs / grid sizing for the duration; restore afterwards.
    A chunk is (max_rows, warps_per_sm, min_rows) or ONE_WAVE."""
    from kernel_fun.cconv._kernels import bwd as B_
    from kernel_fun.cconv._kernels import fwd as F_

    saved = dict(fc=F_.conv_fwd_kernel.configs, bc=B_.conv_bwd_kernel.configs,
                 f=(F_._MAX_ROWS_FWD, F_._WARPS_PER_SM_FWD, F_._MIN_ROWS_FWD, F_._MAX_ROWS_TMA),
                 b=(B_._MAX_ROWS_BWD, B_._WARPS_PER_SM_BWD, B_._MIN_ROWS_BWD),
                 bv=(B_._VARLEN_MAX_ROWS_BWD, B_._VARLEN_WARPS_PER_SM_BWD))
    try:
        if fwd_cfg is not None:
            F_.conv_fwd_kernel.configs = [fwd_cfg]
        if bwd_cfg is not None:
            B_.conv_bwd_kernel.configs = [bwd_cfg]
        if fwd_chunk is not None:
            F_._MAX_ROWS_FWD, F_._WARPS_PER_SM_FWD, F_._MIN_ROWS_FWD = (
                (10 ** 9, 16, 16) if fwd_chunk == ONE_WAVE else fwd_chunk)
            F_._MAX_ROWS_TMA = F_._MAX_ROWS_FWD
        if bwd_chunk is not None:
            B_._MAX_ROWS_BWD, B_._WARPS_PER_SM_BWD, B_._MIN_ROWS_BWD = (
                (10 ** 9, 8, 32) if bwd_chunk == ONE_WAVE else bwd_chunk)
            B_._VARLEN_MAX_ROWS_BWD, B_._VARLEN_WARPS_PER_SM_BWD = 10 ** 9, 0  # the forced sizing, as is
        yield
    finally:
        F_.conv_fwd_kernel.configs, B_.conv_bwd_kernel.configs = saved["fc"], saved["bc"]
        F_._MAX_ROWS_FWD, F_._WARPS_PER_SM_FWD, F_._MIN_ROWS_FWD, F_._MAX_ROWS_TMA = saved["f"]
        B_._MAX_ROWS_BWD, B_._WARPS_PER_SM_BWD, B_._MIN_ROWS_BWD = saved["b"]
        B_._VARLEN_MAX_ROWS_BWD, B_._VARLEN_WARPS_PER_SM_BWD = saved["bv"]


def chunk_desc(kind, chunk, B, T, D, device, tma=False):
    from kernel_fun.cconv._kernels import bwd as B_
    from kernel_fun.cconv._kernels import fwd as F_

    if chunk is None:
        chunk = ((F_._MAX_ROWS_TMA if tma else F_._MAX_ROWS_FWD, F_._WARPS_PER_SM_FWD, F_._MIN_ROWS_FWD) if kind == "fwd"
                 else (B_._MAX_ROWS_BWD, B_._WARPS_PER_SM_BWD, B_._MIN_ROWS_BWD))
    if chunk == ONE_WAVE:
        chunk = (10 ** 9, 16, 16) if kind == "fwd" else (10 ** 9, 8, 32)
    n, rows = F_.time_chunks(B, T, D, device, *chunk)
    return dict(max_rows=chunk[0], warps_per_sm=chunk[1], min_rows=chunk[2], n_chunks=n, rows=rows)


# ----------------------------------------------------------------------------- cases
def make_case(name):
    g = torch.Generator(device=DEV).manual_seed(0)
    cu = None
    if SMOKE:  # same layouts, tiny sizes
        name0, name = name, name
        B, T, D = {"prod2048": (2, 40, 64), "prod4096": (2, 33, 96), "latency": (1, 20, 64),
                   "slice": (2, 24, 32), "varlen": (1, 50, 16)}[name0]
    else:
        B, T, D = {"prod2048": (16, 8192, 2048), "prod4096": (16, 8192, 4096), "latency": (1, 2048, 2048),
                   "slice": (8, 8192, 2048), "varlen": (1, 131072, 2048)}[name]
    dt = torch.float32 if SMOKE else torch.bfloat16  # the interpreter's NumPy has no bf16
    if name == "slice":
        x = torch.randn(B, T, 3 * D, device=DEV, dtype=dt, generator=g)[..., D:2 * D]
    else:
        x = torch.randn(B, T, D, device=DEV, dtype=dt, generator=g)
    if name == "varlen":
        gc = torch.Generator().manual_seed(0)
        cuts = torch.randperm(T - 1, generator=gc)[:15].add(1).sort().values
        cu = torch.cat([torch.tensor([0]), cuts, torch.tensor([T])]).to(DEV)
    W = 4
    w = torch.randn(D, W, device=DEV, generator=g) / W
    dy = torch.randn(B, T, D, device=DEV, dtype=dt, generator=g)
    return dict(name=name, B=B, T=T, D=D, W=W, x=x, w=w, dy=dy, cu=cu)


def reference(c):
    """fp32 torch reference: y, dx, dw (per document for varlen)."""
    x = c["x"].detach().float().requires_grad_()
    w = c["w"].detach().float().requires_grad_()
    D, W = c["D"], c["W"]
    segs = [(0, c["T"])] if c["cu"] is None else list(zip(c["cu"][:-1].tolist(), c["cu"][1:].tolist()))
    ys = []
    for lo, hi in segs:
        xs = x[:, lo:hi].transpose(1, 2)
        ys.append(torch.nn.functional.conv1d(torch.nn.functional.pad(xs, (W - 1, 0)), w[:, None, :],
                                             groups=D).transpose(1, 2))
    y = torch.nn.functional.silu(torch.cat(ys, 1))
    dx, dw = torch.autograd.grad(y, (x, w), c["dy"].float())
    return y.detach(), dx, dw


def fla_conv():
    try:
        from kernel_fun._common.compat import fla_symbol

        return fla_symbol("fla.modules.causal_conv1d", "causal_conv1d")
    except Exception:
        try:
            from fla.modules.convolution import causal_conv1d

            return causal_conv1d
        except Exception as e:  # noqa: BLE001
            log(f"fla unavailable: {e!r}")
            return None


# ----------------------------------------------------------------------------- running
def record(case, direction, variant, ms, nbytes, copy_tbps, extra):
    row = dict(case=case["name"], dir=direction, variant=variant, ms=ms, **extra)
    if ms is not None:
        row["TBps"] = round(nbytes / ms / 1e9, 3)
        row["pct_copy"] = round(100 * row["TBps"] / copy_tbps, 1)
    ROWS.append(row)
    err = " ".join(f"{k}={v:.1e}" for k, v in extra.items() if k.startswith("err_") and v is not None)
    bad = " BAD" if extra.get("bad") else ""
    if ms is None:
        log(f"{case['name']:8s} {direction:4s} {variant:60s} {extra.get('error', extra.get('skipped', ''))}")
    else:
        log(f"{case['name']:8s} {direction:4s} {variant:60s} {ms:8.4f} ms {row['TBps']:6.3f} TB/s "
            f"{row['pct_copy']:5.1f}% {err}{bad}")


def run_variant(case, direction, variant, fn, check, nbytes, copy_tbps, budget, extra=None):
    extra = dict(extra or {})
    if time.time() - T0 > budget:
        record(case, direction, variant, None, nbytes, copy_tbps, dict(extra, skipped="over budget"))
        return
    try:
        out = fn()
        sync()
        if check is not None:
            extra.update(check(out))
        del out
        ms = bench(fn)
        record(case, direction, variant, ms, nbytes, copy_tbps, extra)
    except Exception as e:  # noqa: BLE001
        msg = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
        record(case, direction, variant, None, nbytes, copy_tbps, dict(extra, error=msg))
        if "CUDA error" in str(e) or "illegal" in str(e).lower():
            raise Sticky(msg) from e
        if os.environ.get("SWEEP_TRACEBACK"):
            traceback.print_exc()


def host_us(fn, n=200) -> float:
    """Host time per call (no sync inside; the GPU keeps up at these sizes)."""
    fn()
    sync()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    dt = time.perf_counter() - t
    sync()
    return round(dt / n * 1e6, 1)


def graph_ms(fn, n=20) -> float:
    """GPU-only time per call: n calls captured in one CUDA graph, replay timed."""
    fn()
    sync()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(n):
            fn()
    return bench(graph.replay) / n


def sweep_case(c, copy_tbps, budget, fla, plan):
    from kernel_fun import cconv
    from kernel_fun.cconv._kernels import bwd as B_
    from kernel_fun.cconv._kernels import fwd as F_
    from kernel_fun.cconv._kernels.bwd import conv_bwd
    from kernel_fun.cconv._kernels.fwd import conv_fwd

    x, w, dy, cu = c["x"], c["w"], c["dy"], c["cu"]
    B, T, D = c["B"], c["T"], c["D"]
    n = B * T * D
    fb, bb = 2 * n * x.element_size(), 3 * n * x.element_size()
    t = time.time()
    y_ref, dx_ref, dw_ref = reference(c)
    log(f"{c['name']}: reference in {time.time() - t:.1f} s")

    def chk_y(y):
        e = rel(y, y_ref)
        return dict(err_y=e, bad=e > 5e-3)

    def chk_b(out):
        dx, dw = out[0], out[1]
        ex, ew = rel(dx, dx_ref), rel(dw, dw_ref)
        return dict(err_dx=ex, err_dw=ew, bad=ex > 8e-3 or ew > 1e-3)

    fwd = lambda: conv_fwd(x, w, None, True, cu)  # noqa: E731  (the default pick, fwd.use_tma)
    fwd_ptr = lambda: conv_fwd(x, w, None, True, cu, tma=False)  # noqa: E731
    fwd_tma = lambda: conv_fwd(x, w, None, True, cu, tma=True)  # noqa: E731
    bwd = lambda: conv_bwd(x, w, None, dy, True, cu)  # noqa: E731
    dev = x.device

    if plan.get("defaults", True):
        # 1. defaults: autotuned (compiles every config), public entry, fla.
        run_variant(c, "fwd", "default(autotuned)", fwd, chk_y, fb, copy_tbps, budget,
                    dict(chunk=chunk_desc("fwd", None, B, T, D, dev, tma=F_.use_tma(x))))
        best = F_._TMA_CONFIG if F_.use_tma(x) else getattr(F_.conv_fwd_kernel, "best_config", None)
        ROWS[-1]["autotune_pick"] = cfg_name(best) if best is not None else None
        run_variant(c, "bwd", "default(autotuned)", bwd, chk_b, bb, copy_tbps, budget,
                    dict(chunk=chunk_desc("bwd", None, B, T, D, dev)))
        best = getattr(B_.conv_bwd_kernel, "best_config", None)
        ROWS[-1]["autotune_pick"] = cfg_name(best) if best is not None else None
        xg, wg = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        kw = dict(activation="silu", cu_seqlens=cu)
        pub_fwd = lambda: cconv.causal_conv1d(xg, wg, **kw)[0]  # noqa: E731
        run_variant(c, "fwd", "public cconv.causal_conv1d", pub_fwd, chk_y, fb, copy_tbps, budget)
        y_pub = pub_fwd()
        run_variant(c, "bwd", "public autograd.grad", lambda: torch.autograd.grad(y_pub, (xg, wg), dy, retain_graph=True),
                    chk_b, bb, copy_tbps, budget)
        if fla is not None:
            fla_fwd = lambda: fla(xg, wg, backend="triton", **kw)[0]  # noqa: E731
            run_variant(c, "fwd", "fla", fla_fwd, chk_y, fb, copy_tbps, budget)
            y_f = fla_fwd()
            run_variant(c, "bwd", "fla", lambda: torch.autograd.grad(y_f, (xg, wg), dy, retain_graph=True),
                        None, bb, copy_tbps, budget)  # fla's varlen dw differs; time only
            del y_f
        del y_pub

        if c["name"] == "latency":  # where does the time go: host vs GPU
            info = {}
            probes = [("graph_ms_fwd", lambda: graph_ms(fwd)), ("graph_ms_bwd", lambda: graph_ms(bwd)),
                      ("cpu_us_fwd_launcher", lambda: host_us(fwd)), ("cpu_us_bwd_launcher", lambda: host_us(bwd)),
                      ("cpu_us_fwd_public_grad", lambda: host_us(pub_fwd))]
            if fla is not None:
                probes.append(("cpu_us_fwd_fla", lambda: host_us(lambda: fla(xg, wg, backend="triton", activation="silu"))))
            for key, probe in probes:
                try:
                    info[key] = probe()
                except Exception as e:  # noqa: BLE001
                    info[key] = f"{type(e).__name__}: {str(e)[:200]}"
            try:
                with torch.no_grad():
                    info["cpu_us_fwd_public_nograd"] = host_us(lambda: cconv.causal_conv1d(x, w, activation="silu"))
            except Exception as e:  # noqa: BLE001
                info["cpu_us_fwd_public_nograd"] = f"{type(e).__name__}: {str(e)[:200]}"
            ROWS.append(dict(case=c["name"], dir="info", variant="host_vs_gpu", **info))
            log(f"latency host/GPU split: {info}")

    # 2. forced scan configs x grid sizings.
    for d, configs, run, chk, nbytes in (("fwd", F_._FWD_CONFIGS + F_._FWD_CANDIDATES, fwd_ptr, chk_y, fb),
                                         ("bwd", B_._BWD_CONFIGS + B_._BWD_CANDIDATES, bwd, chk_b, bb)):
        if d not in plan.get("dirs", ("fwd", "bwd")):
            continue
        for i, cfg in enumerate(configs):
            if plan.get(f"{d}_cfgs") is not None and i not in plan[f"{d}_cfgs"]:
                continue
            for chunk in plan[f"{d}_chunks"]:
                name = f"scan[{cfg_name(cfg)}] chunk={chunk}"
                with forced(**{f"{d}_cfg": cfg, f"{d}_chunk": chunk}):
                    run_variant(c, d, name, run, chk, nbytes, copy_tbps, budget,
                                dict(config=cfg_name(cfg), chunk=chunk_desc(d, chunk, B, T, D, dev)))
        if d == "fwd" and plan.get("tma", True) and F_.tma_ok(x):
            # the TMA forward (fwd._TMA_CONFIG, then _TMA_CANDIDATES): each config at each sizing
            for i, cfg in enumerate([F_._TMA_CONFIG] + F_._TMA_CANDIDATES):
                if plan.get("tma_cfgs") is not None and i not in plan["tma_cfgs"]:
                    continue
                for chunk in plan["fwd_chunks"]:
                    name = f"tma[{cfg_name(cfg)}] chunk={chunk}"
                    saved = F_._TMA_CONFIG
                    F_._TMA_CONFIG = cfg
                    try:
                        with forced(fwd_chunk=chunk):
                            run_variant(c, d, name, fwd_tma, chk, nbytes, copy_tbps, budget,
                                        dict(config="tma:" + cfg_name(cfg), chunk=chunk_desc(d, chunk, B, T, D, dev)))
                    finally:
                        F_._TMA_CONFIG = saved


# Grid sizings per case: (max_rows, warps_per_sm, min_rows) or ONE_WAVE.
BIG_FWD = [(64, 32, 16), (128, 32, 16), (256, 32, 16), (1024, 32, 16), ONE_WAVE]
BIG_BWD = [(128, 16, 32), (256, 16, 32), (512, 16, 32), (1024, 16, 32), ONE_WAVE]
PLANS = {
    "prod2048": dict(fwd_chunks=BIG_FWD, bwd_chunks=BIG_BWD),
    "latency": dict(fwd_chunks=[(256, 32, 16), (256, 32, 64), ONE_WAVE],
                    bwd_chunks=[(512, 16, 32), (512, 16, 128), ONE_WAVE]),
    "prod4096": dict(fwd_chunks=[(64, 32, 16), (128, 32, 16), (256, 32, 16), ONE_WAVE],
                     bwd_chunks=[(256, 16, 32), (512, 16, 32), ONE_WAVE]),
    "slice": dict(fwd_chunks=[(128, 32, 16), (256, 32, 16), ONE_WAVE],
                  bwd_chunks=[(256, 16, 32), (512, 16, 32), ONE_WAVE]),
    # varlen compiles its own kernels (IS_VARLEN): a few forced configs only, no autotuning.
    # every config at three sizings (the 2026-11-30 sweep forced two per direction there; the
    # first round's one-wave sizing had measured a faster backward, 0.539 ms)
    "varlen": dict(fwd_chunks=[(128, 32, 16), (256, 32, 16), ONE_WAVE],
                   bwd_chunks=[(512, 16, 32), (2048, 16, 32), ONE_WAVE], defaults=False),
}


def copy_ceiling() -> dict:
    if SMOKE:
        return dict(copy_ms=1.0, copy_TBps=1.0)
    src = torch.empty(2 ** 32, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = bench(lambda: dst.copy_(src))
    del src, dst
    torch.cuda.empty_cache()
    return dict(copy_ms=round(ms, 4), copy_TBps=round(2 * 2 ** 32 / ms / 1e9, 3))


def summary():
    keys = []
    for r in ROWS:
        if r["dir"] != "info" and (r["case"], r["dir"]) not in keys:
            keys.append((r["case"], r["dir"]))
    for case, d in keys:
        rows = sorted((r for r in ROWS if r["case"] == case and r["dir"] == d and r.get("ms")),
                      key=lambda r: r["ms"])
        print(f"\n=== {case} {d}: {len(rows)} timed, fastest first", flush=True)
        for r in rows[:25]:
            ch = r.get("chunk")
            chs = f" rows={ch['rows']} n={ch['n_chunks']}" if isinstance(ch, dict) else ""
            err = " ".join(f"{k[4:]}={r[k]:.1e}" for k in ("err_y", "err_dx", "err_dw") if r.get(k) is not None)
            print(f"  {r['ms']:8.4f} ms {r['TBps']:6.3f} TB/s {r['pct_copy']:5.1f}%  {r['variant']}{chs} {err}"
                  f"{' BAD' if r.get('bad') else ''}", flush=True)
        failed = [r for r in ROWS if r["case"] == case and r["dir"] == d and r.get("error")]
        for r in failed:
            print(f"  FAILED {r['variant']}: {r['error']}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--cases", default="prod2048,latency,prod4096,slice,varlen")
    ap.add_argument("--budget", type=float, default=225.0, help="seconds; later variants are skipped")
    ap.add_argument("--no-fla", action="store_true")
    ap.add_argument("--dirs", default="fwd,bwd", help="forced-config directions to sweep (fwd, bwd)")
    ap.add_argument("--no-defaults", action="store_true", help="skip the autotuned, public and fla rows")
    ap.add_argument("--fwd-rows", default="", help="forward chunk sizes to force instead of the plan's, e.g. 48,64,96")
    ap.add_argument("--no-tma", action="store_true", help="skip the TMA forward variants")
    ap.add_argument("--tma-only", default="", help="indices into [_TMA_CONFIG] + _TMA_CANDIDATES to force")
    ap.add_argument("--fwd-only", default="", help="indices into _FWD_CONFIGS + _FWD_CANDIDATES to force, e.g. 0,4,5")
    ap.add_argument("--smoke", action="store_true", help="tiny CPU run under TRITON_INTERPRET=1")
    a = ap.parse_args()
    global DEV, SMOKE
    if a.smoke:
        DEV, SMOKE = "cpu", True
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
    try:
        sha = os.environ.get("KERNEL_FUN_GIT_SHA") or subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except Exception:  # noqa: BLE001
        sha = "unknown"
    meta = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                gpu=torch.cuda.get_device_name() if DEV == "cuda" else "cpu (smoke)", torch=torch.__version__, triton=triton.__version__,
                git_sha=sha or "unknown", timing="do_bench warmup=25 rep=100 median",
                shapes="bf16 x, fp32 weight [D,4], no bias, silu")
    ceil = copy_ceiling()
    log(f"{meta} copy ceiling {ceil}")
    fla = None if a.no_fla else fla_conv()

    def dump():
        with open(a.out, "w") as f:
            json.dump(dict(meta=meta, ceiling=ceil, rows=ROWS), f, indent=1, default=str)

    try:
        for name in a.cases.split(","):
            log(f"=== case {name}")
            try:
                c = make_case(name)
                plan = dict(PLANS[name], dirs=tuple(a.dirs.split(",")))
                if a.no_defaults:
                    plan["defaults"] = False
                if a.fwd_rows:
                    plan["fwd_chunks"] = [(int(r), 32, 16) for r in a.fwd_rows.split(",")]
                if a.no_tma:
                    plan["tma"] = False
                if a.tma_only:
                    plan["tma_cfgs"] = [int(i) for i in a.tma_only.split(",")]
                if a.fwd_only:
                    plan["fwd_cfgs"] = [int(i) for i in a.fwd_only.split(",")]
                sweep_case(c, ceil["copy_TBps"], a.budget, fla, plan)
            except Sticky as e:
                log(f"sticky CUDA error, stopping: {e}")
                break
            except Exception as e:  # noqa: BLE001
                log(f"case {name} failed: {type(e).__name__}: {e}")
                traceback.print_exc()
            finally:
                c = None
                if DEV == "cuda":
                    torch.cuda.empty_cache()
                dump()
    finally:
        dump()
        summary()
        log(f"wrote {a.out}")


if __name__ == "__main__":
    main()
