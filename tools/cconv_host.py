#!/usr/bin/env python
"""Host cost against device time of the two cconv forwards (the pointer kernel and the TMA
one), to place the size below which the TMA forward's extra host work (a TensorDescriptor
per call, Triton's tensor-map encoding per launch, the autotune pre-hook) outweighs its
faster walk.

    python tools/cconv_host.py out.json [--public-only]
    python tools/cconv_host.py --cpu       # no GPU: the public entry's own Python, launch stubbed

Per shape and path: host_us, the wall time per call of back-to-back calls with the queue kept
short (``harness.host_us``: the host's cost when it, not the GPU, is the bottleneck); gpu_us, the device time
per call from a CUDA graph of 20 calls replayed (no host work at all); and call_us, do_bench's
median per call (what the bench sees). Timing helpers from ``kernel_fun.bench.harness``.
"""
from __future__ import annotations

import json
import os
import sys
import time

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

PUBLIC = (16, 8192, 2048)
SHAPES = [(1, 2048, 2048), (2, 4096, 2048), (4, 4096, 2048), (8, 4096, 2048), (8, 8192, 2048),
          (16, 8192, 2048)]


def graph_ms(fn, n=20) -> float:
    """GPU-only time per call: n calls captured in one CUDA graph, the replay timed."""
    from kernel_fun.bench.harness import median_ms

    fn()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(n):
            fn()
    return median_ms(graph.replay) / n


def measure(fn, graph=True):
    from kernel_fun.bench.harness import host_us, median_ms

    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    # host: bursts of 10 calls from an idle GPU, so the launch queue never fills and blocks
    # (a public call that needs grad is captured only once its backward ran eagerly: no graph)
    return dict(host_us=host_us(fn), gpu_us=graph_ms(fn) * 1e3 if graph else float("nan"),
                call_us=median_ms(fn) * 1e3)


def cpu_entry_cost(N=5000, R=15):
    """The Python the public forward adds around its kernel, on this CPU, no GPU needed: the
    public call with conv_fwd stubbed to torch.empty_like, minus the autograd Function's apply
    alone with the same stub (gates, classifier, validation, signature, report). Best of R
    loops of N calls (a shared machine adds noise, never removes it)."""
    os.environ.setdefault("TRITON_INTERPRET", "1")  # CPU tensors pass the tensor gate
    from kernel_fun import cconv
    from kernel_fun.cconv import autograd as A

    A.conv_fwd = lambda x, w, b, silu, cu, tma=None: torch.empty_like(x)
    x = torch.randn(2, 64, 32, requires_grad=True)
    w = torch.randn(32, 4, requires_grad=True)

    def best_us(fn):
        for _ in range(300):
            fn()
        best = float("inf")
        for _ in range(R):
            t0 = time.perf_counter()
            for _ in range(N):
                fn()
            best = min(best, (time.perf_counter() - t0) / N * 1e6)
        return best

    public = best_us(lambda: cconv.causal_conv1d(x, w, activation="silu"))
    apply = best_us(lambda: A.CausalConv1dFunction.apply(x, w, None, True, None, ("s",), False))
    print(f"CPU host: public forward {public:.1f} us, Function.apply alone {apply:.1f} us, "
          f"entry overhead {public - apply:.1f} us per call (launch stubbed)")


def main():
    if "--cpu" in sys.argv:
        return cpu_entry_cost()
    from kernel_fun.cconv._kernels import fwd as F_

    out = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
               git_sha=os.environ.get("KERNEL_FUN_GIT_SHA", "unknown"), rows=[])
    print(out, flush=True)
    for B, T, D in ([] if "--public-only" in sys.argv else SHAPES):
        x = torch.randn(B, T, D, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(D, 4, device="cuda") / 4
        for path in ("ptr", "tma"):
            r = measure(lambda: F_.conv_fwd(x, w, None, True, tma=path == "tma"))
            r.update(B=B, T=T, D=D, path=path, x_MB=x.numel() * 2 / 2**20)
            out["rows"].append(r)
            print(f"[{B},{T},{D}] {path}: host {r['host_us']:.1f} us  gpu {r['gpu_us']:.1f} us  "
                  f"do_bench {r['call_us']:.1f} us", flush=True)
    # the public op, as the bench times it (x and weight require grad: an autograd node per
    # call), per path: do_bench, host burst, and where the host time goes (cProfile)
    import cProfile
    import io
    import pstats

    from kernel_fun import cconv

    B, T, D = PUBLIC
    x = torch.randn(B, T, D, device="cuda", dtype=torch.bfloat16).requires_grad_()
    w = (torch.randn(D, 4, device="cuda") / 4).requires_grad_()
    for path in ("ptr", "tma"):
        saved = os.environ.get("KERNEL_FUN_CCONV_TMA")
        os.environ["KERNEL_FUN_CCONV_TMA"] = "1" if path == "tma" else "0"  # the user's switch
        try:
            fn = lambda: cconv.causal_conv1d(x, w, activation="silu")[0]  # noqa: E731
            r = measure(fn, graph=False)
            prof = cProfile.Profile()
            torch.cuda.synchronize()
            prof.enable()
            for _ in range(100):
                fn()
            prof.disable()
            torch.cuda.synchronize()
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(22)
        finally:
            if saved is None:
                del os.environ["KERNEL_FUN_CCONV_TMA"]
            else:
                os.environ["KERNEL_FUN_CCONV_TMA"] = saved
        r.update(B=B, T=T, D=D, path="public_" + path, profile=buf.getvalue())
        out["rows"].append(r)
        print(f"public [{B},{T},{D}] {path}: host {r['host_us']:.1f} us  gpu {r['gpu_us']:.1f} us  "
              f"do_bench {r['call_us']:.1f} us", flush=True)
        print(buf.getvalue()[:5000], flush=True)
    # what a TensorDescriptor costs to build on the host
    from triton.tools.tensor_descriptor import TensorDescriptor
    x = torch.randn(16, 8192, 2048, device="cuda", dtype=torch.bfloat16)
    t0 = time.perf_counter()
    for _ in range(1000):
        TensorDescriptor(x, list(x.shape), list(x.stride()), [1, 32, 128])
    out["descriptor_us"] = (time.perf_counter() - t0) * 1e3
    print(f"TensorDescriptor(): {out['descriptor_us']:.2f} us", flush=True)
    paths = [a for a in sys.argv[1:] if not a.startswith("--")]
    if paths:
        with open(paths[0], "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
