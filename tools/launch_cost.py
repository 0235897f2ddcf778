#!/usr/bin/env python
"""What one launch of our Triton kernels costs the host, layer by layer of Triton's launch path.

    python tools/launch_cost.py [out.json]        # a GPU

For two kernels of the gdn chain (``gated_scores``: 17 arguments; the forward ``state_scan_fwd``:
about 40) at a small shape (the GPU finishes each launch in microseconds, so the host sets the
pace), the host microseconds a call of: our launcher function (allocation and argument set-up
included); the autotuned kernel (``kernel[grid](...)``: Triton's Autotuner, then its JIT); the JIT
function with the chosen config (no Autotuner); ``tuning.launch`` (our path: the autotuner's
pick remembered per key, then the jit function); Triton's binder alone (the argument
specialization every JIT call makes); and the compiled kernel's own ``run`` (the C launcher,
nothing above it). The difference between the rows is what each layer costs.
"""
from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))


def per_call_us(fn, n=2000, rounds=5) -> float:
    import torch

    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    torch.cuda.synchronize()
    return round(best, 2)


def layers(name, launcher, tuned, grid, args) -> dict:
    import torch
    from triton import knobs

    from kernel_fun._common.tuning import launch

    tuned[grid](**args)  # tune (or find the tuned config)
    cfg = tuned.best_config
    jit = tuned.fn
    kw = {**args, **cfg.all_kwargs()}
    dev = torch.cuda.current_device()
    binder = jit.device_caches[dev][4]
    compiled = jit.run(grid=grid, warmup=False, **kw)
    bound, _, _ = binder(**kw)
    vals = tuple(bound.values())
    stream = torch.cuda.current_stream().cuda_stream
    g = tuple(grid(bound) if callable(grid) else grid)
    g = g + (1,) * (3 - len(g))

    def direct():
        compiled.run(g[0], g[1], g[2], stream, compiled.function, compiled.packed_metadata, None,
                     knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *vals)

    row = {"kernel": name, "args": len(vals),
           "launcher_us": per_call_us(launcher),
           "autotuned_us": per_call_us(lambda: tuned[grid](**args)),
           "tuning_launch_us": per_call_us(lambda: launch(tuned, grid, None, **args)),
           "jit_us": per_call_us(lambda: jit[grid](**kw)),
           "binder_us": per_call_us(lambda: binder(**kw)),
           "compiled_run_us": per_call_us(direct),
           "current_stream_us": per_call_us(lambda: torch.cuda.current_stream().cuda_stream),
           "empty_us": per_call_us(lambda: torch.empty(64, device="cuda"))}
    print(json.dumps(row), flush=True)
    return row


def autotuner_runs_when_warm(dev: str = "cuda") -> dict:
    """Which of our kernels still go through Triton's Autotuner.run in a gdn forward + backward
    (the layer's call) whose shapes ran once before: none should (``tuning.launch``)."""
    import torch
    from triton.runtime.autotuner import Autotuner

    from kernel_fun import gdn

    B, T, H, HV, K, V = 1, 256, 2, 4, 128, 128
    dt = torch.bfloat16 if dev == "cuda" else torch.float16
    qkv = torch.randn(B, T, 2 * H * K + HV * V, device=dev, dtype=dt, requires_grad=True)

    def call():
        q, k, v = qkv.split([H * K, H * K, HV * V], -1)
        o, _ = gdn.chunk_gated_delta_rule(
            q.unflatten(-1, (H, K)), k.unflatten(-1, (H, K)), v.unflatten(-1, (HV, V)),
            g, beta, use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True, state_v_first=True,
            use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias)
        o.float().square().mean().backward()

    g = torch.randn(B, T, HV, device=dev, dtype=dt, requires_grad=True)
    beta = torch.randn(B, T, HV, device=dev, dtype=dt, requires_grad=True)
    A_log = torch.randn(HV, device=dev, requires_grad=True)
    dt_bias = torch.randn(HV, device=dev, requires_grad=True)
    call()
    seen: dict = {}
    real = Autotuner.run

    def counting(self, *a, **k):
        name = getattr(self.base_fn, "__module__", "") + "." + getattr(self.base_fn, "__name__", "?")
        seen[name] = seen.get(name, 0) + 1
        return real(self, *a, **k)

    Autotuner.run = counting
    try:
        call()
        torch.cuda.synchronize()
    finally:
        Autotuner.run = real
    return seen


def main() -> int:
    import torch

    from kernel_fun.gdn._kernels import scores as S
    from kernel_fun._delta._kernels import state_scan_fwd as F
    from kernel_fun._common.tuning import alloc, next_pow2

    B, T, H, HV, K, V = 1, 128, 2, 4, 128, 128
    dt = torch.bfloat16
    q = torch.randn(B, T, H, K, device="cuda", dtype=dt)
    k = torch.randn(B, T, H, K, device="cuda", dtype=dt)
    gc = -torch.rand(B, T, HV, device="cuda").cumsum(1)
    rows = []
    A = alloc((B, T, HV, 64), dtype=dt, device=q.device)
    args = dict(q=q, k=k, g=gc, A=A, cu_seqlens=A, chunk_indices=A, scale=0.1, T=T, H=H, HV=HV, K=K,
                BT=64, KP=max(16, next_pow2(K)), GP=S.group_pad(HV // H), IS_VARLEN=False, DOT_PRECISION="tf32")
    rows.append(layers("gated_scores", lambda: S.gated_scores(q, k, gc, 0.1), S.gated_scores_kernel_tuned,
                       (T // 64, B * H), args))

    # the forward scan through its own launcher, its kernel's arguments captured from one call
    captured = {}
    real = F.launch

    def capture(kernel, grid, config, **a):
        captured.update(kernel=kernel, grid=grid, args=a)
        return real(kernel, grid, config, **a)

    v = torch.randn(B, T, HV, V, device="cuda", dtype=dt)
    beta = torch.rand(B, T, HV, device="cuda", dtype=dt)
    Aw = torch.zeros(B, T, HV, 64, device="cuda", dtype=dt)

    def scan():
        return F.state_scan_fwd(q, k, None, None, g=gc, wy=(Aw, v, beta), scale=0.1)

    F.launch = capture
    scan()
    F.launch = real
    rows.append(layers("state_scan_fwd", scan, captured["kernel"], captured["grid"], captured["args"]))
    misses = autotuner_runs_when_warm()
    print(json.dumps({"autotuner_runs_in_a_warm_gdn_fwd_bwd": misses}), flush=True)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows,
                       "autotuner_runs_in_a_warm_gdn_fwd_bwd": misses}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
