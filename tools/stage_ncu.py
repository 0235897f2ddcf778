#!/usr/bin/env python
"""Driver for Nsight Compute: launch chosen stage kernels of a family once each, with a forced
configuration (no autotuner trials), inside one NVTX range for ncu to profile.

    ncu --clock-control none --nvtx --nvtx-include "stage_ncu/" --section SpeedOfLight ... \\
        python3 tools/stage_ncu.py gdn --shape B=4,T=4096,H=16,HV=32 \\
        --kernel gdn.wy_dv_bwd --kernel gdn.wy_dqk_bwd=BK64-BV64-w4-s2

(``tools/gpu_run.sh ncu_kda`` and ``ncu_gdn`` run it.) The inputs are ``kernel-fun bench --stages
FAMILY``'s probes (``kernel_fun.bench.<family>.probes``: structured random stage inputs, bf16
where the chain passes bf16) at the family's GPU stage shape, ``--shape`` replacing its keys.
``--kernel NAME[#N][=CONFIG]``: the probe's launch-witness name (``#N``: its N-th probe where the
family has several, in ``bench --stages`` order; default the first) and one of its configurations by
the name ``bench --stages`` prints (default: the first of its ``CONFIGS``). Building a probe's inputs
may launch other kernels of the family, autotuned (a later stage's inputs are an earlier stage's
outputs): those run before the chosen launches, which come last, one each, in ``--kernel`` order,
inside one NVTX range named ``stage_ncu`` (ncu's ``--nvtx --nvtx-include "stage_ncu/"`` profiles
exactly them).
"""
from __future__ import annotations

import argparse
import sys

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("family", choices=("cconv", "kda", "gdn", "gnorm"))
    ap.add_argument("--shape", default="", help="the stage shape's keys to replace, e.g. B=2,T=8192")
    ap.add_argument("--kernel", action="append", required=True, help="NAME or NAME=CONFIG (repeatable)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: the interpreted tiny stage shape, a dry run of the arguments (no NVTX range)")
    a = ap.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("stage_ncu: needs a CUDA GPU (--device cpu for a dry run)")
    if a.device == "cpu":
        import os

        os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported
    import importlib

    from kernel_fun.__main__ import _parse_shape  # the CLI's --shape parser: one grammar
    from kernel_fun.bench.stages import stage_shape

    overrides = _parse_shape(a.shape)
    probes: dict = {}  # a kernel's probes in the family's order (gdn's forward scan has two: output, recompute)
    for p in importlib.import_module(f"kernel_fun.bench.{a.family}").probes(
            a.device, stage_shape(a.family, a.device, overrides)):
        probes.setdefault(p.kernel, []).append(p)
    chosen = []
    for spec in a.kernel:
        name, _, cfg_name = spec.partition("=")
        name, _, nth = name.partition("#")
        if name not in probes:
            sys.exit(f"stage_ncu: {name} is not a {a.family} probe ({', '.join(probes)})")
        i = int(nth) if nth.isdigit() else (1 if not nth else 0)
        if not 1 <= i <= len(probes[name]):
            sys.exit(f"stage_ncu: {name} has {len(probes[name])} probe(s); #{nth} is not one of them")
        p = probes[name][i - 1]
        configs = [c for c, _ in p.configs()]
        config = configs[0] if not cfg_name else next((c for c in configs if p.config_name(c) == cfg_name), False)
        if config is False:
            sys.exit(f"stage_ncu: {name} has no configuration {cfg_name} "
                     f"({', '.join(p.config_name(c) for c in configs)})")
        chosen.append((p, config))
    gpu = a.device == "cuda"
    for p, config in chosen:  # compiled outside the range: a first launch compiles
        p.run(config)
    if gpu:
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push("stage_ncu")
    for p, config in chosen:
        p.run(config)
        if gpu:
            torch.cuda.synchronize()
        print(f"launched {p.kernel} {p.config_name(config)} ({p.label}{'; ' + p.note if getattr(p, 'note', '') else ''})",
              flush=True)
    if gpu:
        torch.cuda.nvtx.range_pop()


if __name__ == "__main__":
    main()
