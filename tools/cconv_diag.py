#!/usr/bin/env python
"""Where the cconv kernels lose to a copy: each shipped kernel beside stripped-down variants of
itself and two plain copies moving the same bytes, at the production shape (bf16 x
[16, 8192, 2048], fp32 weight [2048, 4], silu, W=4).

    python tools/cconv_diag.py out.json        # do_bench medians (no profiler)
    ncu ... python tools/cconv_diag.py --once   # one launch each, for Nsight Compute

Variants (each forced to one configuration: no autotuning, so ncu sees the kernel as timed):

* copy_torch    y.copy_(x): the ceiling's kernel at the forward's bytes
* copy_triton   a flat 1-D Triton copy, 16 B per access
* fwd           the pointer forward's first config (W=4, silu)
* fwd_w1        the same kernel at W=1 without silu: the walk and its bytes, almost no math
* fwd_exact     the shipped config with tl.sigmoid (fastmath.FAST_MATH off); bwd_exact too
* fwd_tma       the TMA forward (fwd.conv_fwd_tma_kernel, fwd.TMA_CONFIGS[0]): the default for large x
* bwd           the shipped backward config (W=4, silu)
* bwd_w1        the same at W=1 without silu

`tools/gpu_run.sh cconv_diag` runs the timing pass and then the ncu pass.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))


@triton.jit
def flat_copy_kernel(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(dst + offs, tl.load(src + offs, mask=m), mask=m)


def variants(x, w, dy):
    from kernel_fun.cconv._kernels import bwd as B_
    from kernel_fun.cconv._kernels import fwd as F_

    y = torch.empty_like(x)
    n = x.numel()
    fcfg, bcfg = F_.CONFIGS[0], B_.CONFIGS[0]
    w1 = w[:, :1].contiguous()
    out = {
        "copy_torch": lambda: y.copy_(x),
        "copy_triton": lambda: flat_copy_kernel[(triton.cdiv(n, 4096),)](x, y, n, BLOCK=4096, num_warps=4),
        "fwd": lambda: F_.conv_fwd(x, w, None, True, tma=False, config=fcfg),
        "fwd_w1": lambda: F_.conv_fwd(x, w1, None, False, tma=False, config=fcfg),
        "fwd_tma": lambda: F_.conv_fwd(x, w, None, True, tma=True),
        "bwd": lambda: B_.conv_bwd(x, w, None, dy, True, config=bcfg),
        "bwd_w1": lambda: B_.conv_bwd(x, w1, None, dy, False, config=bcfg),
    }

    def exact(mod, fn):  # tl.sigmoid in place of fastmath.sigmoid's short form
        def run():
            saved = mod.FAST_MATH
            mod.FAST_MATH = False
            try:
                return fn()
            finally:
                mod.FAST_MATH = saved
        return run

    out["fwd_exact"] = exact(F_, out["fwd"])
    out["bwd_exact"] = exact(B_, out["bwd"])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?")
    ap.add_argument("--once", action="store_true", help="one launch each (for ncu)")
    a = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    B, T, D = 16, 8192, 2048
    x = torch.randn(B, T, D, device="cuda", dtype=torch.bfloat16, generator=g)
    dy = torch.randn(B, T, D, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(D, 4, device="cuda", generator=g) / 4
    nb = x.numel() * 2
    rows = []
    for name, fn in variants(x, w, dy).items():
        fn()
        torch.cuda.synchronize()
        if a.once:
            print(f"launched {name}", flush=True)
            continue
        ms = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
        nbytes = (3 if name.startswith("bwd") else 2) * nb
        rows.append(dict(variant=name, ms=round(ms, 4), TBps=round(nbytes / ms / 1e9, 3)))
        print(f"{name:12s} {ms:8.4f} ms {nbytes / ms / 1e9:6.3f} TB/s", flush=True)
    if a.out and rows:
        with open(a.out, "w") as f:
            json.dump(dict(gpu=torch.cuda.get_device_name(), shape=dict(B=B, T=T, D=D), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
