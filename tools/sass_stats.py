#!/usr/bin/env python
"""Registers, spills, shared memory and SASS counts of our Triton kernels, compiled ahead of time
for sm_90a / sm_100a on a machine without a GPU: a proxy to check before spending device time,
not a timing.

    python tools/sass_stats.py intra_bwd                 # the production configurations
    python tools/sass_stats.py wy_bwd | state_scan_fwd | state_scan_bwd | score_grad | gate_bwd | cconv
    python tools/sass_stats.py gdn_scores | gdn_wy_dv | gdn_wy_dqk | gnorm
    python tools/sass_stats.py cconv --target sm_100a    # or sm_90a,sm_100a | all
    python tools/sass_stats.py cconv --full              # every config a bench may force, every flag

The kernels, their argument types and the configurations come from the package's lowering specs
(``kernel_fun.bench.lowering``, behind ``kernel-fun check --lower``); this prints what ptxas made
of each (``lowering.stats``: the cuobjdump that ships with the triton wheel reads the cubin), and
``per_sm``, the programs that fit on one SM at once by registers, shared memory (228 KB less 1 KB a
program) and warps (``lowering.programs_per_sm``). Run with TRITON_INTERPRET
unset and kernel-fun importable (installed, or ``PYTHONPATH=src``).
"""
from __future__ import annotations

import argparse
import sys

from kernel_fun.bench import lowering


def main(argv) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("names", nargs="*", default=["intra_bwd"], help=f"some of: {', '.join(lowering.SPECS)}, or all")
    p.add_argument("--target", default="sm_90a", help="sm_90a | sm_100a | sm_90a,sm_100a | all")
    p.add_argument("--full", action="store_true", help="every config a bench may force, at every flag combination")
    a = p.parse_args(argv)
    names = list(lowering.SPECS) if a.names == ["all"] else a.names
    targets = list(lowering.TARGETS) if a.target == "all" else a.target.split(",")
    bad = [n for n in names if n not in lowering.SPECS] + [t for t in targets if t not in lowering.TARGETS]
    if bad:
        p.error(f"unknown {', '.join(bad)}")
    for name in names:
        for label, fn, ptr, const, cfg in lowering.SPECS[name](full=a.full):
            for tname in targets:
                st = lowering.stats(fn, ptr, const, cfg.num_warps, cfg.num_stages, getattr(cfg, "maxnreg", None),
                                    lowering.TARGETS[tname])
                print(label if len(targets) == 1 else f"{tname} {label}", st, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
