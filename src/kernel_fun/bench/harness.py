"""The side-by-side harness behind `kernel-fun bench`, reused by every family.

A family module (``kernel_fun.bench.<family>``) provides ``cases(overrides) -> list[Case]``;
each case builds its inputs once and returns callables for ours and fla's per direction.
The harness times them (median of ``triton.testing.do_bench``), observes that our kernels ran
(the package's launch counter), measures the card's ceilings in the same run, prints a table
and writes one JSON record.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Callable

WARMUP_MS = 50
REP_MS = 300


@dataclass
class Direction:
    """One timed direction of a case: ``ours`` and ``fla`` are zero-argument callables."""

    name: str  # "fwd" | "bwd" | "fwdbwd"
    ours: Callable
    fla: Callable | None
    nbytes: float = 0.0  # fewest bytes the direction must move (for TB/s)
    flops: float = 0.0  # for TFLOP/s where the op is compute-bound
    extra: dict = field(default_factory=dict)


@dataclass
class Case:
    family: str
    case: str
    shape: dict
    directions: list  # of Direction
    witness: tuple  # launch-counter prefixes that prove our kernels ran, e.g. ("cconv.",)
    note: str = ""


def _median_ms(fn) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=WARMUP_MS, rep=REP_MS, return_mode="median"))


def _copy_ms(n: int) -> float:
    import torch

    src = torch.empty(n, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    return _median_ms(lambda: dst.copy_(src))


def _matmul_ms(n: int) -> float:
    import torch

    a = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    return _median_ms(lambda: a @ b)


def measure_ceilings() -> dict:
    """A 4 GiB device copy (bytes read + written) and an 8192^3 bf16 matmul, this run."""
    import torch

    n = 1 << 31  # 2 Gi bf16 elements = 4 GiB
    copy_ms = _copy_ms(n)
    mm_ms = _matmul_ms(8192)
    torch.cuda.empty_cache()
    return {
        "copy_TBps": round(2 * n * 2 / copy_ms / 1e9, 3),
        "copy_ms": round(copy_ms, 4),
        "bf16_matmul_TFLOPs": round(2 * 8192**3 / mm_ms / 1e9, 1),
        "bf16_matmul_ms": round(mm_ms, 4),
    }


def _git_sha() -> str:
    if os.environ.get("KERNEL_FUN_GIT_SHA"):  # a copy of the tree without .git (the GPU runner)
        return os.environ["KERNEL_FUN_GIT_SHA"]
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=here,
                             capture_output=True, text=True, timeout=10)
        sha = out.stdout.strip() or "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except Exception:
        return os.environ.get("KERNEL_FUN_GIT_SHA", "unknown")


def run_case(case: Case, ceilings: dict) -> list[dict]:
    from .._common.witness import launches

    rows = []
    def counted():
        return sum(launches(p) for p in case.witness)

    for d in case.directions:
        before = counted()
        d.ours()  # warm (compile/autotune) outside the timing, and witness
        engaged = counted() > before
        ours_ms = _median_ms(d.ours)
        fla_ms = _median_ms(d.fla) if d.fla is not None else None
        row = {"family": case.family, "case": case.case, "shape": case.shape, "direction": d.name,
               "ours_ms": round(ours_ms, 4), "fla_ms": None if fla_ms is None else round(fla_ms, 4),
               "speedup": None if fla_ms is None else round(fla_ms / ours_ms, 3), "engaged": engaged}
        if d.nbytes:
            tbps = d.nbytes / ours_ms / 1e9
            row["TBps"] = round(tbps, 3)
            row["pct_of_copy"] = round(100 * tbps / ceilings["copy_TBps"], 1)
            row["floor_ms"] = round(d.nbytes / ceilings["copy_TBps"] / 1e9, 4)
        if d.flops:
            tf = d.flops / ours_ms / 1e9
            row["TFLOPs"] = round(tf, 1)
            row["pct_of_matmul"] = round(100 * tf / ceilings["bf16_matmul_TFLOPs"], 1)
        row.update(d.extra)
        if case.note:
            row["note"] = case.note
        rows.append(row)
        print(_format_row(row), flush=True)
    return rows


def _format_row(r: dict) -> str:
    fla = f"{r['fla_ms']:8.3f}" if r["fla_ms"] is not None else "       -"
    sp = f"{r['speedup']:6.2f}x" if r["speedup"] is not None else "      -"
    rate = ""
    if "TBps" in r:
        rate = f"{r['TBps']:6.2f} TB/s ({r['pct_of_copy']:5.1f}% of copy)"
    elif "TFLOPs" in r:
        rate = f"{r['TFLOPs']:6.1f} TFLOP/s ({r['pct_of_matmul']:5.1f}% of matmul)"
    eng = "" if r["engaged"] else "  NOT ENGAGED"
    return f"{r['family']:6s} {r['case']:22s} {r['direction']:7s} {r['ours_ms']:8.3f} {fla} {sp}  {rate}{eng}"


def header() -> str:
    return f"{'family':6s} {'case':22s} {'dir':7s} {'ours ms':>8s} {'fla ms':>8s} {'speedup':>7s}  achieved"


def record(rows: list[dict], ceilings: dict, extra: dict | None = None) -> dict:
    import torch

    from .. import versions

    rec = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(),
        "versions": versions(),
        "git_sha": _git_sha(),
        "timing": {"method": "triton.testing.do_bench median", "warmup_ms": WARMUP_MS, "rep_ms": REP_MS},
        "ceilings": ceilings,
        "rows": rows,
    }
    if extra:
        rec.update(extra)
    return rec


def default_record_path(rec: dict) -> str:
    day = rec["date"][:10]
    gpu = rec["gpu"].replace("NVIDIA ", "").replace(" ", "-").lower()
    root = os.environ.get("KERNEL_FUN_RECORDS", os.path.join(os.getcwd(), "bench", "records"))
    return os.path.join(root, f"{day}-{gpu}-{rec['git_sha']}.json")


def write_record(rec: dict, path: str | None) -> str:
    path = path or default_record_path(rec)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(rec, f, indent=1)
    print(f"record: {path}", file=sys.stderr)
    return path
