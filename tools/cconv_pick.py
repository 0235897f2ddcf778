#!/usr/bin/env python
"""Which configuration the autotuner picks for the cconv kernels at the bench's production
shapes, and the public autograd path timed beside each shipped configuration forced.

    python scripts/cconv_pick.py [out.json]

Prints, per shape (B=16 T=8192, D=2048 and 4096, bf16, fp32 weight, silu, W=4): the pick of
`conv_fwd_kernel` and `conv_bwd_kernel` (`best_config`), then `triton.testing.do_bench`
medians of the launchers with each config of `_FWD_CONFIGS` / `_BWD_CONFIGS` forced and of
the public op (fwd; bwd through `torch.autograd.grad`), to see whether the pick is the fastest.
"""
from __future__ import annotations

import json
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))


def main():
    from kernel_fun import cconv
    from kernel_fun.cconv._kernels import bwd as B_
    from kernel_fun.cconv._kernels import fwd as F_

    rows = []
    for D in (2048, 4096):
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(16, 8192, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
        w = (torch.randn(D, 4, device="cuda", generator=g) / 4).requires_grad_()
        dy = torch.randn_like(x)
        y = cconv.causal_conv1d(x, w, activation="silu")[0]
        torch.autograd.grad(y, (x, w), dy, retain_graph=True)
        torch.cuda.synchronize()
        pick = dict(fwd=str(F_._TMA_CONFIG if F_.use_tma(x) else F_.conv_fwd_kernel.best_config),
                    bwd=str(B_.conv_bwd_kernel.best_config))
        t = dict(public_fwd=triton.testing.do_bench(lambda: cconv.causal_conv1d(x, w, activation="silu"),
                                                    warmup=25, rep=200, return_mode="median"),
                 public_bwd=triton.testing.do_bench(lambda: torch.autograd.grad(y, (x, w), dy, retain_graph=True),
                                                    warmup=25, rep=200, return_mode="median"))
        for kind, kernel, configs, fn in (
                ("fwd", F_.conv_fwd_kernel, F_._FWD_CONFIGS, lambda: F_.conv_fwd(x, w, None, True, tma=False)),
                ("bwd", B_.conv_bwd_kernel, B_._BWD_CONFIGS, lambda: B_.conv_bwd(x, w, None, dy, True))):
            saved = kernel.configs
            for i, c in enumerate(configs):
                kernel.configs = [c]
                try:
                    t[f"{kind}[{i}] {c}"] = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
                finally:
                    kernel.configs = saved
        row = dict(D=D, pick=pick, ms={k: round(v, 4) for k, v in t.items()})
        rows.append(row)
        print(json.dumps(row, indent=1), flush=True)
        x = w = dy = y = None  # free before the next shape
        torch.cuda.empty_cache()
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(dict(gpu=torch.cuda.get_device_name(), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
