"""Compile and autotune gnorm at the real shapes before step 1, showing progress."""
from __future__ import annotations

import torch


def warmup(N: int, V=(256,), activation: str = "swish", dtype=torch.bfloat16,
           weight_dtype=torch.float32, backward: bool = True, device=None, verbose: bool = True) -> None:
    """Run fwd (+ bwd) once per V at N rows so every kernel compiles and autotunes now, not
    inside step 1 (and so these signatures may later run under CUDA graph capture). Also runs
    the fla drift check. ``V`` is an int or a sequence of ints. The layers call with x, g
    ``[B, T, HV, V]``: N = B * T * HV."""
    from .._common.compat import check_fla
    from .._common.progress import run_steps
    from .ops import rms_norm_gated

    check_fla()
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")

    def step(v):
        x = torch.randn(N, v, device=device, dtype=dtype, requires_grad=backward)
        g = torch.randn(N, v, device=device, dtype=dtype, requires_grad=backward)
        w = torch.ones(v, device=device, dtype=weight_dtype, requires_grad=backward)
        y = rms_norm_gated(x, g, w, None, activation=activation, eps=1e-5)
        if backward:
            y.backward(torch.randn_like(y))
        if device != "cpu":
            torch.cuda.synchronize()

    dims = (V,) if isinstance(V, int) else tuple(V)
    run_steps("gnorm", [(f"N={N} V={v} {activation} {dtype}", lambda v=v: step(v)) for v in dims], verbose)
