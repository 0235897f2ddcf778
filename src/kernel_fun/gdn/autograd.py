"""The autograd.Function of Gated DeltaNet.

Saved for backward: the l2-normalized q and k with their rstd, v, the raw gate input and the
chunk-local cumulative gate (fp32 ``[B, T, HV]``, small), raw and activated beta, A_log,
dt_bias, the initial state, and the WY inverse A ``[B, T, HV, 64]`` (as fla saves them).
h and v_new are recomputed in the backward (w, u are never formed). Both directions run under
``on_device(q.device)`` (Triton launches on the current device; ``_common/device.py``).

``qkv``: the tensor q, k, v are column slices of (``ops._fused_qkv``; q, k, v then come detached):
the backward writes dq, dk, dv into one gradient of its shape and returns that, in place of three.
"""
from __future__ import annotations

import torch

from .._common import capture
from .._common import device as D
from .._common.tuning import alloc
from .._delta import inputs
from . import chain


class ChunkGatedDeltaRuleFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, beta, A_log, dt_bias, initial_state, scale, output_final_state,
                use_qk_l2norm, use_gate_in_kernel, use_beta_sigmoid, allow_neg_eigval,
                cu_seqlens, cu_seqlens_cpu, chunk_indices, signature, qkv=None):
        dtype, dev = q.dtype, q.device
        fused = bool(use_qk_l2norm)  # the inputs' stages in one launch of ours (chain.inputs_forward)
        with D.on_device(dev):
            if fused:
                q, q_rstd, k, k_rstd, v, g, beta_raw, beta, beta_scale, *prepared = chain.inputs_forward(
                    q, k, v, g, beta, A_log, dt_bias, use_gate_in_kernel, use_beta_sigmoid, allow_neg_eigval,
                    cu_seqlens, cu_seqlens_cpu, chunk_indices)
            else:
                q, q_rstd, k, k_rstd, v, g, beta_raw, beta, beta_scale = inputs.prepare(
                    q, k, v, g, beta, use_qk_l2norm, use_beta_sigmoid, allow_neg_eigval)
                prepared = None
            o, final_state, gc, A, chunk_indices, chunk_offsets = chain.forward(
                q, k, v, g, beta, A_log, dt_bias, scale, initial_state, output_final_state,
                use_gate_in_kernel, cu_seqlens, cu_seqlens_cpu, chunk_indices, prepared=prepared)
            o = o.to(dtype)
        ctx.save_for_backward(q, q_rstd, k, k_rstd, v, g, gc, beta_raw, beta, A, A_log, dt_bias,
                              initial_state, cu_seqlens, chunk_indices, chunk_offsets)
        ctx.flags = (scale, use_gate_in_kernel, use_beta_sigmoid, beta_scale, fused)
        ctx.signature = signature
        ctx.qkv = None if qkv is None else (tuple(qkv.shape), q.shape[2] * q.shape[3])
        if not capture.is_capturing():
            capture.mark_warm("gdn", signature, "fwd", dev)
        return o, final_state

    @staticmethod
    def backward(ctx, do, dht):
        (q, q_rstd, k, k_rstd, v, g, gc, beta_raw, beta, A, A_log, dt_bias, initial_state, cu_seqlens,
         chunk_indices, chunk_offsets) = ctx.saved_tensors
        scale, use_gate_in_kernel, use_beta_sigmoid, beta_scale, fused = ctx.flags
        dqkv = dq_out = dk_out = dv_out = None
        if ctx.qkv is not None:  # one gradient for the fused q/k/v tensor, written in its three parts
            shape, HK = ctx.qkv
            dqkv = alloc(shape, dtype=q.dtype, device=q.device)
            dq_out, dk_out = (dqkv[..., i * HK:(i + 1) * HK].unflatten(-1, q.shape[2:]) for i in (0, 1))
            dv_out = dqkv[..., 2 * HK:].unflatten(-1, v.shape[2:])
        with D.on_device(q.device):
            # grouped values with the inputs' backward ours: dq, dk come as each value head's share
            # (a program per value head in wy_dqk_bwd) and inputs_bwd adds the group's as it loads them
            per_head = fused and v.shape[2] > q.shape[2]
            dq, dk, dv, db, dg, dh0 = chain.backward(
                q, k, v, gc, beta, A, scale, initial_state, do.contiguous(), dht, cu_seqlens, chunk_indices,
                chunk_offsets, dv_out=dv_out, per_head=per_head)
            dA_log = ddt_bias = None
            if fused:
                dq, dk, db, dg, dA_log, ddt_bias = chain.inputs_backward(
                    q, q_rstd, dq, k, k_rstd, dk, beta_raw, db, use_beta_sigmoid, beta_scale, g, A_log, dt_bias, dg,
                    use_gate_in_kernel, cu_seqlens, chunk_indices, dq_out=dq_out, dk_out=dk_out)
            else:
                if q_rstd is not None:
                    dq = inputs.l2norm_bwd(q, q_rstd, dq)
                    dk = inputs.l2norm_bwd(k, k_rstd, dk)
                if use_beta_sigmoid:
                    db = inputs.beta_sigmoid_bwd(beta_raw, db, beta_scale)
                if use_gate_in_kernel:
                    dg, dA_log, ddt_bias = chain.gate_bwd(g, A_log, dt_bias, dg)
            grads = (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dg.to(g.dtype), db.to(beta_raw.dtype))
        if not capture.is_capturing():
            capture.mark_warm("gdn", ctx.signature, "bwd", q.device)
        if dqkv is not None:
            grads = (None, None, None, *grads[3:])
        return (*grads, dA_log, ddt_bias, dh0, None, None, None, None, None, None, None, None, None, None, dqkv)
