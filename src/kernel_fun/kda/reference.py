"""Plain-torch KDA reference, written from the math: the oracle the tests hold our chain to.

The whole op, token by token in fp64 (differentiable, so gradients come from autograd):
optional l2norm of q and k, the optional in-op gate ``-exp(A_log) * softplus(g + dt_bias)``,
the optional beta sigmoid (times 2 with ``allow_neg_eigval``), then the gated delta
recurrence of ``_delta.reference.naive_recurrence_ref`` with a per-channel gate.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .._delta.reference import naive_recurrence_ref


def kda_gate_ref(g: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor | None) -> torch.Tensor:
    """Natural-log per-token decay ``[B, T, HV, K]`` from the raw gate input."""
    HV, K = g.shape[-2:]
    x = g if dt_bias is None else g + dt_bias.view(HV, K).to(g.dtype)
    return -A_log.to(g.dtype).exp().view(HV, 1) * F.softplus(x)


def chunk_kda_ref(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                  use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                  use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, cu_seqlens=None,
                  A_log=None, dt_bias=None, dtype=torch.float64):
    """Same arguments and returns as ``chunk_kda`` (o ``[B, T, HV, V]``, final state or None),
    computed in ``dtype`` from the math."""
    q, k, v, g, beta = (t.to(dtype) for t in (q, k, v, g, beta))
    if use_qk_l2norm_in_kernel:
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6)  # fla's l2norm, eps 1e-6
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    if use_gate_in_kernel:
        g = kda_gate_ref(g, A_log.to(dtype), None if dt_bias is None else dt_bias.to(dtype))
    if use_beta_sigmoid_in_kernel:
        beta = beta.sigmoid() * (2.0 if allow_neg_eigval else 1.0)
    h0 = None if initial_state is None else initial_state.to(dtype)
    return naive_recurrence_ref(q, k, v, beta, gk=g, scale=scale, initial_state=h0,
                                output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                                dtype=dtype)
