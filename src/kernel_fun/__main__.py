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
    from ._common import support

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
            ok, reason = support.decide(fam, support.machine_gate)
        except Exception as exc:  # doctor reports, it does not crash
            ok, reason = False, f"{type(exc).__name__}: {exc}"
        verdict = "would engage" if ok else f"would fall back to fla: {reason}"
        if ok and reason:
            verdict += f" ({reason})"
        print(f"  {fam:6s} {verdict}")
    switches = {k: v for k, v in os.environ.items() if k.startswith("KERNEL_FUN_")}
    if switches:
        print("switches: " + ", ".join(f"{k}={v}" for k, v in sorted(switches.items())))
    unknown = support.unknown_variables()
    if unknown:
        print("ignored (no such switch): " + ", ".join(unknown))
    if status:
        print("doctor: unhealthy", file=sys.stderr)
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kernel-fun", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("doctor", help="versions, device, which families would engage here, fla drift")
    args = parser.parse_args(argv)
    if args.command == "doctor":
        return doctor()
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
