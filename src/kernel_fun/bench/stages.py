"""`kernel-fun bench --stages FAMILY`: every configuration of every shipped kernel of a family,
forced one at a time, checked against its plain-torch stage reference, and timed.

The kernels are the family's probes (``kernel_fun.bench.<family>.probes``: each kernel launched
as the family's chain launches it, beside its reference; ``kernel-fun check`` runs kda's, gdn's
and gnorm's with the autotuner's pick, and cconv's TMA one). For each probe, each configuration
of its module's ``CONFIGS`` (rows marked ``shipped``) and ``CANDIDATES`` (``candidate``) is
passed as ``config=``, then none
(``autotuned``: the autotuner's own pick, beside the configs it chose from): its outputs
are compared with the reference (relative RMS error per output, ``ok`` when every one is under
the probe's tolerance), then, on a GPU, it is timed (``harness.median_ms``). The delta engine's
state scans and score gradient are kda's and gdn's probes, at each family's gate.

Shapes: the family's ``STAGE_SHAPES["cuda"]`` (production-like) on a GPU; on a machine without
one (or with ``--device cpu``) ``STAGE_SHAPES["cpu"]``, tiny, through Triton's interpreter,
untimed (``ms`` null). ``--shape`` replaces keys of that shape. One JSON record, as every bench
record is written (``harness.record``), with a row per (probe, configuration).
"""
from __future__ import annotations

import importlib

from .harness import UsageError

# kda and gdn hold the delta engine's probes (state scans, score gradient) at their gates.
FAMILIES = ("cconv", "kda", "gdn", "gnorm")


def _module(family: str):
    if family not in FAMILIES:
        raise UsageError(f"--stages: no family {family!r} (families: {', '.join(FAMILIES)}; the delta "
                         f"engine's scans are kda's and gdn's stages)")
    return importlib.import_module(f"kernel_fun.bench.{family}")


def stage_shape(family: str, device: str, overrides: dict | None) -> dict:
    """The family's stage shape on ``device`` with ``--shape``'s keys replaced (``UsageError``
    for a key it does not have, or a non-integer where it holds an integer)."""
    base = dict(_module(family).STAGE_SHAPES["cuda" if device == "cuda" else "cpu"])
    for k, v in (overrides or {}).items():
        if k not in base:
            raise UsageError(f"--shape: {k} does not fit the {family} stages (their keys: {', '.join(base)})")
        if isinstance(base[k], int):
            if not str(v).isdigit():
                raise UsageError(f"--shape: {k}={v!r} for the {family} stages must be a non-negative integer")
            v = int(v)
        base[k] = v
    return base


def stage_rows(family: str, probes, timed: bool, out=print, configs=None) -> list[dict]:
    """One row per (probe, configuration): family, kernel, probe (its label), config, kind
    (shipped / candidate / fixed / autotuned: the autotuner's pick, config=None), ms (None
    untimed), errors {output: rel err}, max_rel_err, ok, and ``error`` where the launch raised
    (a configuration that does not fit this GPU). ``configs``: only the configurations of these
    names or kinds (``--config``)."""
    from .harness import median_ms, run_probe

    rows = []
    for p in probes:
        # each config forced, then (a tuned kernel) the autotuner's own pick: does it find the best?
        runs = p.configs() + ([("autotuned", "autotuned")] if p.lists is not None else [])
        runs = [(c, kind) for c, kind in runs
                if configs is None or kind in configs or (kind != "autotuned" and p.config_name(c) in configs)]
        if not runs:
            continue
        expected = p.reference()
        for config, kind in runs:
            name = "autotuned" if kind == "autotuned" else p.config_name(config)
            config = None if kind == "autotuned" else config
            row = dict(family=family, kernel=p.kernel, probe=p.label, config=name, kind=kind,
                       ms=None, max_rel_err=None, ok=False)
            if p.note:
                row["note"] = p.note
            try:
                errs, fails = run_probe(p, config, expected)  # launched (witnessed) and checked
                row.update(errors={k: float(f"{e:.3e}") for k, e in errs.items()},
                           max_rel_err=float(f"{max(errs.values()):.3e}"), ok=not fails)
                if timed:
                    row["ms"] = round(median_ms(lambda: p.run(config)), 4)
            except Exception as exc:  # noqa: BLE001  (a config that does not fit is a row, not the end)
                lines = str(exc).strip().splitlines() or [""]
                row["error"] = f"{type(exc).__name__}: {lines[-1][:200]}"
            rows.append(row)
            out(_format(row))
        del expected
    return rows


def _format(r: dict) -> str:
    ms = f"{r['ms']:9.4f}" if r["ms"] is not None else "        -"
    err = f"{r['max_rel_err']:9.2e}" if r["max_rel_err"] is not None else "        -"
    status = "ok" if r["ok"] else ("ERROR " + r["error"] if "error" in r else "BAD")
    return f"{r['kernel']:22s} {r['config']:28s} {r['kind']:9s} {ms} {err}  {status}"


def selected(family: str, kernels) -> set | None:
    """The probe kernels ``--kernel`` asks for (a kernel its family runs inside another's probe,
    ``STAGED_WITH``, selects that probe); ``UsageError`` for a name the family does not ship."""
    mod = _module(family)
    if not kernels:
        return None
    unknown = [k for k in kernels if k not in mod.KERNELS]
    if unknown:
        raise UsageError(f"--kernel: {', '.join(unknown)} is not a {family} kernel "
                         f"(its kernels: {', '.join(mod.KERNELS)})")
    inside = getattr(mod, "STAGED_WITH", {})
    return {inside.get(k, k) for k in kernels}


def run(family: str, device: str, overrides: dict | None, json_path: str | None, kernels=None, configs=None) -> int:
    """``bench --stages``: print and record the rows; 0 when every row is ok, 1 otherwise."""
    from . import harness

    shape = stage_shape(family, device, overrides)
    want = selected(family, kernels)
    timed = device == "cuda"
    print(f"kernel-fun bench --stages {family}: {device} ({'timed' if timed else 'interpreted, untimed'}), "
          f"shape {shape}", flush=True)
    ceilings = harness.measure_ceilings() if timed else {}
    probes = [p for p in _module(family).probes(device, shape) if want is None or p.kernel in want]
    print(f"{'kernel':22s} {'config':28s} {'kind':9s} {'ms':>9s} {'max err':>9s}  status", flush=True)
    rows = stage_rows(family, probes, timed, configs=set(configs) if configs else None)
    timing = ({"method": "triton.testing.do_bench median of each forced configuration's launcher call",
               "warmup_ms": harness.WARMUP_MS, "rep_ms": harness.REP_MS} if timed else
              {"method": "untimed: Triton's interpreter on CPU tensors"})
    rec = harness.record(rows, ceilings, extra={"stages": family, "device": device, "shape": shape, "timing": timing,
                                                "configs": sorted(configs) if configs else "all"})
    harness.write_record(rec, json_path or harness.default_record_path(rec, f"stages-{family}"))
    bad = [r for r in rows if not r["ok"]]
    print(f"stages {family}: {len(rows)} rows, {len(bad)} not ok", flush=True)
    return 1 if bad or not rows else 0
