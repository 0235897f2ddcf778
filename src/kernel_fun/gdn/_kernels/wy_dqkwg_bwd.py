"""GDN backward, one chunk at a time: the output/state gradients of q, k and the gate (fla's
``chunk_bwd_dqkwg``) with the WY backward (fla's ``prepare_wy_repr_bwd``), transpose-free, in
two kernels (``wy_dv_bwd.py``, then ``wy_dqk_bwd.py``); this module is the stage's launcher.

Replaces fla 0.6.0's pair ``chunk_bwd_dqkwg`` (fla/ops/common/chunk_o.py, which fla refuses on
Hopper with Triton 3.4-3.7.0: ``tl.trans`` of a dot result fed to a dot is miscompiled there,
fla #640) + ``prepare_wy_repr_bwd`` (fla/ops/gated_delta_rule/wy_fast.py, wrong at num_warps=4,
fla #988), then ``dk.add_(dk2)``, ``dg.add_(dg2)``, the chunk-local reverse cumsum of dg and the
group sum of dq, dk (grouped values). dw is never materialized.

Per chunk (BT = 64 tokens), value head, with G the chunk-local cumulative gate (natural units
below; the kernel reads it in log2 units as the chain keeps it), gamma = exp(G), Gamma_ij =
exp(G_i - G_j) for i >= j (else 0), S = h (the state before the chunk), dS = dh (the gradient
of the state after it), vn = v_new, dvn = dv2 (its full gradient, from the backward scan),
A = (I + StrictLower(diag(beta) K K^T * Gamma))^-1 (fla's forward intra stage):

    dq   = scale * (diag(gamma) do S^T + (do vn^T * Gamma) K)
    dk   = scale * (vn do^T * Gamma^T) Q + diag(gamma_L / gamma) vn dS^T        (output, state)
    dw   = -dvn S^T
    dk  += diag(beta gamma) A^T dw,  dv = diag(beta) A^T dvn                     (w, u)
    Z    = -(A^T dA A^T) * Gamma,  dA = StrictLower(dw (beta gamma K)^T + dvn (beta V)^T)
    dk  += diag(beta) Z K + Z^T diag(beta) K                                     (A)
    dbeta = gamma rowsum(A^T dw * K) + rowsum(A^T dvn * V) + rowsum(Z * K K^T)
    dG   = rowsum(dq * Q) - rowsum(dk_out,state * K) + beta gamma rowsum(A^T dw * K)
           + rowsum(Z * L) - colsum(Z * L)   (L = diag(beta) K K^T),
           and on the last row also gamma_L sum(S * dS) + sum(dk_state * K)
    dg   = the chunk-local reverse cumsum of dG (the gradient of the per-token log gate)

The two halves. ``wy_dv_bwd`` (one program per (chunk, value head)) holds the three [BT, BT]
fp32 accumulators ds = do vn^T, dA_u = dvn (beta V)^T and D = dvn (K S)^T over the V loop and
writes dv, dbeta, dAqk = scale ds * Gamma and dAkk = diag(beta) Z (the gradients of the two
gate-free score matrices, [B, T, HV, BT] in the input dtype) and the Z-part of dG.
``wy_dqk_bwd`` (one program per (chunk, qk head), looping over its G = HV / H value heads)
holds dq, dk [BT, K] over the V loop (taking the WY term of dw from dv: diag(beta gamma) A^T dvn
= diag(gamma) dv), adds dAqk K, dAqk^T Q, (dAkk + dAkk^T) K, and writes dq, dk once per qk head
and dg reverse-cumsummed.

Why two kernels: the single fused kernel held dq, dk and the three [BT, BT] accumulators (112 KB
of fp32 per program at K = 128) and took 255 registers with 824-2112 B of spill stack in every
configuration (sm_90a compile, K=V=128, 2026-12). Split, neither half spills on eight warps
(docs/gdn.md has the table); the shipped four-warp configs spill a little and are faster on the
H200. The cost is bytes: do, v_new and h are read by both halves and dv, dAqk, dAkk go through
memory: about 21X at B=8, T=8192, H=HV=16, K=V=128 (X = one [B, T, H, 128] bf16 tensor) against
the fused kernel's 12X. On the H200 the pair takes 3.68 ms at that shape against fla's dqkwg +
wy_repr_bwd + dv_local 3.14 ms, before the four-warp configs (docs/gdn.md).

No dot result is ever transposed into another dot (the Triton 3.4-3.7.0 Hopper pattern): every
transposed operand is loaded transposed from memory (A^T, h^T, dh^T, v_new^T, k^T, v^T, and
dAqk^T, dAkk^T written by the first half).
"""
from __future__ import annotations

import triton
from kernel_fun._common.tuning import cdiv

from .wy_dqk_bwd import wy_dqk_bwd
from .wy_dv_bwd import wy_dv_bwd


def wy_dqkwg_bwd(q, k, v, v_new, g, beta, A, h, dh, do, dv2, scale, cu_seqlens=None, chunk_indices=None,
                 chunk_size: int = 64, out_dtype=None, dv_out=None, per_head: bool = False, *,
                 dv_config: triton.Config | None = None, dqk_config: triton.Config | None = None):
    """The GDN backward's per-chunk gradients (fla's ``chunk_bwd_dqkwg`` + ``prepare_wy_repr_bwd``
    + the dk/dg adds + the reverse cumsum of dg + the group sum of dq, dk), in two launches.

    q, k ``[B, T, H, K]``; v, v_new, do, dv2 ``[B, T, HV, V]`` (dv2: the full gradient of v_new,
    from the backward state scan); g ``[B, T, HV]`` fp32 chunk-local cumulative log2 gate; beta
    ``[B, T, HV]`` (activated); A ``[B, T, HV, BT]`` (the WY inverse, with its zeros above the diagonal stored: ``wy_inverse``'s); h,
    dh ``[B, NT, HV, K, V]`` (the states before each chunk and their gradients after it, key-major);
    cu_seqlens ``[N + 1]`` with chunk_indices ``[NT, 2]`` (fla's prepare_chunk_indices) for packed
    documents. Returns ``(dq, dk [B, T, H, K]`` in ``out_dtype`` (q's by default), ``dv [B, T, HV, V]``
    in v's dtype, ``dbeta [B, T, HV]`` fp32, ``dg [B, T, HV]`` fp32: the gradient of the per-token
    natural-log gate, already reverse-cumsummed). ``dv_out``: where to write dv (a ``[B, T, HV, V]``
    view whose rows may be strided: the v part of a fused q/k/v gradient), else a new tensor. ``per_head``: dq,
    dk ``[B, T, HV, K]``, each value head's share, unsummed (``wy_dqk_bwd``). ``dv_config`` / ``dqk_config`` force one
    configuration of each half (``wy_dv_bwd.CONFIGS``, ``wy_dqk_bwd.CONFIGS``).
    """
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    BT = chunk_size
    if HV % H or K > 256 or tuple(k.shape) != (B, T, H, K):
        raise ValueError(f"wy_dqkwg_bwd: q {tuple(q.shape)} k {tuple(k.shape)} v {tuple(v.shape)}")
    for name, t in (("v_new", v_new), ("do", do), ("dv2", dv2)):
        if tuple(t.shape) != (B, T, HV, V):
            raise ValueError(f"wy_dqkwg_bwd: {name} {tuple(t.shape)} must be {(B, T, HV, V)}")
    if tuple(g.shape) != (B, T, HV) or tuple(beta.shape) != (B, T, HV) or tuple(A.shape) != (B, T, HV, BT):
        raise ValueError(f"wy_dqkwg_bwd: g {tuple(g.shape)} beta {tuple(beta.shape)} A {tuple(A.shape)}")
    is_varlen = cu_seqlens is not None
    if is_varlen:
        if B != 1 or chunk_indices is None:
            raise ValueError("wy_dqkwg_bwd: cu_seqlens needs B == 1 and chunk_indices")
        NT = len(chunk_indices)
    else:
        NT = cdiv(T, BT)
    if tuple(h.shape) != (B, NT, HV, K, V):
        raise ValueError(f"wy_dqkwg_bwd: h {tuple(h.shape)} must be {(B, NT, HV, K, V)}")
    if tuple(dh.shape) != tuple(h.shape):
        raise ValueError(f"wy_dqkwg_bwd: dh {tuple(dh.shape)} must be h's {tuple(h.shape)}")
    if dv_out is not None and (tuple(dv_out.shape) != (B, T, HV, V) or dv_out.dtype != v.dtype):
        raise ValueError(f"wy_dqkwg_bwd: dv_out {tuple(dv_out.shape)} {dv_out.dtype} must be {(B, T, HV, V)} {v.dtype}")
    q, k, v, v_new, g, beta, A, h, dh, do, dv2 = (
        x.contiguous() for x in (q, k, v, v_new, g, beta, A, h, dh, do, dv2))
    dv, db, dAqk, dAkk, dgz = wy_dv_bwd(k, v, v_new, g, beta, A, h, do, dv2, scale, NT, cu_seqlens=cu_seqlens,
                                        chunk_indices=chunk_indices, chunk_size=BT, dv=dv_out, config=dv_config)
    dq, dk, dg = wy_dqk_bwd(q, k, v_new, g, h, dh, do, dv, dAqk, dAkk, dgz, scale, NT, cu_seqlens=cu_seqlens,
                            chunk_indices=chunk_indices, chunk_size=BT, out_dtype=out_dtype, per_head=per_head,
                            config=dqk_config)
    return dq, dk, dv, db, dg
