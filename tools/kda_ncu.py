#!/usr/bin/env python
"""Driver for Nsight Compute: launch each of our KDA backward stage kernels once, with a forced
configuration (no autotuning, so ncu's first matching launch is the kernel as it ships).

    ncu --clock-control none -k regex:'_intra_bwd_kernel|_wy_bwd_kernel' \\
        --launch-count 3 --section SpeedOfLight ... python3 tools/kda_ncu.py [--B 2]

(``tools/gpu_run.sh ncu_kda`` runs exactly that.) The inputs are ``kernel-fun bench --stages
kda``'s (``kernel_fun.bench.kda.probes``: structured random stage inputs, bf16 where the chain
passes bf16) at the production heads, H=HV=16, K=128, V=256, T=8192; B=2 by default: the
programs are the production shape's, only fewer. ncu profiles the first matching launches, so
ours must not be autotuner trials: each runs exactly once with a forced configuration (the
wy stage's first, the intra stage's whole-K block, which the chain runs with the l2norm
backward fused).
"""
from __future__ import annotations

import argparse
import sys

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--B", type=int, default=2)
    ap.add_argument("--T", type=int, default=8192)
    a = ap.parse_args()
    from kernel_fun.bench.kda import STAGE_SHAPES, probes
    from kernel_fun.kda._kernels import intra_bwd as intra_mod
    from kernel_fun.kda._kernels import wy_bwd as wy_mod

    stage = {p.kernel: p for p in probes("cuda", dict(STAGE_SHAPES["cuda"], B=a.B, T=a.T))}
    wy_cfg = wy_mod.CONFIGS[0]
    stage["kda.wy_bwd"].run(wy_cfg)
    torch.cuda.synchronize()
    print("launched _wy_bwd_kernel", wy_cfg, flush=True)
    intra_cfg = next(c for c in intra_mod.CONFIGS if c.kwargs["BK"] == 128)
    stage["kda.intra_bwd"].run(intra_cfg)
    torch.cuda.synchronize()
    print("launched _intra_bwd_kernel", intra_cfg, flush=True)


if __name__ == "__main__":
    if not torch.cuda.is_available():
        sys.exit("kda_ncu: needs a CUDA GPU")
    main()
