"""The side-by-side harness behind `kernel-fun bench`, reused by every family.

A family module (``kernel_fun.bench.<family>``) declares:

- ``CASES``: the case names, in order; ``SHAPE_KEYS``: ``{key: what}`` that ``--shape`` accepts;
- ``cases(overrides) -> [(name, build)]``: each ``build()`` makes its inputs once and returns a
  ``Case`` with callables for ours and fla's per direction;
- ``KERNELS``: ``{witness name: what}``, every shipped kernel of the family, and
  ``check(device) -> [failure]``, the interpreted correctness check behind ``kernel-fun check``,
  which must launch each of them (``check_family`` prints one line per kernel);
- ``probes(device, shape) -> [Probe]``: each shipped kernel as its chain launches it, beside its
  stage reference, at ``STAGE_SHAPES["cuda" | "cpu"]`` (``STAGED_WITH``: a kernel that runs
  inside another's probe), what ``bench --stages`` forces every config of (``stages.py``) and,
  for kda, gdn and gnorm, what ``check`` runs.

The harness times each direction (median of ``triton.testing.do_bench``), its host time per
call (``host_us``) and its kernels' own GPU time (``kernel_ms``, from torch.profiler; a row whose
host time reaches its median is marked host-bound), observes that our kernels ran (the package's
launch counter), measures the card's ceilings in the same run, prints a table and writes one JSON
record.
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
HOST_CALLS = 10  # calls per burst: few enough that the launch queue never fills and blocks
HOST_BURSTS = 30
HOST_MIN_BURSTS = 5
HOST_BUDGET_MS = 3000  # GPU time the bursts of one host column may take: a 30 ms call gets 10
HOST_BOUND_FRACTION = 0.9  # a row whose host time a call is at least this much of its kernels' time (or its timed median)


class UsageError(ValueError):
    """A bench/check request that does not fit a family (the CLI prints it, exit 2)."""


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


def median_ms(fn) -> float:
    """The median of ``triton.testing.do_bench`` (ms) after its warmup: every bench row's time."""
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=WARMUP_MS, rep=REP_MS, return_mode="median"))


def stage_profile(fn, reps: int = 3) -> dict:
    """Kernel time per kernel name (ms per call) over ``reps`` calls, from torch.profiler."""
    import torch

    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    table = {}
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t:
            table[e.key] = round(t / 1e3 / reps, 4)
    return dict(sorted(table.items(), key=lambda kv: -kv[1]))


def kernel_ms(fn) -> float:
    """The GPU time of the kernels one call of ``fn`` launches (ms, from ``stage_profile``): beside a
    row's timed median, what of it is kernels; the rest is the GPU waiting, for the host or between
    launches (a host-bound row's timed median is its host's time, not its kernels')."""
    return round(sum(stage_profile(fn).values()), 4)


def _copy_ms(n: int) -> float:
    import torch

    src = torch.empty(n, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    return median_ms(lambda: dst.copy_(src))


def _matmul_ms(n: int) -> float:
    import torch

    a = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    return median_ms(lambda: a @ b)


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


def host_bursts(gpu_ms: float, calls: int = HOST_CALLS) -> int:
    """Bursts for a call of ``gpu_ms``: ``HOST_BURSTS``, fewer (down to ``HOST_MIN_BURSTS``) where
    that many would keep the GPU busy for more than ``HOST_BUDGET_MS`` (each burst waits for its
    calls to drain), so that a slow call's host column costs seconds, not a minute."""
    return max(HOST_MIN_BURSTS, min(HOST_BURSTS, int(HOST_BUDGET_MS / max(gpu_ms * calls, 1e-9))))


def host_us(fn, calls: int = HOST_CALLS, bursts: int = HOST_BURSTS) -> float:
    """Host time per call in microseconds: the wall time of ``calls`` back-to-back calls
    without a sync, from an idle GPU, divided by ``calls``; the median over ``bursts``.

    The GPU works through each burst while the host enqueues it, so on a problem whose calls
    take longer on the GPU than on the host, what is timed is the host's Python, dispatch and
    launch cost alone (the queue never fills: ``calls`` is far below its depth).
    """
    import statistics
    import time

    import torch

    per_call = []
    for _ in range(bursts):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per_call.append((time.perf_counter() - t0) * 1e6 / calls)
    torch.cuda.synchronize()
    return statistics.median(per_call)


def check_request(family: str, module, overrides: dict) -> None:
    """Raise ``UsageError`` (one line) for a ``--shape`` key the family does not take or a value
    that is not an integer (the family's ``TEXT_KEYS`` excepted). Called before anything runs."""
    keys = getattr(module, "SHAPE_KEYS", None)
    if not overrides:
        return
    if keys is None:
        raise UsageError(f"--shape: {family} declares no shape keys")
    bad = [k for k in overrides if k not in keys]
    if bad:
        raise UsageError(f"--shape: {', '.join(bad)} does not fit {family} (its keys: {', '.join(keys)});"
                         f" pick the family with --family")
    for k, v in overrides.items():
        if k not in getattr(module, "TEXT_KEYS", ()) and not v.isdigit():
            raise UsageError(f"--shape: {k}={v!r} for {family} must be a non-negative integer")


def check_cases(known: dict, only: list | None) -> None:
    """``UsageError`` for a ``--case`` that no selected family has (``known``: family -> names)."""
    every = {n for names in known.values() for n in names}
    unknown = [c for c in only or () if c not in every]
    if unknown:
        listing = "; ".join(f"{fam}: {', '.join(names)}" for fam, names in known.items())
        raise UsageError(f"--case: no selected family has {', '.join(unknown)} (cases: {listing})")


def case_names(module) -> list:
    """The family's case names (``CASES``, else the names ``cases()`` lists; builds nothing)."""
    names = getattr(module, "CASES", None)
    return list(names) if names is not None else [name for name, _ in module.cases(None)]


def check_family(family: str, module, device: str, out=print) -> list:
    """Run the family's ``check(device)`` and print one line per kernel: ok, FAILED (with the
    failures naming it) or NOT RUN (a declared kernel the check did not launch). Returns the
    failures. A family without ``KERNELS`` gets a line per kernel that launched and a note that
    its coverage is not verified."""
    from .._common.witness import launch_counts

    before = launch_counts()
    fails = list(module.check(device))
    after = launch_counts()
    ran = {k: after[k] - before.get(k, 0) for k in after if after[k] > before.get(k, 0)}
    declared = getattr(module, "KERNELS", None)
    where = f"{device}{', interpreted' if device == 'cpu' else ''}"
    names = list(declared) if declared is not None else sorted(ran)
    claimed = set()
    for name in names:
        stage = name.split(".", 1)[-1]
        mine = [f for f in fails if f.startswith(name + ":") or f" {stage}:" in f]
        claimed.update(mine)
        what = f" ({declared[name]})" if declared else ""
        if not ran.get(name):
            status = "NOT RUN"
            if declared is not None:
                fails.append(f"{name}: the check did not launch it")
        else:
            status = "ok" if not mine else "FAILED"
        out(f"check {name:24s} {status:8s} {ran.get(name, 0):3d} launches{what}")
        for f in mine:
            out(f"    {f}")
    extra = sorted(k for k in ran if k not in names)
    if extra:
        out(f"check {family}: also launched {', '.join(extra)} (not in its KERNELS)")
    if declared is None:
        out(f"check {family}: declares no KERNELS list; its coverage is not verified")
    for f in fails:
        if f not in claimed and not f.endswith("did not launch it"):
            out(f"  {family}: {f}")
    out(f"check {family}: {'ok' if not fails else 'FAILED'} ({where})")
    return fails


@dataclass
class Probe:
    """One shipped kernel, launched as its family's chain launches it, beside its plain-torch
    stage reference: what ``check()`` runs with the autotuner's pick and ``bench --stages``
    runs with each configuration forced.

    ``run(config)`` launches it (``config=None``: the autotuner's pick) and returns its outputs;
    ``reference()`` returns the expected ones, in the order of ``names``. ``module`` holds the
    kernel's ``<lists>CONFIGS`` / ``<lists>CANDIDATES`` (``lists=None``: one fixed config).
    ``tol``: the largest relative RMS error allowed, one for all outputs or ``{name: tol}``.
    """

    kernel: str  # launch-witness name, e.g. "kda.wy_bwd"
    run: Callable
    reference: Callable
    names: tuple
    tol: float | dict
    module: object = None
    lists: str | None = ""
    label: str = ""  # how failure lines name it (default: ``kernel``)
    note: str = ""

    def __post_init__(self):
        self.label = self.label or self.kernel

    def configs(self) -> list:
        """[(config, "shipped" | "candidate")]; [(None, "fixed")] for a fixed-config kernel."""
        if self.lists is None:
            return [(None, "fixed")]
        shipped = getattr(self.module, self.lists + "CONFIGS")
        candidates = getattr(self.module, self.lists + "CANDIDATES")
        return [(c, "shipped") for c in shipped] + [(c, "candidate") for c in candidates]

    def config_name(self, config) -> str:
        return "fixed" if config is None else self.module.config_name(config)


def probe_errors(probe: Probe, outputs, expected) -> tuple[dict, list]:
    """({output name: relative RMS error}, [failure lines]) of ``outputs`` against ``expected``;
    a NaN error (an unwritten or non-finite element) fails."""
    from .._common.numerics import rel_rms

    errs, fails = {}, []
    for name, a, b in zip(probe.names, outputs, expected):
        err = rel_rms(a.float().cpu(), b.cpu())
        errs[name] = err
        tol = probe.tol[name] if isinstance(probe.tol, dict) else probe.tol
        if not err < tol:
            fails.append(f"{probe.label}: {name} relative error {err:.2e} (tolerance {tol:.0e})")
    return errs, fails


def run_probe(probe: Probe, config=None, expected=None) -> tuple[dict, list]:
    """Launch ``probe`` once (``config`` forced, or the autotuner's pick) and check it: a failure
    when its launch counter did not move or an output is off (see ``probe_errors``)."""
    from .._common.witness import launches

    before = launches(probe.kernel)
    outputs = probe.run(config)
    fails = [] if launches(probe.kernel) > before else [f"{probe.label}: our kernel did not run"]
    errs, bad = probe_errors(probe, outputs, probe.reference() if expected is None else expected)
    return errs, fails + bad


def check_probes(probes) -> list:
    """The failures of each probe run once with the autotuner's pick (a family's ``check()``)."""
    return [f for p in probes for f in run_probe(p)[1]]


def run_case(case: Case, ceilings: dict, on_row: Callable[[dict], None] | None = None) -> list[dict]:
    """Each direction of ``case`` warmed, timed (ours, fla), host-timed, printed; ``on_row`` is
    called with each row as it is made (the CLI rewrites the record there, so a run cut off
    mid-case keeps the directions it measured)."""
    from .._common.witness import launches

    rows = []
    def counted():
        return sum(launches(p) for p in case.witness)

    for d in case.directions:
        before = counted()
        d.ours()  # warm (compile/autotune) outside the timing, and witness
        engaged = counted() > before
        ours_ms = median_ms(d.ours)
        fla_ms = median_ms(d.fla) if d.fla is not None else None
        ours_host = host_us(d.ours, bursts=host_bursts(ours_ms))
        fla_host = host_us(d.fla, bursts=host_bursts(fla_ms)) if d.fla is not None else None
        ours_kernel = kernel_ms(d.ours)
        fla_kernel = kernel_ms(d.fla) if d.fla is not None else None
        row = {"family": case.family, "case": case.case, "shape": case.shape, "direction": d.name,
               "ours_ms": round(ours_ms, 4), "fla_ms": None if fla_ms is None else round(fla_ms, 4),
               "speedup": None if fla_ms is None else round(fla_ms / ours_ms, 3), "engaged": engaged,
               "ours_host_us": round(ours_host, 1),
               "fla_host_us": None if fla_host is None else round(fla_host, 1),
               # the kernels' own time, and whether the host can keep them fed: where it cannot,
               # the timed median is partly the host's (do_bench records its start event before
               # the host issues the call) and moves with the lent machine's host
               "ours_kernel_ms": ours_kernel, "fla_kernel_ms": fla_kernel,
               "kernel_speedup": (round(fla_kernel / ours_kernel, 3)
                                  if fla_kernel is not None and ours_kernel else None),
               "host_bound": ours_host / 1e3 >= HOST_BOUND_FRACTION * min(ours_ms, ours_kernel or ours_ms)}
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
        if on_row is not None:
            on_row(row)
    return rows


def _format_row(r: dict) -> str:
    fla = f"{r['fla_ms']:8.3f}" if r["fla_ms"] is not None else "       -"
    sp = f"{r['speedup']:6.2f}x" if r["speedup"] is not None else "      -"
    rate = ""
    if "TBps" in r:
        rate = f"{r['TBps']:6.2f} TB/s ({r['pct_of_copy']:5.1f}% of copy)"
    elif "TFLOPs" in r:
        rate = f"{r['TFLOPs']:6.1f} TFLOP/s ({r['pct_of_matmul']:5.1f}% of matmul)"
    eng = ("" if r["engaged"] else "  NOT ENGAGED") + ("  host-bound" if r.get("host_bound") else "")
    if r.get("host_bound") and r.get("kernel_speedup") is not None:  # what the kernels themselves did
        eng += f" (kernels {r['ours_kernel_ms']:.3f} / {r['fla_kernel_ms']:.3f} ms, {r['kernel_speedup']:.2f}x)"
    host = f"{r['ours_host_us']:7.1f} " + (f"{r['fla_host_us']:7.1f}" if r.get("fla_host_us") is not None else "      -")
    return (f"{r['family']:6s} {r['case']:22s} {r['direction']:7s} {r['ours_ms']:8.3f} {fla} {sp} {host}"
            f"  {rate}{eng}")


def header() -> str:
    return (f"{'family':6s} {'case':22s} {'dir':7s} {'ours ms':>8s} {'fla ms':>8s} {'speedup':>7s} "
            f"{'host us':>7s} {'fla':>7s}  achieved")


def record(rows: list[dict], ceilings: dict, extra: dict | None = None) -> dict:
    import torch

    from .. import versions

    rec = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu-interpreted",
        "versions": versions(),
        "git_sha": _git_sha(),
        "timing": {"method": "triton.testing.do_bench median", "warmup_ms": WARMUP_MS, "rep_ms": REP_MS,
                   "host_us": f"median over {HOST_BURSTS} bursts (fewer, down to {HOST_MIN_BURSTS}, where they "
                              f"would keep the GPU busy over {HOST_BUDGET_MS} ms) of the wall time of "
                              f"{HOST_CALLS} calls without sync (from an idle GPU) per call",
                   "kernel_ms": "the kernels' own GPU time a call (torch.profiler, 3 calls), kernel_speedup fla's over "
                                "ours; host_bound: the host time a call is at least "
                                f"{HOST_BOUND_FRACTION:.0%} of the kernels' time (or of the timed median)"},
        "ceilings": ceilings,
        "rows": rows,
    }
    if extra:
        rec.update(extra)
    return rec


def default_record_path(rec: dict, tag: str = "") -> str:
    """``bench/records/<date>-<gpu>[-<tag>]-<sha>.json`` (``KERNEL_FUN_RECORDS`` replaces the folder)."""
    day = rec["date"][:10]
    gpu = rec["gpu"].replace("NVIDIA ", "").replace(" ", "-").lower()
    root = os.environ.get("KERNEL_FUN_RECORDS", os.path.join(os.getcwd(), "bench", "records"))
    return os.path.join(root, f"{day}-{gpu}{'-' + tag if tag else ''}-{rec['git_sha']}.json")


def write_record(rec: dict, path: str | None, announce: bool = True) -> str:
    path = path or default_record_path(rec)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(rec, f, indent=1)
    if announce:
        print(f"record: {path}", file=sys.stderr)
    return path
