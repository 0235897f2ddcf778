"""KDA's Triton kernels, one stage per file.

- ``intra_bwd``: the intra-chunk backward (drop-in for fla's ``chunk_kda_bwd_intra``).
- ``wy_bwd``: the WY / state-gradient backward (drop-in for fla's ``chunk_kda_bwd_wy_dqkg_fused``).
- ``wy_intra_bwd``: those two in one kernel (``kda.chain.FUSE_WY_INTRA_BWD``, measured slower).
- ``score_grad``: the score gradient dAqk alone, the dA half of fla's ``chunk_kda_bwd_dAv``
  (``kda.chain.FUSE_DV_DHU``: its dv half is made inside our backward state scan).
- ``intra_fwd``: the forward intra stage (candidate, measured slower than fla's).

Conventions shared with fla 0.6.0: token-major tensors ``[B, T, heads, D]`` (``B = 1`` with
``cu_seqlens`` for variable-length batches), gates cumsummed inside each 64-token chunk in
log2 units (``g = RCP_LN2 * cumsum(log decay)``, so ``exp2(g_i - g_j) = exp(G_i - G_j)``),
grouped values ``HV = G * H`` with q/k at ``H`` heads and everything else at ``HV`` heads.
"""
from __future__ import annotations

import triton
import triton.language as tl


def chunk_indices_for(cu_seqlens, chunk_size: int):
    """``[NT, 2]`` (sequence id, chunk id within the sequence) for a varlen batch: fla's own
    ``prepare_chunk_indices`` (cached on the tensor), so our grid and fla's agree."""
    from ..._common.compat import fla_symbol

    return fla_symbol("fla.ops.utils.index", "prepare_chunk_indices")(cu_seqlens, chunk_size)


def chunk_grid(who: str, B: int, T: int, BT: int, cu_seqlens, chunk_indices):
    """``(chunk_indices, NT)`` for a (chunk, batch x head) grid: fla's chunk indices of a varlen
    batch (made when not given) and the number of chunks; varlen needs ``B == 1``."""
    if cu_seqlens is None:
        return chunk_indices, triton.cdiv(T, BT)
    if B != 1:
        raise ValueError(f"{who}: varlen (cu_seqlens) needs B == 1")
    if chunk_indices is None:
        chunk_indices = chunk_indices_for(cu_seqlens, BT)
    return chunk_indices, len(chunk_indices)


def launch(kernel, grid, config, *args, **kwargs):
    """Launch an autotuned kernel, or, with ``config`` (a ``triton.Config``), the underlying
    jit function with exactly that configuration (GPU tests check every configuration: Triton
    3.4-3.7.0 miscompiles some dot patterns on Hopper, per configuration)."""
    if config is None:
        return kernel[grid](*args, **kwargs)
    extra = {"maxnreg": config.maxnreg} if getattr(config, "maxnreg", None) else {}
    return kernel.fn[grid](*args, **kwargs, **config.kwargs, num_warps=config.num_warps,
                           num_stages=config.num_stages, **extra)


@triton.jit
def chunk_program(cu_seqlens, chunk_indices, T, H: tl.constexpr, HV: tl.constexpr, BT: tl.constexpr,
                  IS_VARLEN: tl.constexpr):
    """What a (chunk, batch x value head) program owns, grid (NT, B * HV): (batch row, value
    head, q/k head, global chunk number (the index into h-shaped [.., NT, ..] tensors, unique
    across the batch), first token (int64), valid rows of the chunk)."""
    i_t = tl.program_id(0).to(tl.int64)
    i_bh = tl.program_id(1).to(tl.int64)
    i_b = i_bh // HV
    i_hv = i_bh % HV
    if IS_VARLEN:
        i_tg = i_t
        i_n = tl.load(chunk_indices + i_t * 2).to(tl.int64)
        i_t = tl.load(chunk_indices + i_t * 2 + 1).to(tl.int64)
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
    else:
        i_tg = i_b * tl.cdiv(T, BT) + i_t
        bos = i_b * T
        eos = bos + T
    t0 = bos + i_t * BT
    return i_b, i_hv, i_hv // (HV // H), i_tg, t0, tl.minimum(eos - t0, BT).to(tl.int32)


@triton.jit
def bit_level(o_r):
    """[n, n] for a 16-row block: the highest bit where r and c differ (3..0), -1 on r == c.
    The pairs of one level share an anchor row (the intra stages' split of the gate factor)."""
    x_rc = o_r[:, None] ^ o_r[None, :]
    return tl.where(x_rc >= 8, 3, tl.where(x_rc >= 4, 2, tl.where(x_rc >= 2, 1, tl.where(x_rc >= 1, 0, -1))))

