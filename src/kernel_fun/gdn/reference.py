"""Plain-torch Gated DeltaNet reference, written from the math: the oracle the tests hold our
chain to.

The whole op, token by token in fp64 (differentiable, so gradients come from autograd):
optional l2norm of q and k (fla's eps 1e-6), the optional in-op gate
``-exp(A_log) * softplus(a + dt_bias)`` (as fla's ``naive_gdn_gate``: one A_log and dt_bias per
value head), the optional beta sigmoid (times 2 with ``allow_neg_eigval``), then the gated
delta recurrence of ``_delta.reference.naive_recurrence_ref`` with a scalar (per head) gate.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .._delta.reference import naive_recurrence_ref


def gdn_gate_ref(a: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor | None) -> torch.Tensor:
    """Natural-log per-token decay ``[B, T, HV]`` from the raw gate input ``a [B, T, HV]``."""
    HV = a.shape[-1]
    x = a if dt_bias is None else a + dt_bias.reshape(HV).to(a.dtype)
    return -A_log.reshape(HV).to(a.dtype).exp() * F.softplus(x)


def chunk_gated_delta_rule_ref(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                               use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False,
                               allow_neg_eigval=False, state_v_first=False, cu_seqlens=None,
                               use_gate_in_kernel=False, A_log=None, dt_bias=None, dtype=torch.float64):
    """Same arguments and returns as ``chunk_gated_delta_rule`` (o ``[B, T, HV, V]``, the final
    state in initial_state's layout, or None), computed in ``dtype`` from the math."""
    q, k, v, g, beta = (t.to(dtype) for t in (q, k, v, g, beta))
    if use_qk_l2norm_in_kernel:
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    if use_gate_in_kernel:
        g = gdn_gate_ref(g, A_log.to(dtype), None if dt_bias is None else dt_bias.to(dtype))
    if use_beta_sigmoid_in_kernel:
        beta = beta.sigmoid() * (2.0 if allow_neg_eigval else 1.0)
    h0 = None if initial_state is None else initial_state.to(dtype)
    if h0 is not None and state_v_first:
        h0 = h0.transpose(-1, -2)
    o, ht = naive_recurrence_ref(q, k, v, beta, g=g, scale=scale, initial_state=h0,
                                 output_final_state=output_final_state, cu_seqlens=cu_seqlens, dtype=dtype)
    if ht is not None and state_v_first:
        ht = ht.transpose(-1, -2)
    return o, ht
