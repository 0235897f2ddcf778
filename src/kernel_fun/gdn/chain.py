"""The Gated DeltaNet chain: the forward and backward as a list of stages, each ours or fla's
own stage function (fla's fetched through ``_common/compat.py``, so drift is caught at warmup).

Shapes: q, k ``[B, T, H, K]``; v ``[B, T, HV, V]``; g, beta ``[B, T, HV]``; states
``[N, HV, K, V]`` fp32 (the public entry transposes fla's ``state_v_first`` layout around the
chain). The gate is kept as its chunk-local cumulative sum in log2 units (fla's convention).

| stage | forward | backward |
|---|---|---|
| l2norm of q, k; beta sigmoid; gate (+ in-op activation) cumsum | ours, one launch (``_kernels/inputs_fwd.py``); without the l2norm in the op: fla's ``fused_beta_sigmoid_fwd`` and ``gdn_gate_chunk_cumsum`` / ``chunk_local_cumsum`` | ours, one launch (``_kernels/inputs_bwd.py``); without the l2norm: fla's ``fused_beta_sigmoid_bwd``, ``gdn_gate_bwd`` |
| kkt + solve | ours (``_kernels/wy_inverse.py``: A only, one program per (chunk, qk head) for the group's value heads) | (A kept from the forward) |
| w, u | never formed: the scan makes v_new from A, v, beta | never formed: the recompute scan as the forward; the backward scan makes dv2^T w from A, beta |
| state scan | ours (``_delta`` state_scan_fwd, o made inside, h never written); above K = 128 split: the scan writes h and v_new, o from the gated scores and ``_kernels/output.py`` | ours: the forward scan again writing h and v_new; the gated scores (``gdn/_kernels/scores.py``); ``_delta`` state_scan_bwd making dv from them |
| dq, dk, dw, dg + WY backward + reverse cumsum + group sum | | ours, two kernels (``gdn/_kernels/wy_dqkwg_bwd.py``: ``wy_dv_bwd`` then ``wy_dqk_bwd``) |

fla's ``chunk_bwd_dqkwg`` (refused by fla on Hopper with Triton 3.4-3.7.0), ``prepare_wy_repr_bwd``,
``recompute_w_u_fwd``, ``chunk_gated_delta_rule_fwd_kkt_solve_kernel``,
``chunk_bwd_dv_local``, ``chunk_gated_delta_rule_bwd_dhu``, ``chunk_gated_delta_rule_fwd_h``,
``chunk_fwd_o`` and the backward's ``chunk_local_cumsum`` never run. Timed against fla's chain:
docs/gdn.md (the op bench's per-kernel table).
"""
from __future__ import annotations

from .._common.compat import fla_symbol
# The one place gdn reaches into the shared engine (kept small for the engine's refactors).
from .._delta import chunking
from .._delta._kernels.state_scan_bwd import state_scan_bwd
from .._delta._kernels.state_scan_fwd import state_scan_fwd
from ._kernels.inputs_bwd import inputs_bwd
from ._kernels.inputs_fwd import inputs_fwd
from ._kernels.output import chunk_output
from ._kernels.scores import gated_scores
from ._kernels.wy_dqkwg_bwd import wy_dqkwg_bwd
from ._kernels.wy_inverse import wy_inverse

RCP_LN2 = 1.4426950408889634  # log2(e): fla's gates are cumsummed in log2 space
BT = 64  # chunk size
# The forward's form: fused (the state scan makes o along its chain of chunks, h never written) at
# K <= SPLIT_ABOVE_K; split above it (the scan writes h and v_new and makes no o; the gated scores and
# ``chunk_output`` make o for every chunk at once, as fla's fwd_h + fwd_o): at K = 256 (fla's default
# GatedDeltaNet heads) the fused scan spills in every configuration (sm_90a, docs/gdn.md), the scan
# without o in none. tools/gdn_forms.py times the two forms against each other.
SPLIT_ABOVE_K = 128


def _fla(module: str, symbol: str):
    return fla_symbol(module, symbol)


def chunk_meta(cu_seqlens, cu_seqlens_cpu, chunk_indices=None):
    """(chunk_indices, chunk_offsets) for packed documents, or (None, None); a caller's
    ``chunk_indices`` (fla's signature takes them) are used as given."""
    if cu_seqlens is None or chunk_indices is None:
        return chunking.chunk_meta(cu_seqlens, BT, cu_seqlens_cpu)
    return chunk_indices, chunking.chunk_offsets(cu_seqlens, BT)


def gate_cumsum(g, A_log, dt_bias, use_gate_in_kernel, cu_seqlens, chunk_indices):
    """Chunk-local cumulative log2-space gate ``[B, T, HV]`` fp32 (gate function fused in)."""
    if use_gate_in_kernel:
        return _fla("fla.ops.gated_delta_rule.gate", "gdn_gate_chunk_cumsum")(
            g=g, A_log=A_log, chunk_size=BT, scale=RCP_LN2, dt_bias=dt_bias, cu_seqlens=cu_seqlens,
            chunk_indices=chunk_indices)
    return _fla("fla.ops.utils.cumsum", "chunk_local_cumsum")(
        g=g, chunk_size=BT, scale=RCP_LN2, cu_seqlens=cu_seqlens, chunk_indices=chunk_indices)


# With the l2norm in the op (the layer's call), the inputs' stages (l2norm of q and k, beta
# sigmoid, the gate and its chunk cumsum; their backward) run in one launch of ours each way
# (``_kernels/inputs_fwd.py``, ``inputs_bwd.py``), in place of fla's four kernels and four wrappers
# each way and the copies of strided q, k, v: fewer host launches (the model step idled on the host:
# docs/model.md; the model A/B went 1.119x -> 1.161x with it, docs/gdn.md). Without the l2norm,
# fla's stages (``inputs.prepare``, ``gate_cumsum``, ``gate_bwd``).


def inputs_forward(q, k, v, g, beta, A_log, dt_bias, use_gate_in_kernel, use_beta_sigmoid, allow_neg_eigval,
                   cu_seqlens, cu_seqlens_cpu, chunk_indices):
    """``inputs.prepare``'s returns with the l2norm of q and k (always: the fused path is taken
    only with ``use_qk_l2norm``), plus the cumulative gate ``gc`` and the chunk metadata for
    ``forward``: ``(q, q_rstd, k, k_rstd, v, g, beta_raw, beta, beta_scale, gc, chunk_indices,
    chunk_offsets)``."""
    chunk_indices, chunk_offsets = chunk_meta(cu_seqlens, cu_seqlens_cpu, chunk_indices)
    beta_scale = 2.0 if allow_neg_eigval else 1.0
    g, beta = g.contiguous(), beta.contiguous()  # saved raw for the backward (the kernel reads them so)
    q, q_rstd, k, k_rstd, v, gc, beta_act = inputs_fwd(
        q, k, v, g, beta, A_log, dt_bias, use_gate_in_kernel, use_beta_sigmoid, beta_scale, RCP_LN2,
        cu_seqlens=cu_seqlens, chunk_indices=chunk_indices, chunk_size=BT)
    return q, q_rstd, k, k_rstd, v, g, beta, beta_act, beta_scale, gc, chunk_indices, chunk_offsets


def inputs_backward(q, q_rstd, dq, k, k_rstd, dk, beta_raw, dbeta, use_beta_sigmoid, beta_scale, g, A_log, dt_bias,
                    dg, use_gate_in_kernel, cu_seqlens, chunk_indices, dq_out=None, dk_out=None):
    """``(dq, dk, dbeta, dg, dA_log, ddt_bias)`` through the stages ``inputs_forward`` ran (dq, dk
    written into ``dq_out``, ``dk_out`` where given)."""
    return inputs_bwd(q, q_rstd, dq, k, k_rstd, dk, beta_raw, dbeta, use_beta_sigmoid, beta_scale, g, A_log, dt_bias,
                      dg, use_gate_in_kernel, cu_seqlens=cu_seqlens, chunk_indices=chunk_indices, chunk_size=BT,
                      dq_out=dq_out, dk_out=dk_out)


def forward(q, k, v, g, beta, A_log, dt_bias, scale, initial_state, output_final_state, use_gate_in_kernel,
            cu_seqlens, cu_seqlens_cpu, chunk_indices=None, prepared=None):
    """q, k already l2-normalized and beta already activated where the call asks.
    ``prepared``: ``(gc, chunk_indices, chunk_offsets)`` as ``inputs_forward`` made them.
    Returns (o, final_state, gc, A, chunk_indices, chunk_offsets): gc the cumulative gate and A
    the WY inverse, both kept for the backward."""
    if prepared is not None:
        gc, chunk_indices, chunk_offsets = prepared
    else:
        chunk_indices, chunk_offsets = chunk_meta(cu_seqlens, cu_seqlens_cpu, chunk_indices)
        gc = gate_cumsum(g, A_log, dt_bias, use_gate_in_kernel, cu_seqlens, chunk_indices)
    A = wy_inverse(k, gc, beta, cu_seqlens=cu_seqlens, chunk_indices=chunk_indices, chunk_size=BT)
    scan = dict(g=gc, wy=(A, v, beta), scale=scale, initial_state=initial_state, output_final_state=output_final_state,
                cu_seqlens=cu_seqlens, chunk_indices=chunk_indices, chunk_offsets=chunk_offsets, chunk_size=BT)
    if k.shape[-1] <= SPLIT_ABOVE_K:
        o, final_state, _, _ = state_scan_fwd(q, k, None, None, **scan)
    else:
        _, final_state, h, v_new = state_scan_fwd(q, k, None, None, save_h=True, save_v_new=True, store_o=False, **scan)
        Aqk = gated_scores(q, k, gc, scale, cu_seqlens=cu_seqlens, chunk_indices=chunk_indices, chunk_size=BT)
        o = chunk_output(q, h, v_new, Aqk, gc, scale, cu_seqlens=cu_seqlens, chunk_indices=chunk_indices, chunk_size=BT)
    return o, final_state, gc, A, chunk_indices, chunk_offsets


def backward(q, k, v, gc, beta, A, scale, initial_state, do, dht, cu_seqlens, chunk_indices, chunk_offsets,
             dv_out=None, per_head=False):
    """Gradients w.r.t. q, k (the ones the chain saw: normalized where the op normalizes), v,
    the (activated) beta, the per-token natural-log gate, and the initial state:
    ``(dq, dk, dv, dbeta fp32, dg fp32, dh0 or None)``; dv written into ``dv_out`` where given.
    ``per_head``: dq, dk ``[B, T, HV, K]``, each value head's share (``inputs_backward`` adds them)."""
    # The forward scan again, now writing h (the state before each chunk) and v_new, and no
    # output (store_o=False: no q read, half the products, no o written); v_new from A, v, beta
    # as in the forward, so w and u are never formed.
    _, _, h, v_new = state_scan_fwd(
        q, k, None, None, g=gc, wy=(A, v, beta), scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
        chunk_indices=chunk_indices, chunk_offsets=chunk_offsets, chunk_size=BT, save_h=True, save_v_new=True,
        store_o=False)
    Aqk = gated_scores(q, k, gc, scale, cu_seqlens=cu_seqlens, chunk_indices=chunk_indices, chunk_size=BT)
    # dv2^T w made from A and beta in the scan (w = A diag(beta gamma) K)
    dh, dh0, dv2 = state_scan_bwd(
        q, k, None, do, None, g=gc, h0=initial_state, dht=dht, scale=scale, cu_seqlens=cu_seqlens,
        chunk_size=BT, chunk_indices=chunk_indices, chunk_offsets=chunk_offsets, A=Aqk, wy=(A, beta),
        A_tril=True)  # gated_scores stores zeros above the diagonal
    del Aqk
    dq, dk, dv, db, dg = wy_dqkwg_bwd(q, k, v, v_new, gc, beta, A, h, dh, do, dv2, scale, cu_seqlens=cu_seqlens,
                                      chunk_indices=chunk_indices, chunk_size=BT, dv_out=dv_out, per_head=per_head)
    return dq, dk, dv, db, dg, dh0


def gate_bwd(g_raw, A_log, dt_bias, dg):
    """(dg_raw, dA_log, ddt_bias) of the in-op gate from dg of the per-token log gate."""
    return _fla("fla.ops.gated_delta_rule.gate", "gdn_gate_bwd")(g=g_raw, A_log=A_log, dt_bias=dt_bias, dyg=dg)
