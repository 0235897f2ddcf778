"""Compile and autotune every stage of the GDN chain (ours and fla's) before step 1."""
from __future__ import annotations

import torch


def warmup(K: int = 128, V: int = 128, HV: int = 16, H: int | None = None, B: int = 1,
           T: int = 8192, dtype=torch.bfloat16, use_qk_l2norm_in_kernel: bool = True,
           use_gate_in_kernel: bool = True, use_beta_sigmoid_in_kernel: bool = True,
           output_final_state: bool = False, state_v_first: bool = True, backward: bool = True,
           device=None, verbose: bool = True) -> None:
    """Run the chain's fwd (+ bwd) once at these shapes (the defaults: fla's GatedDeltaNet
    layer's call) so every kernel compiles and autotunes now, and so the call signature may
    later run under CUDA graph capture. Runs the fla drift check first."""
    from .._common.compat import check_fla
    from .._common.progress import run_steps
    from .ops import chunk_gated_delta_rule

    check_fla()
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    H = H or HV

    def step():
        def r(*s, dt=dtype):
            return torch.randn(*s, device=device, dtype=dt, requires_grad=backward)

        kw = dict(use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, output_final_state=output_final_state,
                  use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, state_v_first=state_v_first)
        if use_gate_in_kernel:
            kw.update(use_gate_in_kernel=True, A_log=r(HV, dt=torch.float32), dt_bias=r(HV, dt=torch.float32))
            g = r(B, T, HV)
        else:
            g = torch.nn.functional.logsigmoid(torch.randn(B, T, HV, device=device)).to(dtype)
            g.requires_grad_(backward)
        beta = r(B, T, HV) if use_beta_sigmoid_in_kernel else \
            torch.rand(B, T, HV, device=device, dtype=dtype, requires_grad=backward)
        o, ht = chunk_gated_delta_rule(r(B, T, H, K), r(B, T, H, K), r(B, T, HV, V), g, beta, **kw)
        if backward:
            o.backward(torch.randn_like(o))
        if device != "cpu":
            torch.cuda.synchronize()

    run_steps("gdn", [(f"B={B} T={T} H={H} HV={HV} K={K} V={V} {dtype}", step)], verbose)
