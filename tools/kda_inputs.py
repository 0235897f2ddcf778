"""The KDA production-like stage inputs both stage benches start from (scripts/kda_stage_bench.py,
scripts/delta_scan_bench.py): l2-normalized q, k, random v, sigmoid beta, and an in-op gate
through fla's kda_gate_chunk_cumsum: model-like (Mamba-style A in [1, 16], dt in [1e-3, 1e-1])
by default, or with ``kernel-fun bench``'s standard-normal A_log and dt_bias (``gates="bench"``).
Seeded (torch.manual_seed(0)); the random draws come in this order, so a caller drawing more
afterwards gets the same values as before this helper existed."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def qkv_beta(B, T, H, HV, K, V):
    """Seeds torch (0), then draws l2-normalized q, k, random v and sigmoid beta, bf16 on the
    GPU, in that order (the delta-rule benches' common start; gates are drawn after)."""
    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    q = F.normalize(torch.randn(B, T, H, K, device=dev), dim=-1).to(dt)
    k = F.normalize(torch.randn(B, T, H, K, device=dev), dim=-1).to(dt)
    v = torch.randn(B, T, HV, V, device=dev, dtype=dt)
    beta = torch.randn(B, T, HV, device=dev).sigmoid().to(dt)
    return q, k, v, beta


def production_inputs(B, T, H, HV, K, V, gates: str = "model"):
    """(q, k, v, beta, gk, scale), bf16 on the GPU; gk fp32 [B, T, HV, K] (log2, chunk-local).

    gates="model": A in [1, 16], dt in [1e-3, 1e-1] (gentle: about 0.5 log2 per token);
    gates="bench": A_log and dt_bias standard normal, as ``kernel-fun bench`` draws them
    (steeper: a few log2 per token, tens on some heads), for stages whose work depends on the
    gate (the intra backward's one anchor)."""
    from fla.ops.kda.gate import kda_gate_chunk_cumsum
    from fla.ops.utils.constant import RCP_LN2

    q, k, v, beta = qkv_beta(B, T, H, HV, K, V)
    dev, dt = "cuda", torch.bfloat16
    g_raw = torch.randn(B, T, HV, K, device=dev, dtype=dt)
    if gates == "bench":
        A_log = torch.randn(HV, device=dev)
        dt_bias = torch.randn(HV * K, device=dev)
    elif gates == "model":
        A_log = torch.empty(HV, device=dev).uniform_(1, 16).log()
        dt_init = torch.exp(torch.empty(HV * K, device=dev).uniform_(math.log(1e-3), math.log(1e-1)))
        dt_bias = dt_init + torch.log(-torch.expm1(-dt_init))  # inverse softplus
    else:
        raise ValueError(f"gates: 'model' or 'bench', got {gates!r}")
    gk = kda_gate_chunk_cumsum(g=g_raw, A_log=A_log, dt_bias=dt_bias, scale=RCP_LN2, chunk_size=64)
    return q, k, v, beta, gk, K ** -0.5
