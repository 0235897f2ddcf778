"""`kernel-fun` / `python -m kernel_fun`: doctor | bench [--model | --stages] | check [--lower]."""
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
            ok, reason = gate.decide(fam, lambda f=fam: hardware.machine_gate(f))
        except Exception as exc:  # doctor reports, it does not crash
            ok, reason = False, f"{type(exc).__name__}: {exc}"
        verdict = "would engage" if ok else f"would fall back to fla: {reason}"
        if ok and reason:
            verdict += f" ({reason})"
        print(f"  {fam:6s} {verdict}")
    set_vars = {k: v for k, v in os.environ.items() if k.startswith("KERNEL_FUN_")}
    if set_vars:
        print("switches: " + ", ".join(f"{k}={v}" for k, v in sorted(set_vars.items())))
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
    the references: one line per kernel. Exit 0 when all pass."""
    import importlib

    device = "cuda" if _has_cuda() else "cpu"
    if device == "cpu":
        # Before any kernel module is imported: triton.jit reads it at decoration time.
        os.environ["TRITON_INTERPRET"] = "1"
    from .bench.harness import check_family

    failures = []
    for fam in families:
        failures += check_family(fam, importlib.import_module(f"kernel_fun.bench.{fam}"), device)
    return 1 if failures else 0


def _selected_cases(families, overrides, only):
    """[(family, module, [(name, build)])] for the request; ``UsageError`` when it does not fit."""
    import importlib

    from .bench.harness import check_cases, check_request

    out, known = [], {}
    for fam in families:
        mod = importlib.import_module(f"kernel_fun.bench.{fam}")
        check_request(fam, mod, overrides)
        cases = mod.cases(overrides)
        known[fam] = [n for n, _ in cases]
        out.append((fam, mod, [(n, b) for n, b in cases if not only or n in only]))
    check_cases(known, only)
    return out


def bench(families: list[str], overrides: dict, json_path: str | None, only: list[str] | None = None) -> int:
    """Ours and fla's side by side on this GPU; on a machine without CUDA, the check instead.
    A request that does not fit a family is refused before anything runs."""
    selected = _selected_cases(families, overrides, only)
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
    rec = harness.record(rows, ceilings)  # rows fill in place; the record is rewritten after
                                          # every row, so an interrupted run keeps what it measured

    def keep(row):
        nonlocal json_path
        rows.append(row)
        json_path = harness.write_record(rec, json_path, announce=len(rows) == 1)

    for fam, mod, cases in selected:
        for name, build in cases:
            harness.run_case(build(), ceilings, on_row=keep)
            torch.cuda.empty_cache()
    return 0 if all(r["engaged"] for r in rows) else 3


def stages(family: str, device: str | None, overrides: dict, json_path: str | None, kernels, configs=None) -> int:
    """``bench --stages FAMILY``: every config of every shipped kernel of the family forced, checked
    against its stage reference and timed (``kernel_fun.bench.stages``); interpreted and untimed
    on a machine without CUDA or with ``--device cpu``."""
    from .bench.harness import UsageError

    if device == "cuda" and not _has_cuda():
        raise UsageError("--device cuda: no CUDA device here")
    device = device or ("cuda" if _has_cuda() else "cpu")
    if device == "cpu":
        # Before any kernel module is imported: triton.jit reads it at decoration time.
        os.environ["TRITON_INTERPRET"] = "1"
    from .bench import stages as stages_mod

    return stages_mod.run(family, device, overrides, json_path, kernels, configs)


def lower(target: str, jobs: int) -> int:
    """``check --lower TARGET``: every shipped config of every kernel compiled for the target
    (``kernel_fun.bench.lowering``), no GPU needed. Exit 0 when all lower, 1 otherwise."""
    from ._common.tuning import interpreting

    if interpreting():  # interpreted kernels cannot be lowered: the same command in a process without it
        import subprocess

        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        return subprocess.run([sys.executable, "-m", "kernel_fun", "check", "--lower", target, "--jobs", str(jobs)],
                              env=env).returncode
    from .bench import lowering

    targets = list(lowering.TARGETS) if target == "all" else [target]
    for t in targets:
        why = lowering.ptxas_missing(t)
        if why:
            print(f"kernel-fun check --lower: {why}", file=sys.stderr)
            return 1
    print(f"kernel-fun check --lower {target}: every shipped kernel and config that runs there, compiled for "
          f"{', '.join(targets)} (no GPU needed)", flush=True)
    failed = lowering.run(None, "compile", targets, jobs, out=lambda line: print(line, flush=True))
    return 1 if failed else 0


def _parse_shape(text: str | None) -> dict:
    from .bench.harness import UsageError

    if not text:
        return {}
    out = {}
    for part in text.split(","):
        key, _, value = part.partition("=")
        if not key.strip() or not value.strip():
            raise UsageError(f"--shape: expected KEY=VALUE[,KEY=VALUE...], got {text!r}")
        out[key.strip()] = value.strip()
    return out


def _families_help() -> str:
    """The cases and --shape keys of each family, for --help (builds nothing)."""
    import importlib

    from .bench.harness import case_names

    lines = ["families, their cases (--case) and shape keys (--shape):"]
    for fam in BENCH_FAMILIES:
        try:
            mod = importlib.import_module(f"kernel_fun.bench.{fam}")
            names = ", ".join(case_names(mod))
            keys = getattr(mod, "SHAPE_KEYS", None)
            keys = ", ".join(f"{k} ({v})" for k, v in keys.items()) if keys else "none declared"
        except Exception as exc:  # help must print even where a family cannot be imported
            names, keys = f"unavailable ({type(exc).__name__}: {exc})", "-"
        lines += [f"  {fam}:", f"    cases: {names}", f"    shape keys: {keys}"]
        if getattr(mod, "STAGE_SHAPES", None) and getattr(mod, "KERNELS", None):
            inside = getattr(mod, "STAGED_WITH", {})
            names = [k + (f" (inside {inside[k]})" if k in inside else "") for k in mod.KERNELS]
            lines += [f"    --stages kernels (--kernel): {', '.join(names)}",
                      "    --stages shape on a GPU / without: " + " / ".join(
                          ",".join(f"{k}={v}" for k, v in mod.STAGE_SHAPES[d].items()) for d in ("cuda", "cpu"))]
    lines.append("  (--shape replaces the production shape's keys and runs one 'custom' case)")
    return "\n".join(lines)


def _model_layers():
    from .bench.model import LAYERS

    return LAYERS


def _model_keys():
    from .bench.model import DEFAULTS

    return list(DEFAULTS)


def main(argv: list[str] | None = None) -> int:
    from .bench.harness import UsageError

    parser = argparse.ArgumentParser(prog="kernel-fun", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("doctor", help="versions, device, which families would engage here, fla drift")
    for name, text in (("bench", "ours vs fla side by side on the GPU (the check without one)"),
                       ("check", "interpreted correctness check of every family, small shapes")):
        p = sub.add_parser(name, help=text, epilog=_families_help(),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--family", action="append", choices=BENCH_FAMILIES,
                       help="restrict to a family (repeatable); default: all present")
        if name == "check":
            p.add_argument("--lower", nargs="?", const="sm_90a", choices=("sm_90a", "sm_100a", "all"),
                           metavar="sm_90a|sm_100a|all",
                           help="instead: do the shipped kernels lower for this GPU target? every shipped "
                                "config compiled to a cubin by Triton's compiler, no GPU needed (default sm_90a)")
            p.add_argument("--jobs", type=int, default=1, help="with --lower: compile in this many processes")
        if name == "bench":
            p.add_argument("--stages", metavar="FAMILY",
                           help="instead: every config (CONFIGS and CANDIDATES) of every shipped kernel of "
                                "FAMILY (cconv, kda, gdn, gnorm; the delta scans are kda's and gdn's) forced "
                                "one by one, checked against its stage reference and timed; production-like "
                                "shapes on a GPU, tiny interpreted untimed ones without (--shape: the stage "
                                "shape's keys)")
            p.add_argument("--device", choices=("cuda", "cpu"),
                           help="with --stages: cpu runs the interpreted tiny shapes even on a GPU machine")
            p.add_argument("--kernel", action="append",
                           help="with --stages: only this kernel (its launch-witness name, e.g. cconv.fwd; repeatable)")
            p.add_argument("--config", action="append",
                           help="with --stages: only configurations of this name (as the rows print them) or "
                                "kind (shipped, candidate, autotuned); repeatable")
            p.add_argument("--shape", help="override the production shapes, e.g. B=8,T=4096,D=2048")
            p.add_argument("--json", help="record path (default bench/records/<date>-<gpu>-<sha>.json)")
            p.add_argument("--case", action="append", help="run only this case (repeatable)")
            p.add_argument("--model", choices=sorted(_model_layers()),
                           help="the model-level A/B instead: a stack of fla's layers of this kind, "
                                "fla against kernel-fun via patch_fla() (--shape keys: "
                                + ", ".join(_model_keys()) + ")")
    args = parser.parse_args(argv)
    if args.command == "doctor":
        return doctor()
    families = args.family or BENCH_FAMILIES
    if args.command == "check":
        if args.lower:
            return lower(args.lower, args.jobs)
        return check(families)
    if args.command == "bench":
        try:
            if args.stages is not None:
                extra = [f for f, v in (("--family", args.family), ("--case", args.case), ("--model", args.model))
                         if v]
                if extra:
                    raise UsageError(f"--stages takes one family and no {', '.join(extra)}")
                return stages(args.stages, args.device, _parse_shape(args.shape), args.json, args.kernel,
                              args.config)
            if args.device or args.kernel or args.config:
                raise UsageError("--device, --kernel and --config go with --stages")
            if args.model:
                from .bench import model

                return model.main(args.model, _parse_shape(args.shape), args.json)
            return bench(families, _parse_shape(args.shape), args.json, args.case)
        except UsageError as exc:
            print(f"kernel-fun bench: {exc}", file=sys.stderr)
            return 2
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
