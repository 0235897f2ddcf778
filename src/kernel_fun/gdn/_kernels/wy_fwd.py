"""GDN's forward intra-chunk stage: the gated WY inverse and w, u, in one pass per chunk.

Per chunk (BT = 64 tokens) and value head, with G the chunk-local cumulative gate (log2 units,
as the chain keeps it), gamma = exp2(G) and Gamma_ij = exp2(G_i - G_j):

    L = StrictLower(diag(beta) K K^T * Gamma)         [BT, BT]
    A = (I + L)^-1                                     (stored, in k's dtype, for the backward)
    w = A diag(beta gamma) K,   u = A diag(beta) V

Replaces fla 0.6.0's ``chunk_gated_delta_rule_fwd_intra`` (its kkt + solve kernel writes A into
a zero-filled buffer, then ``recompute_w_u_fwd`` reads A, k, v back to make w, u): here k is read
once, A is written once (every element of the chunk's rows, zeros above the diagonal, so no
zero fill), and w, u come from A while it is in registers. Same rounding points as fla: A is
rounded to k's dtype before the two products, the products' operands are in k's dtype and their
accumulation fp32.

The inverse, in registers, by doubling the block size: with X the inverse of every diagonal
s-block of I + L, each 2s-block [[P, 0], [C, Q]] has the inverse [[Pi, 0], [-Qi C Pi, Qi]], so

    X <- X - X Lc X      (Lc: L on the lower-left s-block of every 2s-block)

from X = I - L on the odd rows' first subdiagonal (s = 1, no product) through s = 32: ten
[BT, BT] products, tf32 for 16-bit inputs (as fla's block merge), exact fp32 for fp32 inputs.
The first version inverted the [16, 16] diagonal blocks by forward substitution (rows one at a
time, the four blocks together) and merged them with four products: 0.72-1.5 ms at B=4 T=4096
H=16 HV=32 on the H200 against fla's kkt_solve + recompute_w_u 0.35 ms; the serial steps'
cross-warp row sums and broadcasts cost it (docs/gdn.md). On the CPU (torch, tf32 rounding
emulated, 30 draws, 2026-12-02) A's error against fp64 is 1.3e-4 for random keys and 1.7e-3 for
keys with k_i . k_j about 0.9, against 1.0e-4 and 1.3e-3 for exact diagonal blocks with a tf32
merge (fla's scheme); A's own bf16 rounding is 6e-4 and 1.2e-3.

Grid: one program per (chunk, value head) (``_delta.chunking.chunk_program``); the group's value
heads re-read their qk head's k (from L2 when they run together).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernel_fun._common.tuning import (  # noqa: F401  (config_name: every kernel module names its configs)
    alloc, autotune_cache, autotune_configs, cdiv, config_name, install_interpreter_shims, launch, next_pow2)
from kernel_fun._common.witness import record_launch
from kernel_fun._delta.chunking import chunk_grid, chunk_program


install_interpreter_shims()

# (BV, num_warps, num_stages, maxnreg). The first is the only one the interpreter runs (BV = 32:
# the CPU tests' V = 64 exercises the V loop). sm_90a registers (Triton 3.6 ptxas, K = V = 128,
# tools/sass_stats.py, 2026-12-02): BV32 w4 241, BV64 w4 255, BV128 w4 242, no spill; capped at
# 168, 104 B (BV32) and 80 B (BV64) of stack. Eight warps are candidates only: a [64, 64] product
# on two warpgroups is computed by both (the first version ran 1.5 ms on eight warps against
# 0.87 on four, H200, B=4 T=4096 H=16 HV=32, 2026-12-02).
_CONFIG_TUPLES = [(32, 4, 2, None), (64, 4, 2, None), (128, 4, 2, None), (32, 4, 2, 168)]
_CANDIDATE_TUPLES = [(64, 4, 2, 168), (64, 8, 2, None), (128, 8, 2, None)]
CONFIGS = [triton.Config({"BV": bv}, num_warps=nw, num_stages=ns, maxnreg=mr) for bv, nw, ns, mr in _CONFIG_TUPLES]
CANDIDATES = [triton.Config({"BV": bv}, num_warps=nw, num_stages=ns, maxnreg=mr)
              for bv, nw, ns, mr in _CANDIDATE_TUPLES]


def _prune(configs, named_args, **kwargs):
    """Drop value blocks wider than V (all masked lanes); keep at least one configuration."""
    V = kwargs.get("V", named_args.get("V"))
    kept = [c for c in configs if c.kwargs["BV"] <= max(V, 32)]
    return kept or list(configs[:1])


@triton.jit(do_not_specialize=["T"])
def wy_fwd_kernel(
    k,  # [B, T, H, K]
    v,  # [B, T, HV, V]
    g,  # [B, T, HV] fp32, chunk-local cumulative log2 gate
    beta,  # [B, T, HV]
    A,  # [B, T, HV, BT] out: (I + L)^-1
    w,  # [B, T, HV, K] out
    u,  # [B, T, HV, V] out
    cu_seqlens,  # [N + 1] | unused
    chunk_indices,  # [NT, 2] | unused
    T,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, KP: tl.constexpr, BV: tl.constexpr, LOG2_BT: tl.constexpr,
    IS_VARLEN: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    _, i_hv, i_h, _, row0, n_valid = chunk_program(cu_seqlens, chunk_indices, T, H, HV, BT, IS_VARLEN)
    o_i = tl.arange(0, BT)
    m_t = o_i < n_valid
    o_k = tl.arange(0, KP)
    m_k = o_k < K
    m_tt = m_t[:, None] & m_t[None, :]

    b_k = tl.load(k + (row0 * H + i_h) * K + o_i[:, None] * (H * K) + o_k[None, :],
                  mask=m_t[:, None] & m_k[None, :], other=0.0)
    b_g = tl.load(g + row0 * HV + i_hv + o_i * HV, mask=m_t, other=0.0).to(tl.float32)
    b_beta = tl.load(beta + row0 * HV + i_hv + o_i * HV, mask=m_t, other=0.0).to(tl.float32)

    # L = StrictLower(diag(beta) K K^T * Gamma); K^T is the transpose of a loaded tile (not of a
    # product: the Triton 3.4-3.7.0 Hopper miscompile concerns transposed dot results, fla #640).
    # Gamma is formed under the mask before it multiplies (exp2 overflows above the diagonal).
    m_strict = (o_i[:, None] > o_i[None, :]) & m_tt
    b_kk = tl.dot(b_k, tl.trans(b_k), input_precision=DOT_PRECISION)
    b_L = tl.where(m_strict, b_kk * tl.exp2(tl.where(m_strict, b_g[:, None] - b_g[None, :], 0.0)), 0.0)
    b_L = b_L * b_beta[:, None]

    # (I + L)^-1 by doubling the block size: with X the inverse of every diagonal s-block of
    # I + L, the inverse of each 2s-block [[P, 0], [C, Q]] is [[Pi, 0], [-Qi C Pi, Qi]], i.e.
    # X <- X - X Lc X with Lc = L on the lower-left s-block of every 2s-block. s = 1 needs no
    # product (X = I - L on the first subdiagonal's odd rows); s = 2 ... 32, two products each.
    m_diag = o_i[:, None] == o_i[None, :]
    m_sub = ((o_i[:, None] % 2) == 1) & (o_i[None, :] == o_i[:, None] - 1)
    b_x = tl.where(m_diag, 1.0, 0.0) - tl.where(m_sub, b_L, 0.0)
    for lvl in tl.static_range(1, LOG2_BT):
        # the lower-left s-block of every 2s-block (s = 2**lvl): rows of an odd s-block, columns
        # of the even s-block before it
        r_blk = o_i // (1 << lvl)
        m_c = (((r_blk[:, None] // 2) == (r_blk[None, :] // 2)) & ((r_blk[:, None] % 2) == 1)
               & ((r_blk[None, :] % 2) == 0))
        b_xl = tl.dot(b_x, tl.where(m_c, b_L, 0.0), input_precision=DOT_PRECISION)
        b_x = b_x - tl.dot(b_xl, b_x, input_precision=DOT_PRECISION)
    # Rows and columns of tokens past the end of a sequence are zero in L, so their A entries
    # are those of I: the rows are not stored, the columns sit above the diagonal of the stored ones.
    b_x = tl.where((o_i[:, None] >= o_i[None, :]) & m_tt, b_x, 0.0)
    dt_in = k.dtype.element_ty
    b_xc = b_x.to(dt_in)
    p_a = A + (row0 * HV + i_hv) * BT + o_i[:, None] * (HV * BT) + o_i[None, :]
    tl.store(p_a, b_xc.to(A.dtype.element_ty), mask=m_t[:, None])

    # w = A diag(beta gamma) K,  u = A diag(beta) V (k loaded again, from L1/L2: holding it
    # across the inverse cost registers)
    b_k = tl.load(k + (row0 * H + i_h) * K + o_i[:, None] * (H * K) + o_k[None, :],
                  mask=m_t[:, None] & m_k[None, :], other=0.0)
    b_kb = (b_k.to(tl.float32) * (b_beta * tl.exp2(b_g))[:, None]).to(dt_in)
    b_w = tl.dot(b_xc, b_kb, input_precision=DOT_PRECISION)
    tl.store(w + (row0 * HV + i_hv) * K + o_i[:, None] * (HV * K) + o_k[None, :], b_w.to(w.dtype.element_ty),
             mask=m_t[:, None] & m_k[None, :])
    p_v = v + (row0 * HV + i_hv) * V
    p_u = u + (row0 * HV + i_hv) * V
    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_tv = m_t[:, None] & (o_v < V)[None, :]
        b_v = tl.load(p_v + o_i[:, None] * (HV * V) + o_v[None, :], mask=m_tv, other=0.0)
        b_vb = (b_v.to(tl.float32) * b_beta[:, None]).to(dt_in)
        b_u = tl.dot(b_xc, b_vb, input_precision=DOT_PRECISION)
        tl.store(p_u + o_i[:, None] * (HV * V) + o_v[None, :], b_u.to(u.dtype.element_ty), mask=m_tv)


wy_fwd_kernel_tuned = triton.autotune(
    configs=autotune_configs(CONFIGS), **autotune_cache(),
    key=["H", "HV", "K", "V", "BT", "IS_VARLEN"],
    prune_configs_by={"early_config_prune": _prune},
)(wy_fwd_kernel)


def wy_fwd(k, v, g, beta, cu_seqlens=None, chunk_indices=None, chunk_size: int = 64,
           *, config: triton.Config | None = None):
    """The gated WY representation of every chunk: ``(w [B, T, HV, K], u [B, T, HV, V],
    A [B, T, HV, BT])``, w and A in k's dtype, u in v's (what fla 0.6.0's
    ``chunk_gated_delta_rule_fwd_intra`` returns, same argument names).

    k ``[B, T, H, K]`` (l2-normalized where the op normalizes); v ``[B, T, HV, V]``, HV a
    multiple of H; g ``[B, T, HV]`` fp32, the chunk-local cumulative log2 gate; beta
    ``[B, T, HV]`` (activated); cu_seqlens ``[N + 1]`` with B == 1 for packed documents
    (``chunk_indices``, fla's ``prepare_chunk_indices``, made when not given). A's rows hold
    zeros above the diagonal and past their sequence's end within the last chunk. ``config``
    forces one configuration (``CONFIGS``)."""
    B, T, H, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    BT = chunk_size
    if (BT != 64 or K > 256 or HV % H or tuple(v.shape[:2]) != (B, T) or tuple(g.shape) != (B, T, HV)
            or tuple(beta.shape) != (B, T, HV)):
        raise ValueError(f"wy_fwd: k {tuple(k.shape)} v {tuple(v.shape)} g {tuple(g.shape)} "
                         f"beta {tuple(beta.shape)} chunk_size {BT}")
    chunk_indices, NT = chunk_grid("wy_fwd", B, T, BT, cu_seqlens, chunk_indices)
    k, v, g, beta = k.contiguous(), v.contiguous(), g.contiguous(), beta.contiguous()
    dev = k.device
    A = alloc((B, T, HV, BT), dtype=k.dtype, device=dev)
    w = alloc((B, T, HV, K), dtype=k.dtype, device=dev)
    u = alloc((B, T, HV, V), dtype=v.dtype, device=dev)
    is_varlen = cu_seqlens is not None
    args = dict(k=k, v=v, g=g, beta=beta, A=A, w=w, u=u, cu_seqlens=cu_seqlens if is_varlen else g,
                chunk_indices=chunk_indices if is_varlen else g, T=T, H=H, HV=HV, K=K, V=V, BT=BT,
                KP=max(16, next_pow2(K)), LOG2_BT=BT.bit_length() - 1, IS_VARLEN=is_varlen,
                DOT_PRECISION="ieee" if k.dtype == torch.float32 else "tf32")
    launch(wy_fwd_kernel_tuned, (NT, B * HV), config, **args)
    record_launch("gdn.wy_fwd")
    return w, u, A
