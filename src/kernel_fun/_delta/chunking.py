"""Chunking of the delta-rule engine: the chunk metadata of packed documents (``cu_seqlens``)
and what one program of a stage owns.

Two grids, one per kind of stage:

- chunk-parallel stages (the intra and WY backward, the score gradient, the gate pass): grid
  ``(NT, B * HV)``, one program per (chunk, batch x value head): ``chunk_grid`` on the host,
  ``chunk_program`` in the kernel;
- the state scans: one program per (V-block, value head, sequence), V-blocks of one head
  adjacent: ``scan_grid`` on the host, ``scan_program`` in the kernel. With packed documents
  the sequences are launched longest first (``scan_order``): a scan program walks its whole
  document, so a long document launched last would run alone after the others.

Varlen metadata is fla's own (``prepare_chunk_indices`` / ``prepare_chunk_offsets``, cached on
the ``cu_seqlens`` tensor), so our grids and fla's stages in the same chain agree.
Conventions shared with fla 0.6.0: token-major tensors ``[B, T, heads, D]`` (``B = 1`` with
``cu_seqlens``), grouped values ``HV = G * H``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._common import capture
from .._common.compat import fla_symbol
from .._common.tuning import cdiv


def chunk_indices(cu_seqlens, chunk_size: int, cu_seqlens_cpu=None):
    """``[NT, 2]`` (sequence id, chunk id within the sequence) of a varlen batch."""
    return fla_symbol("fla.ops.utils.index", "prepare_chunk_indices")(
        cu_seqlens, chunk_size, cu_seqlens_cpu=cu_seqlens_cpu)


def chunk_offsets(cu_seqlens, chunk_size: int):
    """``[N + 1]``: the first chunk of each sequence in the batch's chunk axis (h's layout)."""
    return fla_symbol("fla.ops.utils.index", "prepare_chunk_offsets")(cu_seqlens, chunk_size)


def chunk_meta(cu_seqlens, chunk_size: int, cu_seqlens_cpu=None):
    """``(chunk_indices, chunk_offsets)`` for packed documents, or ``(None, None)``."""
    if cu_seqlens is None:
        return None, None
    return chunk_indices(cu_seqlens, chunk_size, cu_seqlens_cpu), chunk_offsets(cu_seqlens, chunk_size)


def check_varlen_batch(who: str, B: int, cu_seqlens) -> None:
    """Packed documents come as one row: ``B == 1`` with ``cu_seqlens``."""
    if cu_seqlens is not None and B != 1:
        raise ValueError(f"{who}: varlen (cu_seqlens) needs B == 1, got B={B}")


def chunk_grid(who: str, B: int, T: int, BT: int, cu_seqlens, indices):
    """``(chunk_indices, NT)`` for a (chunk, batch x head) grid: the chunk indices of a varlen
    batch (made when not given) and the number of chunks."""
    if cu_seqlens is None:
        return indices, cdiv(T, BT)
    check_varlen_batch(who, B, cu_seqlens)
    if indices is None:
        indices = chunk_indices(cu_seqlens, BT)
    return indices, len(indices)


def total_chunks(B: int, T: int, BT: int, cu_seqlens, indices, offsets):
    """``(NT, chunk_offsets)``: the length of h's chunk axis (summed over sequences when
    varlen; read from ``indices`` when given, which saves a device sync) and the chunk offsets
    of a varlen batch (made when not given)."""
    if cu_seqlens is None:
        return cdiv(T, BT), offsets
    if offsets is None:
        offsets = chunk_offsets(cu_seqlens, BT)
    return (len(indices) if indices is not None else int(offsets[-1])), offsets


_SCAN_ORDER_CACHE: list = []  # [(cu_seqlens, its _version, order)], most recent last


def scan_order(cu_seqlens):
    """``[N]`` int32 on cu_seqlens' device: the sequence ids, longest first (ties in order), the
    order in which the state scans launch the sequences of a varlen batch.

    Why: one scan program walks a whole document, and the GPU starts programs in id order. With
    the documents in their own order a long one that comes last starts only when earlier
    programs free an SM and then runs alone: at B=1, T=65,536 in 16 documents (longest 154
    chunks, 1,033 in all), 16 heads, one program per head on 132 SMs, a greedy schedule ends at
    226 chunk-steps in the documents' order against 154 longest first (the longest document
    alone: the floor). Longest-first is the classic list-scheduling rule (LPT).

    Made on the device (no host sync) and cached for the last few cu_seqlens tensors (the
    forward and backward scans of one step share it), keyed by identity and the tensor's
    version counter, so an in-place refill of the same tensor makes a new order. Any order is
    a permutation of the sequences, so a stale one could only cost time, never a wrong result.
    Under CUDA graph capture it is made fresh and not cached: the sort is then part of the graph
    (each replay orders the documents it is given), and a tensor made in a capture holds nothing
    until the graph first replays, so an eager call must never be handed one. An inference
    tensor (made under ``torch.inference_mode``) has no version counter: its order is made fresh
    every call."""
    if capture.is_capturing() or cu_seqlens.is_inference():
        return _longest_first(cu_seqlens)
    for t, ver, order in _SCAN_ORDER_CACHE:
        if t is cu_seqlens and ver == cu_seqlens._version:
            return order
    order = _longest_first(cu_seqlens)
    _SCAN_ORDER_CACHE.append((cu_seqlens, cu_seqlens._version, order))
    del _SCAN_ORDER_CACHE[:-4]
    return order


def _longest_first(cu_seqlens):
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    return torch.sort(lengths, descending=True, stable=True).indices.to(torch.int32)


def scan_grid(V: int, n_heads: int):
    """The state scans' grid: ``cdiv(V, BV)`` V-blocks for each of ``n_heads`` (sequence x
    value head), V-blocks of one head adjacent."""
    return lambda meta: (cdiv(V, meta["BV"]) * n_heads,)


@triton.jit
def chunk_program(cu_seqlens, chunk_indices, T, H: tl.constexpr, HV: tl.constexpr, BT: tl.constexpr,
                  IS_VARLEN: tl.constexpr, SPLIT: tl.constexpr = 1):
    """What a (chunk, batch x value head) program owns, grid (NT * SPLIT, B * HV): (batch row,
    value head, q/k head, global chunk number (the index into h-shaped [.., NT, ..] tensors,
    unique across the batch), first token (int64), valid rows of the chunk). With SPLIT > 1 a
    chunk has SPLIT programs with adjacent ids (so that their shared reads meet in L2); each
    finds its part as ``tl.program_id(0) % SPLIT``."""
    i_t = (tl.program_id(0) // SPLIT).to(tl.int64)
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
def scan_program(cu_seqlens, chunk_offsets, seq_order, T, V, HQ: tl.constexpr, HK: tl.constexpr,
                 HV: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr, IS_VARLEN: tl.constexpr,
                 NEED_BOH: tl.constexpr):
    """What a scan program owns, from its id (``scan_grid``): (V-block, head of all sequences,
    sequence, value head, q head, k head, first and end token (int64), the sequence length, and
    with NEED_BOH its first chunk in h's chunk axis, else 0). Varlen: the sequences are taken
    in ``seq_order`` (``scan_order``: longest first)."""
    pid = tl.program_id(0).to(tl.int64)
    NV = tl.cdiv(V, BV)
    i_nh = pid // NV
    i_n = i_nh // HV
    i_hv = i_nh % HV
    boh = i_n * 0
    if IS_VARLEN:
        i_n = tl.load(seq_order + i_n).to(tl.int64)
        i_nh = i_n * HV + i_hv
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
        T = (eos - bos).to(tl.int32)
        if NEED_BOH:
            boh = tl.load(chunk_offsets + i_n).to(tl.int64)
    else:
        bos = i_n * T
        eos = bos + T
        if NEED_BOH:
            boh = i_n * tl.cdiv(T, BT)
    return pid % NV, i_nh, i_n, i_hv, i_hv // (HV // HQ), i_hv // (HV // HK), bos, eos, T, boh
