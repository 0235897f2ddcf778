"""The autograd.Function of KDA.

Saved for backward: the l2-normalized q and k with their rstd, v, the raw gate g (the
cumulative gate is recomputed, as fla does, so no fp32 [B, T, HV, K] tensor is kept), raw and
activated beta, A_log, dt_bias, the initial state, and the two [B, T, HV, 64] intra-chunk
matrices Aqk and Akk. w, u, h and v_new are recomputed in the backward. Both directions run
under ``on_device(q.device)`` (Triton launches on the current device; ``_common/device.py``).
"""
from __future__ import annotations

import torch

from .._common import capture
from .._common import device as D
from .._delta import inputs
from . import chain


class ChunkKDAFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, beta, A_log, dt_bias, initial_state, scale, output_final_state,
                use_qk_l2norm, use_gate_in_kernel, use_beta_sigmoid, allow_neg_eigval,
                cu_seqlens, cu_seqlens_cpu, signature):
        dtype, dev = q.dtype, q.device
        with D.on_device(dev):
            q, q_rstd, k, k_rstd, v, g, beta_raw, beta, beta_scale = inputs.prepare(
                q, k, v, g, beta, use_qk_l2norm, use_beta_sigmoid, allow_neg_eigval)
            o, final_state, Aqk, Akk, chunk_indices, chunk_offsets = chain.forward(
                q, k, v, g, beta, A_log, dt_bias, scale, initial_state, output_final_state,
                use_gate_in_kernel, cu_seqlens, cu_seqlens_cpu)
            o = o.to(dtype)
        ctx.save_for_backward(q, q_rstd, k, k_rstd, v, g, beta_raw, beta, A_log, dt_bias,
                              initial_state, Aqk, Akk, cu_seqlens, chunk_indices, chunk_offsets)
        ctx.flags = (scale, use_gate_in_kernel, use_beta_sigmoid, beta_scale)
        ctx.signature = signature
        if not capture.is_capturing():
            capture.mark_warm("kda", signature, "fwd", dev)
        return o, final_state

    @staticmethod
    def backward(ctx, do, dht):
        (q, q_rstd, k, k_rstd, v, g, beta_raw, beta, A_log, dt_bias, initial_state, Aqk, Akk,
         cu_seqlens, chunk_indices, chunk_offsets) = ctx.saved_tensors
        scale, use_gate_in_kernel, use_beta_sigmoid, beta_scale = ctx.flags
        # with q_rstd/k_rstd (use_qk_l2norm_in_kernel), dq and dk come back for the raw q and k
        # (the l2norm backward is the chain's last step, or fused into its intra backward)
        with D.on_device(q.device):
            dq, dk, dv, db, dg, dh0, dA_log, ddt_bias = chain.backward(
                q, k, v, g, beta, A_log, dt_bias, scale, initial_state, Aqk, Akk, do.contiguous(),
                dht, use_gate_in_kernel, cu_seqlens, chunk_indices, chunk_offsets, q_rstd, k_rstd)
            if use_beta_sigmoid:
                db = inputs.beta_sigmoid_bwd(beta_raw, db, beta_scale)
            grads = (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dg.to(g.dtype), db.to(beta_raw.dtype))
        if not capture.is_capturing():
            capture.mark_warm("kda", ctx.signature, "bwd", q.device)
        return (*grads, dA_log, ddt_bias, dh0, None, None, None, None, None, None, None, None, None)
