"""KDA backward: recompute the WY pieces the state scans read, per 64-token chunk::

    u  = A (beta v)                    [BT, V]   (v's dtype)
    w  = A (beta k exp2(g))            [BT, K]   (k's dtype)
    qg = q exp2(g)                     [BT, K]   (only when q is given)
    kg = k exp2(g_last - g)            [BT, K]   (g_last: the chunk's last valid row)

with ``A = Akk = (I + L)^-1`` ``[BT, BT]`` per chunk and value head and ``g`` the chunk-local
log2 gate cumsum. Drop-in for fla 0.6.0's ``recompute_w_u_fwd`` (``fla/ops/kda/wy_fast.py``):
same arguments, same returns ``(w, u, qg, kg)``.

Why ours: fla runs one program per (chunk, value head) that walks 4 V blocks and 2 K blocks in
sequence, each a dependent load -> dot -> store, so a program has one tile in flight at a time
(3.32 ms at B=16, T=8192, H=HV=16, K=128, V=256 on an H200, where the bytes take ~1.5 ms).
Here every output tile is its own program: ``SPLIT = cdiv(V, BV) + cdiv(K, BK)`` neighbouring
programs share a chunk (``chunk_program``'s SPLIT), the first ``cdiv(V, BV)`` make u blocks and
the rest make w, qg, kg blocks; A is re-read by each of them from L2.

Precision: the dots take bf16/fp16 operands (A in the input dtype, as fla stores it; beta v and
beta k exp2(g) rounded to it) with fp32 accumulation, as fla's kernel does.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernel_fun._common.tuning import autotune_cache, autotune_configs, install_interpreter_shims
from kernel_fun._common.witness import record_launch
from kernel_fun.kda._kernels import chunk_indices_for, chunk_program, launch

install_interpreter_shims()


def _alloc(size, dtype=None, device=None):
    """Output allocation (tests swap in a NaN-filled one to catch unwritten elements)."""
    return torch.empty(size, dtype=dtype, device=device)


def configs():
    """Every configuration the autotuner may pick (the interpreter runs only the first).
    No loop, so one stage; the tiles are what varies. Registers at K=128, V=256 (sm_90a,
    scripts/sass_stats.py recompute_wu): 64x64 tiles on 8 warps 119, 32x32 on 4 warps 126 (16
    warps resident per SM), 64x64 on 4 warps 242; BK != BV compiles both branches at the
    larger register count, so the tiles are square."""
    return [
        triton.Config({"BK": bk, "BV": bv}, num_warps=w, num_stages=1)
        for bk, bv, w in [(64, 64, 8), (32, 32, 4), (64, 64, 4), (64, 128, 8), (128, 128, 8), (32, 32, 2)]
    ]


@triton.autotune(configs=autotune_configs(configs()), **autotune_cache(),
                 key=["H", "HV", "K", "V", "BT", "IS_VARLEN", "STORE_QG"])
@triton.jit(do_not_specialize=["T"])
def _recompute_wu_kernel(
    q, k, v, beta, A, g,
    w, u, qg, kg,
    cu_seqlens, chunk_indices, T,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, STORE_QG: tl.constexpr, IS_VARLEN: tl.constexpr,
):
    NV: tl.constexpr = (V + BV - 1) // BV
    SPLIT: tl.constexpr = NV + (K + BK - 1) // BK
    _, i_hv, i_h, _, t0, n_valid = chunk_program(cu_seqlens, chunk_indices, T, H, HV, BT, IS_VARLEN, SPLIT)
    i_p = tl.program_id(0) % SPLIT

    o_t = tl.arange(0, BT)
    m_t = o_t < n_valid
    b_b = tl.load(beta + (t0 + o_t) * HV + i_hv, mask=m_t, other=0.).to(tl.float32)
    # A's columns past the chunk's end are masked too: no unwritten memory reaches the dot
    p_A = A + (t0 + o_t[:, None]) * (HV * BT) + i_hv * BT + o_t[None, :]
    b_A = tl.load(p_A, mask=m_t[:, None] & m_t[None, :], other=0.)
    if i_p < NV:
        o_v = i_p * BV + tl.arange(0, BV)
        m_tv = m_t[:, None] & (o_v < V)[None, :]
        o_u = (t0 + o_t[:, None]) * (HV * V) + i_hv * V + o_v[None, :]
        b_v = tl.load(v + o_u, mask=m_tv, other=0.)
        b_vb = (b_v.to(tl.float32) * b_b[:, None]).to(b_v.dtype)
        b_u = tl.dot(b_A.to(b_v.dtype), b_vb)
        tl.store(u + o_u, b_u.to(u.dtype.element_ty), mask=m_tv)
    else:
        o_k = (i_p - NV) * BK + tl.arange(0, BK)
        m_k = o_k < K
        m_tk = m_t[:, None] & m_k[None, :]
        o_in = (t0 + o_t[:, None]) * (H * K) + i_h * K + o_k[None, :]
        o_out = (t0 + o_t[:, None]) * (HV * K) + i_hv * K + o_k[None, :]
        b_k = tl.load(k + o_in, mask=m_tk, other=0.)
        b_g = tl.load(g + o_out, mask=m_tk, other=0.).to(tl.float32)
        b_e = tl.exp2(b_g)
        b_kf = b_k.to(tl.float32)
        b_w = tl.dot(b_A.to(b_k.dtype), (b_kf * (b_b[:, None] * b_e)).to(b_k.dtype))
        tl.store(w + o_out, b_w.to(w.dtype.element_ty), mask=m_tk)
        if STORE_QG:
            b_q = tl.load(q + o_in, mask=m_tk, other=0.).to(tl.float32)
            tl.store(qg + o_out, (b_q * b_e).to(qg.dtype.element_ty), mask=m_tk)
        b_gl = tl.load(g + (t0 + n_valid - 1) * (HV * K) + i_hv * K + o_k, mask=m_k, other=0.).to(tl.float32)
        b_kg = b_kf * tl.exp2(tl.where(m_t[:, None], b_gl[None, :] - b_g, float("-inf")))
        tl.store(kg + o_out, b_kg.to(kg.dtype.element_ty), mask=m_tk)


def recompute_w_u(k, v, beta, A, gk, q=None, cu_seqlens=None, chunk_indices=None, use_graph=False,
                  config=None):
    """The backward's recompute of ``(w, u, qg, kg)``; drop-in for fla's ``recompute_w_u_fwd``.

    Args:
        k: ``[B, T, H, K]``; v: ``[B, T, HV, V]``; beta: ``[B, T, HV]``;
        A: ``[B, T, HV, BT]`` fla's ``Akk`` (in k's dtype); gk: ``[B, T, HV, K]`` chunk-local
        log2 gate cumsum (fp32); q: ``[B, T, H, K]`` or None (then qg is None).
        cu_seqlens / chunk_indices: varlen as in fla (``B == 1``).
        use_graph: fla's static-buffer capture mode; not supported (raises).
        config: a ``triton.Config`` from ``configs()`` to run instead of autotuning (tests).

    Returns:
        ``(w, u, qg, kg)``: w, qg, kg ``[B, T, HV, K]`` in k's dtype, u like v.
    """
    if use_graph:
        raise NotImplementedError("kernel_fun recompute_w_u: use_graph (static buffers) is not supported")
    B, T, H, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    BT = A.shape[-1]
    if HV % H != 0:
        raise ValueError(f"HV={HV} must be a multiple of H={H}")
    if cu_seqlens is not None and B != 1:
        raise ValueError("varlen (cu_seqlens) needs B == 1")
    if chunk_indices is None and cu_seqlens is not None:
        chunk_indices = chunk_indices_for(cu_seqlens, BT)
    NT = triton.cdiv(T, BT) if cu_seqlens is None else len(chunk_indices)
    k, v, beta, A, gk = (x.contiguous() for x in (k, v, beta, A, gk))
    q = q.contiguous() if q is not None else None

    dev = k.device
    w = _alloc((B, T, HV, K), k.dtype, dev)
    u = _alloc(v.shape, v.dtype, dev)
    qg = _alloc((B, T, HV, K), k.dtype, dev) if q is not None else None
    kg = _alloc((B, T, HV, K), k.dtype, dev)
    if NT == 0:
        return w, u, qg, kg

    def grid(meta):
        return (NT * (triton.cdiv(V, meta["BV"]) + triton.cdiv(K, meta["BK"])), B * HV)

    launch(
        _recompute_wu_kernel, grid, config,
        q, k, v, beta, A, gk, w, u, qg, kg,
        cu_seqlens, chunk_indices, T,
        H=H, HV=HV, K=K, V=V, BT=BT, STORE_QG=q is not None, IS_VARLEN=cu_seqlens is not None,
    )
    record_launch("kda.recompute_wu")
    return w, u, qg, kg
