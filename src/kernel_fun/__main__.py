"""`kernel-fun` / `python -m kernel_fun`: doctor | bench | check."""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys

# The families, in the order doctor reports them; a family is present once its package exists.
FAMILY_MODULES = {
    "cconv": "kernel_fun.cconv",
    "kda": "kernel_fun.kda",
    "gdn": "kernel_fun.gdn",
    "gnorm": "kernel_fun.gnorm",
}


def present_families() -> list[str]:
    return [f for f, m in FAMILY_MODULES.items() if importlib.util.find_spec(m) is not None]


def doctor() -> int:
    """Print versions, the device, each family's verdict on this machine and the drift check.

    Exit 0 on a healthy machine (GPU or not); 1 when fla is missing; 2 when fla drifted.
    """
    from . import versions
    from ._common import gate, hardware, switches

    v = versions()
    print(f"kernel-fun {v['kernel_fun']}")
    for name in ("python", "torch", "triton", "fla"):
        print(f"  {name:8s} {v[name] or 'not installed'}")
    print(f"  {'cuda':8s} {v['cuda'] or ('none (a CPU build of torch)' if v['torch'] else '-')}")
    print(f"  {'device':8s} {v['device'] or 'no CUDA device'}")

    status = 0
    drift_line = "ok"
    try:
        from ._common import compat

        st = compat.check_fla()
        if st.problems:  # reached only under KERNEL_FUN_FALLBACK=1
            drift_line, status = "DRIFT: " + "; ".join(st.problems), 2
        elif not st.tested:
            drift_line = f"fla {st.version} is outside the tested set {compat.TESTED_FLA_VERSIONS}"
        else:
            drift_line = f"ok (fla {st.version} is a tested version)"
    except ImportError as exc:
        drift_line, status = f"FAILED: {exc}", 1
    except RuntimeError as exc:  # FlaDriftError
        drift_line, status = f"DRIFT: {exc}", 2
    print(f"fla drift check: {drift_line}")

    print("families:")
    for fam in present_families():
        if status:
            print(f"  {fam:6s} would fall back: fla unusable (see above)")
            continue
        try:
            ok, reason = gate.decide(fam, hardware.machine_gate)
        except Exception as exc:  # doctor reports, it does not crash
            ok, reason = False, f"{type(exc).__name__}: {exc}"
        verdict = "would engage" if ok else f"would fall back to fla: {reason}"
        if ok and reason:
            verdict += f" ({reason})"
        print(f"  {fam:6s} {verdict}")
    switches = {k: v for k, v in os.environ.items() if k.startswith("KERNEL_FUN_")}
    if switches:
        print("switches: " + ", ".join(f"{k}={v}" for k, v in sorted(switches.items())))
    unknown = switches.unknown_variables()
    if unknown:
        print("ignored (no such switch): " + ", ".join(unknown))
    if status:
        print("doctor: unhealthy", file=sys.stderr)
    return status


# Families with a benchmark/check module under kernel_fun.bench.
BENCH_FAMILIES = [f for f in FAMILY_MODULES if importlib.util.find_spec(f"kernel_fun.bench.{f}") is not None]


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def check(families: list[str]) -> int:
    """The interpreted correctness check of every family present, at small shapes, against
    the references. Exit 0 when all pass."""
    import importlib

    device = "cuda" if _has_cuda() else "cpu"
    if device == "cpu":
        # Before any kernel module is imported: triton.jit reads it at decoration time.
        os.environ["TRITON_INTERPRET"] = "1"
    failures = []
    for fam in families:
        mod = importlib.import_module(f"kernel_fun.bench.{fam}")
        fails = mod.check(device)
        print(f"check {fam}: {'ok' if not fails else 'FAILED'} ({device}"
              f"{', interpreted' if device == 'cpu' else ''})")
        for f in fails:
            print(f"  {f}")
        failures += fails
    return 1 if failures else 0


def bench(families: list[str], overrides: dict, json_path: str | None, only: list[str] | None = None) -> int:
    """Ours and fla's side by side on this GPU; on a machine without CUDA, the check instead."""
    import importlib

    if not _has_cuda():
        print("kernel-fun bench: timings need a CUDA GPU; none here, so running `kernel-fun check` "
              "(the interpreted correctness check) instead.")
        return check(families)
    import torch

    from .bench import harness

    ceilings = harness.measure_ceilings()
    print(f"ceilings: copy {ceilings['copy_TBps']} TB/s, bf16 matmul {ceilings['bf16_matmul_TFLOPs']} TFLOP/s",
          flush=True)
    print(harness.header(), flush=True)
    rows = []
    rec = harness.record(rows, ceilings)  # rows fill in place; rewritten after every case, so
    for fam in families:                  # an interrupted run keeps what it measured
        mod = importlib.import_module(f"kernel_fun.bench.{fam}")
        for name, build in mod.cases(overrides):
            if only and name not in only:
                continue
            rows += harness.run_case(build(), ceilings)
            torch.cuda.empty_cache()
            json_path = harness.write_record(rec, json_path)
    if not rows:  # no case selected: still leave the (empty) record with its ceilings
        harness.write_record(rec, json_path)
    return 0 if all(r["engaged"] for r in rows) else 3


def _parse_shape(text: str | None) -> dict:
    if not text:
        return {}
    out = {}
    for part in text.split(","):
        key, _, value = part.partition("=")
        if not key or not value:
            raise SystemExit(f"--shape: expected KEY=VALUE[,KEY=VALUE...], got {text!r}")
        out[key.strip()] = value.strip()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kernel-fun", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("doctor", help="versions, device, which families would engage here, fla drift")
    for name, text in (("bench", "ours vs fla side by side on the GPU (the check without one)"),
                       ("check", "interpreted correctness check of every family, small shapes")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--family", action="append", choices=BENCH_FAMILIES,
                       help="restrict to a family (repeatable); default: all present")
        if name == "bench":
            p.add_argument("--shape", help="override the production shapes, e.g. B=8,T=4096,D=2048")
            p.add_argument("--json", help="record path (default bench/records/<date>-<gpu>-<sha>.json)")
            p.add_argument("--case", action="append", help="run only this case (repeatable)")
    args = parser.parse_args(argv)
    if args.command == "doctor":
        return doctor()
    families = args.family or BENCH_FAMILIES
    if args.command == "check":
        return check(families)
    if args.command == "bench":
        return bench(families, _parse_shape(args.shape), args.json, args.case)
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
