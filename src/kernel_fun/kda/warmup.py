"""Compile and autotune every stage of the KDA chain (ours and fla's) before step 1."""
from __future__ import annotations

import torch


def warmup(K: int = 128, V: int = 256, HV: int = 16, H: int | None = None, B: int = 1,
           T: int = 8192, dtype=torch.bfloat16, use_qk_l2norm_in_kernel: bool = True,
           use_gate_in_kernel: bool = True, output_final_state: bool = False, backward: bool = True,
           device=None, verbose: bool = True) -> None:
    """Run the chain's fwd (+ bwd) once at these shapes so every kernel compiles and
    autotunes now (fla autotunes anew per shape; a large one takes minutes), and so the call
    signature may later run under CUDA graph capture. Runs the fla drift check first."""
    from .._common.compat import check_fla
    from .._common.progress import run_steps
    from .ops import chunk_kda

    check_fla()
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    H = H or HV

    def step():
        def r(*s, dt=dtype):
            return torch.randn(*s, device=device, dtype=dt, requires_grad=backward)

        kw = dict(use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, use_gate_in_kernel=use_gate_in_kernel,
                  output_final_state=output_final_state)
        if use_gate_in_kernel:
            kw.update(A_log=r(HV, dt=torch.float32), dt_bias=r(HV * K, dt=torch.float32))
        g = r(B, T, HV, K) if use_gate_in_kernel else torch.nn.functional.logsigmoid(
            torch.randn(B, T, HV, K, device=device)).to(dtype).requires_grad_(backward)
        beta = torch.rand(B, T, HV, device=device, dtype=dtype, requires_grad=backward)
        o, ht = chunk_kda(r(B, T, H, K), r(B, T, H, K), r(B, T, HV, V), g, beta, **kw)
        if backward:
            o.backward(torch.randn_like(o))
        if device != "cpu":
            torch.cuda.synchronize()

    run_steps("kda", [(f"B={B} T={T} H={H} HV={HV} K={K} V={V} {dtype}", step)], verbose)
