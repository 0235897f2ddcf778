"""Backward state scan of the chunked delta rule: the state gradients ``dh`` and the full
gradient of v_new, in one reverse pass over the chunks.

Drop-in for fla 0.6.0's ``chunk_gated_delta_rule_bwd_dhu`` (fla/ops/common/chunk_delta_h.py,
``state_v_first=False``): same keywords, same returns ``(dh, dh0, dv2)``. With ``dS`` the
gradient of the state leaving the chunk (``dht`` after the last chunk), per chunk from last
to first:

    dh[c] = dS
    dv2   = dv + k dS                      (per-channel gate, KDA: k is kg; ungated)
    dv2   = dv + (k dS) * exp2(G_last - G) (scalar gate, GDN)
    dS    = diag(exp2(G_last)) dS + scale qg^T do - w^T dv2          (KDA: q is qg)
    dS    = exp2(G_last) dS + scale (q * exp2(G))^T do - w^T dv2     (GDN)

and ``dh0`` is the final ``dS``. With ``A=`` (KDA's Aqk) in place of dv, the intra-chunk
``dv = tril(A)^T do`` is made per chunk inside the scan (one more [BV, BT] x [BT, BT] product
on the do tile it loads anyway) instead of being read: fla's ``chunk_kda_bwd_dAv`` writes that
dv only for this stage to read it (as the KDA chain runs it).

Rounding follows fla's kernel: the state enters ``k dS`` in k's dtype, dv2 enters ``w^T dv2``
in w's dtype; with the scalar gate the gated q and do enter their product in fp32 (as fla's
do).

Layout: value-major, as the forward scan's VK configurations (``state_scan_fwd``): one
program per (V-block, value head, sequence) holds ``dS^T [BV, K]`` in fp32 registers, and
every product has the V-block as its M dimension (``dv2^T = dS^T k^T``, ``dS^T += do^T qg -
dv2^T w``), with the loaded tiles as right operands; no dot result is transposed into another
dot (the Triton 3.4-3.7.0 Hopper miscompile). The forward scan in this layout ran 1.27 ms
against fla's fwd_h + fwd_o 1.86 at B=8 (H200, 2026-11-30). fla's dhu is 2.98 ms at B=16; this
stage 2.86 in the KDA chain (bench/records/raw/2026-11-30-h200-kda-prod_b16-anchor-dhu.json),
and with dv made from A the chain's fwd+bwd 32.10 ms against 32.93 with fla's dhu and dAv
(shipped in the KDA chain).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernel_fun._common.tuning import (
    alloc, autotune_cache, autotune_configs, install_interpreter_shims, launch, next_pow2, work_bucket)
from kernel_fun._common.witness import record_launch

from kernel_fun._delta.chunking import check_varlen_batch, scan_grid, scan_order, scan_program, total_chunks

from .state_scan_fwd import GATE_CHANNEL, GATE_NONE, GATE_SCALAR, k_pruner

install_interpreter_shims()

# The autotuner's choices: (BV, num_warps, num_stages). The first (BV=32) is the one the
# interpreter runs, so the CPU tests (V = 32/64) exercise the V split. sm_90a compile at K=128,
# V=256, per-channel gate, dv made from A (tools/sass_stats.py with 16-byte aligned pointers,
# 2026-11-30; stack = spills): BV 32 / 64 / 128 take 255 registers and an 8 / 88 / 40-byte
# stack (without dv from A: 188 registers and none / 96 / 48); 62-136 KB shared memory
# (num_stages 1 and 2 compile to the same code: the reverse loop is not pipelined).
# The first three are the set at K <= 128; the last two (``_WIDE``) the set above it (``k_pruner``).
CONFIGS = [triton.Config({"BV": bv}, num_warps=nw, num_stages=ns)
           for bv, nw, ns in [(32, 4, 2), (64, 4, 2), (128, 8, 2), (64, 8, 2), (16, 4, 2)]]
# BV=64 on 8 warps: 206 registers and no stack with dv from A (the 4-warp one: 255 and 88 bytes),
# at one 136 KB CTA per SM either way. GPU-tested (the GPU tests force every candidate) and timed
# at gdn's call, where it lost (B=4 T=4096 H=16 HV=32: 0.937 ms against BV128-w8-s2's 0.562,
# bench/records/2026-12-04-h200-stages-gdn-scans-48070d5.json); not yet timed at KDA's
# (``kernel-fun bench --stages kda`` forces it).
# Lost on the H200 (2026-12-05, gdn's call at the layer's shape B=4 T=4096 H=16 HV=32,
# bench/records/2026-12-05-h200-stages-gdn-scans-ab-fc6b5e6-ee044dc.json; git ee044dc has them):
# BV128-w8-s3 0.489-0.491 ms and with G_last a chunk ahead 0.476-0.480, against the pick's
# 0.473 (three stages issue the chunk's copies a chunk earlier, but 198 KB of shared memory).
# BV16-w4-s2: for small launches (B=1 T=4096 H=HV=16: 128 programs on 132 SMs where BV32 runs 64),
# sm_90a at gdn's call 210 registers and no stack (246 with w from A_wy, where BV32-w4-s2 has 8 B of
# stack), the same on sm_100a (Triton 3.6, 2026-12-05); not yet timed at K <= 128.
# At K = 256 (fla's default GatedDeltaNet heads): sm_90a at gdn's call, K=256 V=512 (Triton 3.6,
# 2026-12-05), stack bytes BV16-w4-s2 0, BV64-w8-s2 24 against BV32-w4-s2 280, BV64-w4-s2 1480,
# BV128-w8-s2 1336: those two are the set there.
_WIDE = ("BV64-w8-s2", "BV16-w4-s2")
CANDIDATES: list = []


def config_name(c) -> str:
    return f"BV{c.kwargs['BV']}-w{c.num_warps}-s{c.num_stages}"


_prune = k_pruner(_WIDE, config_name)


@triton.jit(do_not_specialize=["T"])
def state_scan_bwd_kernel(
    q,  # [B, T, HQ, K] (qg with the per-channel gate, HQ == HV)
    k,  # [B, T, HK, K] (kg with the per-channel gate)
    w,  # [B, T, HV, K] | A_wy [B, T, HV, BT] with WY_FROM_A (w = A_wy diag(beta gamma) K, never formed)
    beta,  # [B, T, HV] with WY_FROM_A | unused
    g,  # [B, T, HV] (GATE == 1) | gk [B, T, HV, K] (GATE == 2) | unused
    dht,  # [N, HV, K, V] | unused
    do,  # [B, T, HV, V]
    dv,  # [B, T, HV, V] | unused (DV_FROM_A)
    A,  # [B, T, HV, BT] (DV_FROM_A: dv = tril(A)^T do made here) | unused
    dh,  # [B, NT, HV, K, V]
    dh0,  # [N, HV, K, V] fp32 | unused
    dv2,  # [B, T, HV, V]
    cu_seqlens,  # [N + 1] | unused
    chunk_offsets,  # [N + 1] | unused
    seq_order,  # [N] int32, the order the sequences are launched in (scan_order) | unused
    scale,
    T,
    WORK,  # autotune key only: tuning.work_bucket(sequences x value heads)
    HQ: tl.constexpr, HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, KP: tl.constexpr, BV: tl.constexpr,
    GATE: tl.constexpr, USE_DHT: tl.constexpr, STORE_DH0: tl.constexpr, IS_VARLEN: tl.constexpr,
    DOT_PRECISION: tl.constexpr, DV_FROM_A: tl.constexpr = False, WY_FROM_A: tl.constexpr = False,
    A_TRIL: tl.constexpr = False,
):
    i_v, i_nh, i_n, i_hv, i_hq, i_hk, bos, _, T, boh = scan_program(
        cu_seqlens, chunk_offsets, seq_order, T, V, HQ, HK, HV, BT, BV, IS_VARLEN, True)
    NT = tl.cdiv(T, BT)

    o_k = tl.arange(0, KP)
    m_k = o_k < K
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    o_i = tl.arange(0, BT)
    m_vk = m_v[:, None] & m_k[None, :]
    s_off = o_k[None, :] * V + o_v[:, None]  # [BV, KP] tiles of a [K, V] state

    q += (bos * HQ + i_hq) * K
    k += (bos * HK + i_hk) * K
    if WY_FROM_A:
        w += (bos * HV + i_hv) * BT
        beta += bos * HV + i_hv
    else:
        w += (bos * HV + i_hv) * K
    do += (bos * HV + i_hv) * V
    dv += (bos * HV + i_hv) * V
    A += (bos * HV + i_hv) * BT
    dv2 += (bos * HV + i_hv) * V
    if GATE == 1:
        g += bos * HV + i_hv
    if GATE == 2:
        g += (bos * HV + i_hv) * K
    dh += (boh * HV + i_hv) * K * V

    b_ds = tl.zeros([BV, KP], dtype=tl.float32)  # dS^T
    if USE_DHT:
        b_ds += tl.load(dht + i_nh * K * V + s_off, mask=m_vk, other=0.0).to(tl.float32)

    # The scalar gate's G_last is loaded a chunk ahead and carried across the loop, so that no load
    # is left on the scan's dependent chain (loaded in its chunk, the scalar load, which the
    # pipeliner does not take, was issued before the chunk's first product). H200, gdn's call,
    # 2026-12-05 (bench/records/2026-12-05-h200-stages-gdn-scans-ab-fc6b5e6-ee044dc.json and
    # ...-wy-ab-fc6b5e6-ee044dc.json): BV128-w8-s2 0.4726-0.4729 -> 0.4667-0.4670 ms at B=4 T=4096
    # H=16 HV=32, 0.9322 -> 0.9263 at B=8 T=8192 H=HV=16; the same value, from the same address.
    if GATE == 1:  # G_last of the first chunk the loop takes (the last one): row T - 1
        b_gl_next = tl.load(g + (T - 1) * HV, mask=T > 0, other=0.0).to(tl.float32)
    for i_r in range(NT):
        i_t = NT - 1 - i_r
        t0 = i_t * BT
        n_t = T - t0
        m_t = o_i < n_t
        m_kt = m_k[:, None] & m_t[None, :]
        m_vt = m_v[:, None] & m_t[None, :]
        m_tk = m_t[:, None] & m_k[None, :]
        last = tl.minimum(n_t, BT) - 1

        tl.store(dh + i_t * HV * K * V + s_off, b_ds.to(dh.dtype.element_ty), mask=m_vk)

        # The chunk's tiles that do not depend on the state are loaded before its first product,
        # so that a load the pipeliner leaves synchronous (KDA's G_last row; the scalar G_last was one
        # until it came a chunk ahead) is in flight while that product runs instead of after it, and A
        # (with A_TRIL) is copied a chunk ahead. H200,
        # gdn's call at the layer's shape (B=4 T=4096 H=16 HV=32, 2026-12-04,
        # bench/records/2026-12-04-h200-stages-gdn-scan-bwd-hoist-ab-37f4230.json): BV128-w8-s2
        # 0.565 -> 0.492 ms, BV64-w4-s2 0.697 -> 0.651.
        # k^T [KP, BT] loaded transposed from memory, or (WY_FROM_A, which needs k again as w's
        # factor) k [BT, KP] loaded once as it lies and its transpose taken (of a loaded tile: the
        # Triton 3.4-3.7.0 Hopper miscompile needs a transposed dot result). H200, gdn's stages,
        # 2026-12-04 (bench/records/2026-12-04-h200-stages-gdn-scans-konce-*.json): BV128-w8-s2
        # 0.560 -> 0.562 ms at B=4 T=4096 HV=32, 1.135 -> 1.129 at B=8 T=8192 HV=16; BV64-w4-s2
        # 0.956 -> 0.695 (132 -> 99 KB of shared memory: two programs an SM).
        if WY_FROM_A:
            b_w = tl.load(k + (t0 + o_i)[:, None] * (HK * K) + o_k[None, :], mask=m_tk, other=0.0)
            b_kt = tl.trans(b_w)
        else:
            b_kt = tl.load(k + (t0 + o_i)[None, :] * (HK * K) + o_k[:, None], mask=m_kt, other=0.0)
        if GATE == 1:
            b_g = tl.load(g + (t0 + o_i) * HV, mask=m_t, other=0.0).to(tl.float32)
            # this chunk's G_last, loaded a chunk ago; the next chunk's (full: it ends at t0 - 1)
            b_gl = b_gl_next
            b_gl_next = tl.load(g + (t0 - 1) * HV, mask=i_t > 0, other=0.0).to(tl.float32)
        if A_TRIL:  # (with DV_FROM_A) A stored with zeros above the diagonal: masked by rows only, so
            # that the pipeliner copies it a chunk ahead into shared memory, where the product reads it.
            # do is loaded here with it, and after the first product otherwise: each of the two forms
            # compiles to the code that was measured (gdn's here, KDA's and the rest below)
            b_dot = tl.load(do + (t0 + o_i)[None, :] * (HV * V) + o_v[:, None], mask=m_vt, other=0.0)
            b_a = tl.load(A + (t0 + o_i)[:, None] * (HV * BT) + o_i[None, :], mask=m_t[:, None], other=0.0)

        # dv2^T = dS^T k^T (+ dv^T)
        b_dv2 = tl.dot(b_ds.to(b_kt.dtype), b_kt, input_precision=DOT_PRECISION)
        if GATE == 1:
            b_dv2 *= tl.where(m_t, tl.exp2(b_gl - b_g), 0.0)[None, :]
        if not A_TRIL:
            b_dot = tl.load(do + (t0 + o_i)[None, :] * (HV * V) + o_v[:, None], mask=m_vt, other=0.0)
        if DV_FROM_A:  # the intra-chunk dv^T = do^T tril(A), A's rows (tokens) valid, i >= j
            if not A_TRIL:
                # under the triangular mask (KDA's Aqk: fla leaves the upper triangle unwritten) the load
                # is synchronous; issued here, after the first product: issued before it, the KDA
                # chain's scan ran 11% slower on the H200 (BV128-w8-s2 1.319 -> 1.471 ms at kda's stage
                # shape, 2026-12-04, bench/records/raw/2026-12-04-h200-stages-kda-scan-bwd-hoist-ab.json)
                m_a = m_t[:, None] & (o_i[:, None] >= o_i[None, :])
                b_a = tl.load(A + (t0 + o_i)[:, None] * (HV * BT) + o_i[None, :], mask=m_a, other=0.0)
            b_dv2 += tl.dot(b_dot, b_a.to(b_dot.dtype), input_precision=DOT_PRECISION)
        else:
            b_dv2 += tl.load(dv + (t0 + o_i)[None, :] * (HV * V) + o_v[:, None], mask=m_vt, other=0.0).to(tl.float32)
        tl.store(dv2 + (t0 + o_i)[None, :] * (HV * V) + o_v[:, None], b_dv2.to(dv2.dtype.element_ty), mask=m_vt)

        # dS^T = dS^T decay + scale do^T q - dv2^T w
        b_q = tl.load(q + (t0 + o_i)[:, None] * (HQ * K) + o_k[None, :], mask=m_tk, other=0.0)
        if WY_FROM_A:
            # dv2^T w = ((dv2^T A_wy) diag(beta gamma)) K: A_wy [BT, BT] and k loaded as they lie
            # (A_wy masked by its rows only: its zeros above the diagonal are stored)
            b_aw = tl.load(w + (t0 + o_i)[:, None] * (HV * BT) + o_i[None, :], mask=m_t[:, None], other=0.0)
            b_da = tl.dot(b_dv2.to(w.dtype.element_ty), b_aw, input_precision=DOT_PRECISION)
            b_bg = tl.load(beta + (t0 + o_i) * HV, mask=m_t, other=0.0).to(tl.float32)
            if GATE == 1:
                b_bg *= tl.exp2(b_g)
            b_dvw = (b_da * b_bg[None, :]).to(w.dtype.element_ty)
        else:
            b_w = tl.load(w + (t0 + o_i)[:, None] * (HV * K) + o_k[None, :], mask=m_tk, other=0.0)
            b_dvw = b_dv2.to(b_w.dtype)
        if GATE == 1:
            b_ds *= tl.exp2(b_gl)
            b_qd = tl.dot(b_dot.to(tl.float32), b_q.to(tl.float32) * tl.exp2(b_g)[:, None],
                          input_precision=DOT_PRECISION)
        else:
            if GATE == 2:
                b_gkl = tl.load(g + (t0 + last) * (HV * K) + o_k, mask=m_k, other=0.0).to(tl.float32)
                b_ds *= tl.exp2(b_gkl)[None, :]
            b_qd = tl.dot(b_dot, b_q, input_precision=DOT_PRECISION)
        b_ds += scale * b_qd - tl.dot(b_dvw, b_w, input_precision=DOT_PRECISION)

    if STORE_DH0:
        tl.store(dh0 + i_nh * K * V + s_off, b_ds.to(dh0.dtype.element_ty), mask=m_vk)


state_scan_bwd_kernel_tuned = triton.autotune(
    configs=autotune_configs(CONFIGS), **autotune_cache(),
    key=["HQ", "HK", "HV", "K", "V", "BT", "GATE", "USE_DHT", "STORE_DH0", "IS_VARLEN", "DV_FROM_A", "WY_FROM_A",
         "A_TRIL", "WORK"],
    prune_configs_by={"early_config_prune": _prune},
)(state_scan_bwd_kernel)



def state_scan_bwd(
    q: torch.Tensor,
    k: torch.Tensor,
    w: torch.Tensor | None,
    do: torch.Tensor,
    dv: torch.Tensor | None,
    g: torch.Tensor | None = None,
    gk: torch.Tensor | None = None,
    h0: torch.Tensor | None = None,
    dht: torch.Tensor | None = None,
    scale: float | None = None,
    state_v_first: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    chunk_size: int = 64,
    chunk_indices: torch.LongTensor | None = None,
    chunk_offsets: torch.LongTensor | None = None,
    use_graph: bool = False,
    *,
    config: triton.Config | None = None,
    A: torch.Tensor | None = None,
    wy: tuple | None = None,
    A_tril: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """The backward state scan; drop-in for fla's ``chunk_gated_delta_rule_bwd_dhu``.

    KDA (``gk`` given): q ``qg [B, T, HV, K]``, k ``kg [B, T, HV, K]`` (what fla's KDA chain
    passes), gk ``[B, T, HV, K]`` fp32 (chunk-local cumulative log2 gate). GDN (``g``
    ``[B, T, HV]``): q, k the raw ``[B, T, H, K]``. w ``[B, T, HV, K]``; do ``[B, T, HV, V]``;
    dv ``[B, T, HV, V]`` (the intra-chunk part of dv, from dAv); dht ``[N, HV, K, V]`` or None;
    h0: only whether dh0 is wanted (its values are not read). scale: required.
    A ``[B, T, HV, BT]`` (KDA's Aqk; with ``dv=None``): the intra-chunk dv = tril(A)^T do is
    made here per chunk instead of read (fla's chunk_kda_bwd_dAv writes it for dhu to read).
    ``A_tril=True`` says that A's entries above the diagonal are stored as zeros (gdn's gated
    scores write them so): A is then loaded without the triangular mask, which lets Triton's
    pipeliner copy it a chunk ahead (with the mask the load stays synchronous).
    ``wy=(A_wy, beta)`` in place of w (pass ``w=None``; the scalar gate or none): A_wy
    ``[B, T, HV, BT]`` the WY inverse with its zeros above the diagonal stored, as ``wy_inverse``
    writes it (loaded without the triangular mask, as A with ``A_tril``),
    beta ``[B, T, HV]``; ``dv2^T w`` is made as ``((dv2^T A_wy) diag(beta gamma)) K`` (one more
    [BV, BT] x [BT, BT] product a chunk), so that w = A_wy diag(beta gamma) K is never formed and
    fla's ``recompute_w_u`` need not run.
    Returns ``(dh [B, NT, HV, K, V]`` in q's dtype, ``dh0 [N, HV, K, V]`` fp32 or None,
    ``dv2`` like dv).
    """
    if state_v_first or use_graph:
        raise NotImplementedError("state_scan_bwd: state_v_first and use_graph are not supported")
    if scale is None:
        raise TypeError("state_scan_bwd: scale is required")
    if g is not None and gk is not None:
        raise ValueError("state_scan_bwd: pass g (scalar gate) or gk (per-channel gate), not both")
    B, T, HQ, K = q.shape
    HK = k.shape[2]
    HV, V = do.shape[2], do.shape[3]
    BT = chunk_size
    if (A is None) == (dv is None):
        raise ValueError("state_scan_bwd: pass dv (the intra-chunk dv) or A (to make it here), one of them")
    if A is not None and tuple(A.shape) != (B, T, HV, BT):
        raise ValueError(f"state_scan_bwd: A {tuple(A.shape)} must be {(B, T, HV, BT)}")
    dv_like = do if dv is None else dv
    beta = None
    if wy is not None:
        if w is not None or gk is not None:
            raise ValueError("state_scan_bwd: wy=(A_wy, beta) replaces w, with the scalar gate or none (not gk)")
        w, beta = wy  # read through w's pointer
        if tuple(w.shape) != (B, T, HV, BT) or tuple(beta.shape) != (B, T, HV) or w.dtype != k.dtype:
            raise ValueError(f"state_scan_bwd: A_wy {tuple(w.shape)} ({w.dtype}) must be {(B, T, HV, BT)} in k's "
                             f"dtype, beta {tuple(beta.shape)} must be {(B, T, HV)}")
    elif w is None:
        raise ValueError("state_scan_bwd: w (or wy=(A_wy, beta)) is required")
    w_shape = (B, T, HV, BT) if beta is not None else (B, T, HV, K)
    if tuple(w.shape) != w_shape or tuple(dv_like.shape) != tuple(do.shape) or k.shape[:2] != (B, T):
        raise ValueError(f"state_scan_bwd: shapes q {tuple(q.shape)} k {tuple(k.shape)} w {tuple(w.shape)} "
                         f"do {tuple(do.shape)} dv {tuple(dv_like.shape)} do not agree")
    if HV % HQ or HV % HK or K > 256 or BT < 16 or BT & (BT - 1):
        raise ValueError(f"state_scan_bwd: needs HV a multiple of HQ and HK, K <= 256, a power-of-two "
                         f"chunk_size >= 16 (HQ={HQ}, HK={HK}, HV={HV}, K={K}, BT={BT})")
    if gk is not None and tuple(gk.shape) != (B, T, HV, K):
        raise ValueError(f"state_scan_bwd: gk {tuple(gk.shape)} must be {(B, T, HV, K)}")
    if g is not None and tuple(g.shape) != (B, T, HV):
        raise ValueError(f"state_scan_bwd: g {tuple(g.shape)} must be {(B, T, HV)}")
    is_varlen = cu_seqlens is not None
    check_varlen_batch("state_scan_bwd", B, cu_seqlens)
    N = cu_seqlens.numel() - 1 if is_varlen else B
    if dht is not None and tuple(dht.shape) != (N, HV, K, V):
        raise ValueError(f"state_scan_bwd: dht {tuple(dht.shape)} must be {(N, HV, K, V)}")
    NT, chunk_offsets = total_chunks(B, T, BT, cu_seqlens, chunk_indices, chunk_offsets)
    q, k, w, do, dv_like = (x.contiguous() for x in (q, k, w, do, dv_like))
    gate = gk if gk is not None else g
    gate_kind = GATE_CHANNEL if gk is not None else (GATE_SCALAR if g is not None else GATE_NONE)
    dh = alloc((B, NT, HV, K, V), dtype=q.dtype, device=q.device)
    dh0 = alloc((N, HV, K, V), dtype=torch.float32, device=q.device) if h0 is not None else None
    dv2 = alloc(tuple(dv_like.shape), dtype=dv_like.dtype, device=dv_like.device)
    dummy = dv2
    args = dict(
        q=q, k=k, w=w, beta=beta.contiguous() if beta is not None else dummy, g=gate.contiguous() if gate is not None else dummy,
        dht=dht.contiguous() if dht is not None else dummy, do=do, dv=dv_like,
        A=A.contiguous() if A is not None else dummy, dh=dh,
        dh0=dh0 if dh0 is not None else dummy, dv2=dv2,
        cu_seqlens=cu_seqlens if is_varlen else dummy, chunk_offsets=chunk_offsets if is_varlen else dummy,
        seq_order=scan_order(cu_seqlens) if is_varlen else dummy,
        scale=float(scale), T=T, WORK=work_bucket(N * HV), HQ=HQ, HK=HK, HV=HV, K=K, V=V, BT=BT,
        KP=max(16, next_pow2(K)), GATE=gate_kind, USE_DHT=dht is not None,
        STORE_DH0=dh0 is not None, IS_VARLEN=is_varlen,
        DOT_PRECISION="ieee" if w.dtype == torch.float32 else "tf32", DV_FROM_A=A is not None,
        WY_FROM_A=beta is not None, A_TRIL=A is not None and A_tril,
    )
    launch(state_scan_bwd_kernel_tuned, scan_grid(V, N * HV), config, **args)
    record_launch("delta.state_scan_bwd")
    return dh, dh0, dv2
