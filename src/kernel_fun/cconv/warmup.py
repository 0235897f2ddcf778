"""Compile and autotune cconv at the real shapes before step 1, showing progress."""
from __future__ import annotations

import torch


def warmup(B: int, T: int, D=(2048,), W: int = 4, dtype=torch.bfloat16,
           weight_dtype=torch.float32, bias: bool = False, activation: str | None = "silu",
           backward: bool = True, device=None, verbose: bool = True) -> None:
    """Run fwd (+ bwd) once per D so every kernel compiles and autotunes now, not inside step 1
    (and so these signatures may later run under CUDA graph capture). Also runs the fla drift
    check. ``D`` is an int or a sequence of ints (e.g. the q/k width and the v width)."""
    from .._common.compat import check_fla
    from .._common.progress import run_steps
    from .ops import causal_conv1d

    check_fla()
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")

    def step(d):
        x = torch.randn(B, T, d, device=device, dtype=dtype, requires_grad=backward)
        w = torch.randn(d, W, device=device, dtype=weight_dtype, requires_grad=backward)
        b = torch.randn(d, device=device, dtype=weight_dtype, requires_grad=backward) if bias else None
        y, _ = causal_conv1d(x, w, b, activation=activation)
        if backward:
            y.backward(torch.randn_like(y))
        if device != "cpu":
            torch.cuda.synchronize()

    dims = (D,) if isinstance(D, int) else tuple(D)
    run_steps("cconv", [(f"B={B} T={T} D={d} W={W} {dtype}", lambda d=d: step(d)) for d in dims], verbose)
