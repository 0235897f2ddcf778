"""Forward state scan of the chunked delta rule, with the output computed inside the scan.

Replaces fla 0.6.0's pair ``chunk_gated_delta_rule_fwd_h`` (fla/ops/common/chunk_delta_h.py)
+ ``chunk_gla_fwd_o_gk`` (KDA, fla/ops/gla/chunk.py) or + ``chunk_fwd_o`` (GDN,
fla/ops/common/chunk_o.py). fla's fwd_h writes every chunk's state h ``[B, NT, HV, K, V]``
and v_new ``[B, T, HV, V]`` only for fwd_o to read them back; here one program keeps the fp32
state of one (sequence, value head, V-block) in registers, walks the chunks, and per chunk
computes, with ``S`` the state before the chunk:

    v_new = u - w S
    o     = scale * (q * exp2(G)) S + Aqk v_new           (per-channel gate, KDA)
    o     = scale * exp2(G) * (q S) + scale * Lower(q k^T * exp2(G_i - G_j)) v_new   (scalar, GDN)
    S     = diag(exp2(G_last)) S + kg^T v_new                                        (KDA)
    S     = exp2(G_last) S + k^T (v_new * exp2(G_last - G))                           (GDN)

h and v_new are written only when asked (the backward's recompute path). Rounding follows
fla's chain: the state enters every product as the input dtype (fla stores h in it), v_new is
rounded to the input dtype before both products that use it, and the accumulation is fp32.

Layout: grid = cdiv(V, BV) * N * HV programs, V-blocks of one head adjacent; the fp32 state
is held as two [64, BV] K-slices (one for K <= 64), the chunk is BT = 64 tokens, and every
[BT, K] operand is loaded 64 columns at a time. Per chunk: v_new (two dots), the state update
(two dots, issued first: the output only needs the state before the chunk), the inter-chunk
output (two dots), the intra-chunk output (one dot; GDN forms q k^T with two more).

Value-major layout (constexpr VK, a configuration key): the state is held transposed, S^T
[BV, K], and every product has the V-block as its M dimension (v_new^T = u^T - S^T w^T,
o^T = S^T qg^T + v_new^T Aqk^T, S^T += v_new^T kg). Why: in the key-major layout Triton gives
the 64-row products whose results feed further products (w S, q S) warps [8, 1] at 8 warps,
i.e. both warpgroups compute the same 64 x BV tile (sm_90a TTGIR, 2026-12-01), and the state
and v_new are staged through shared memory every chunk as right operands. Value-major at
BV = 128, 8 warps: one 64-row half per warpgroup, S^T and v_new^T stay in registers as left
operands (wgmma A from registers); only loaded tiles, the gated q^T and the masked Aqk^T go
through shared memory. Same products, same rounding points.

Numbers to beat: B=8, T=8192, H=HV=16, K=128, V=256 bf16, one H200 (2026-11-30): fla's fwd_h
0.89 ms + chunk_gla_fwd_o_gk 0.82 ms. The bytes this kernel must move there (q, k, w, gk,
Aqk, u in; o out) are about 2.55 GB (0.6 ms at 4.24 TB/s); its products are about 120 GMAC
(0.5 ms at the dense bf16 peak). Timed per configuration by ``kernel-fun bench --stages kda`` (and gdn).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernel_fun._common.tuning import (
    alloc, autotune_cache, autotune_configs, fitting_blocks, install_interpreter_shims, interpreting, launch, next_pow2,
    work_bucket)
from kernel_fun._common.witness import record_launch
from kernel_fun._delta.chunking import check_varlen_batch, scan_grid, scan_order, scan_program, total_chunks


install_interpreter_shims()

# Gate kinds (constexpr GATE).
GATE_NONE, GATE_SCALAR, GATE_CHANNEL = 0, 1, 2

# (BV, num_warps, num_stages, maxnreg). The first one is the only one the interpreter runs:
# BV=32, so that the CPU tests (V = 32/64) exercise the V split.
# Resources, from an offline sm_90a compile (ptxas -v) of the KDA kernel at K=128, V=256,
# 2026-12 (not yet timed on a GPU): BV32/w4/s1 168 regs 28 KB -> 3 CTAs/SM; BV64/w4/s1 244
# regs 40 KB -> 2/SM; BV64/w4/s2 226 regs 152 KB -> 1/SM; BV128/w8/s1 255 regs 64 KB -> 1/SM;
# BV128/w8/s2 255 regs 184 KB -> 1/SM. num_stages=3 needs more than an SM's 227 KB at BV >= 64
# and BV128/w4 spills, so neither is listed. The maxnreg rows trade spills for occupancy:
# BV32/w4 at 168 registers fits 3 CTAs/SM; BV64/w4 at 128 fits 4 (472 B spilled), one wave
# of the 512 CTAs at B=8, HV=16, V=256; BV128/w8 at 128 fits 2 (896 B spilled), one wave of 256.
# At that shape BV=32 gives 1024 CTAs, BV=64 512, BV=128 256; every V-block re-reads q, k, w,
# gk and Aqk (from L2 when its neighbours run alongside).
_CONFIG_TUPLES = [
    (32, 4, 1, None, False),
    (32, 4, 2, None, False),
    (64, 4, 1, None, False),
    (64, 4, 2, None, False),
    (64, 8, 1, None, False),
    (64, 8, 2, None, False),
    (128, 8, 1, None, False),
    (128, 8, 2, None, False),
    (32, 4, 1, 168, False),
    (64, 4, 1, 128, False),
    (64, 4, 2, 168, False),
    (128, 8, 1, 128, False),
    # value-major (VK) layout, see the kernel. sm_90a compile at K=128, V=256, 2026-12-01
    # (not yet timed): BV128/w8/s2 255 regs, 8 B spilled, 136 KB (114 KB with q_gated);
    # BV128/w8/s3 72 B spilled, 224 KB (168 KB with q_gated, no spill); BV64/w4/s2 20 B spilled,
    # 136 KB; BV256/w16/s2 128 regs, 568 B spilled (one program per head: 128 at B=8).
    (128, 8, 2, None, True),
    (128, 8, 3, None, True),
    (64, 4, 2, None, True),
    # VK-BV64-w4-s3 lost on the H200 (2026-12-05, gdn's call at B=4 T=4096 H=16 HV=32,
    # bench/records/2026-12-05-h200-stages-gdn-scans-ab-fc6b5e6-ee044dc.json; git ee044dc has it): the
    # forward 0.622 ms against VK-BV64-w4-s2's 0.313 (133 KB: one program an SM), the recompute 0.267
    # against the key-major BV64-w4-s2's 0.228; VK-BV128-w8-s3 0.427 / 0.311 there.
    (32, 4, 2, None, True),
    (256, 16, 2, None, True),
    # Candidates for small launches (few sequences x value heads: B=1 T=4096 H=HV=16 runs 32
    # programs at BV64 on 132 SMs, 128 at BV16, each chunk's dependent chain on narrower tiles).
    # sm_90a, Triton 3.6, 2026-12-05, not yet timed; registers, no stack in any: gdn's forward
    # (o inside) BV16-w4-s1 172 / VK 255, its recompute 86 / VK 128; kda's forward 90 / VK 192.
    (16, 4, 1, None, False),
    (16, 4, 1, None, True),
    # Candidates above K = 128 (fla's default GatedDeltaNet heads, the recompute form: no o): the
    # key-major layout holds K = 256 as two [128, BV] slices (BK = 128); sm_90a, Triton 3.6, 2026-12-05,
    # registers / stack (B) at K=256 V=512: BV16-w4-s1 128 / 0 (4 programs an SM), BV32-w4-s1 199 / 0,
    # BV32-w4-s2 192 / 0, BV64-w8-s2 254 / 0 (BV64-w4 255 / 48-56); value-major VK-BV64-w8-s2 250 / 0
    # (VK-BV64-w4-s2 264 B of stack, VK-BV128-w8-s2 408).
    (64, 8, 2, None, True),
]
_ALL = [triton.Config({"BV": bv, "VK": vk}, num_warps=nw, num_stages=ns, maxnreg=mr)
        for bv, nw, ns, mr, vk in _CONFIG_TUPLES]


def config_name(c) -> str:
    """A short name of a configuration: ``BV128-w8-s2-rNone`` (key-major) or ``VK-BV128-w8-s2-rNone``."""
    return f"{'VK-' if c.kwargs.get('VK') else ''}BV{c.kwargs['BV']}-w{c.num_warps}-s{c.num_stages}-r{c.maxnreg}"


def prune_by_k(configs, K: int, wide: tuple, name=None) -> list:
    """A scan's autotune set at this K: the configurations ``name``d in ``wide`` where K > 128 (fla's
    default GatedDeltaNet heads, K = 256), the others where K <= 128 (the set measured there)."""
    name = name or config_name
    return [c for c in configs if (name(c) in wide) == (K > 128)]


def k_pruner(wide: tuple, name=None, wide_with_o: tuple = ()):
    """A scan's ``early_config_prune``: this K's configurations (``prune_by_k``; above K = 128 with the
    output, ``STORE_O``, only those named in ``wide_with_o`` where given), less V-blocks wider than V; at
    least one."""
    def prune(configs, named_args, **kwargs):
        K, V, store_o = (kwargs.get(n, named_args.get(n)) for n in ("K", "V", "STORE_O"))
        fits = prune_by_k(configs, K, wide, name) or list(configs)
        if store_o and K > 128 and wide_with_o:
            fits = [c for c in fits if (name or config_name)(c) in wide_with_o] or fits
        return fitting_blocks(fits, {"BV": max(V, 32)})
    return prune


@triton.jit
def _gated_q(q, g, o_i, o_k, m_tk, HQ: tl.constexpr, HV: tl.constexpr, K: tl.constexpr,
             GATE: tl.constexpr, Q_GATED: tl.constexpr):
    """One [BT, BK] K-slice of the queries that meet the state: q * exp2(gk) for the
    per-channel gate (rounded to q's dtype, as fla's fwd_o does), else q itself."""
    if Q_GATED:
        b_q = tl.load(q + o_i[:, None] * (HV * K) + o_k[None, :], mask=m_tk, other=0.0)
    else:
        b_q = tl.load(q + o_i[:, None] * (HQ * K) + o_k[None, :], mask=m_tk, other=0.0)
        if GATE == 2:
            b_gk = tl.load(g + o_i[:, None] * (HV * K) + o_k[None, :], mask=m_tk, other=0.0).to(tl.float32)
            b_q = (b_q * tl.exp2(b_gk)).to(b_q.dtype)
    return b_q


@triton.jit
def _next_chunk(q, k, w, u, o, g, Aqk, v_new, h, beta, HQ: tl.constexpr, HK: tl.constexpr, HV: tl.constexpr,
                K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, GATE: tl.constexpr, Q_GATED: tl.constexpr,
                HAS_AQK: tl.constexpr, SAVE_V_NEW: tl.constexpr, SAVE_H: tl.constexpr, WY_FROM_A: tl.constexpr):
    """Every per-chunk pointer of the scan advanced by one chunk (both layouts)."""
    if Q_GATED:
        q += BT * HV * K
    else:
        q += BT * HQ * K
    k += BT * HK * K
    if WY_FROM_A:  # w is A [B, T, HV, BT], u is v
        w += BT * HV * BT
        beta += BT * HV
    else:
        w += BT * HV * K
    u += BT * HV * V
    o += BT * HV * V
    if GATE == 1:
        g += BT * HV
    if GATE == 2:
        g += BT * HV * K
    if HAS_AQK:
        Aqk += BT * HV * BT
    if SAVE_V_NEW:
        v_new += BT * HV * V
    if SAVE_H:
        h += HV * K * V
    return q, k, w, u, o, g, Aqk, v_new, h, beta


@triton.jit(do_not_specialize=["T", "T_total", "N"])
def state_scan_fwd_kernel(
    q,  # [B, T, HQ, K] (or qg [B, T, HV, K] with Q_GATED)
    k,  # [B, T, HK, K]  (kg for the per-channel gate)
    w,  # [B, T, HV, K] | A [B, T, HV, BT] with WY_FROM_A
    u,  # [B, T, HV, V] | v with WY_FROM_A
    beta,  # [B, T, HV] with WY_FROM_A | unused
    g,  # [B, T, HV] (GATE == 1) | gk [B, T, HV, K] (GATE == 2) | unused
    Aqk,  # [B, T, HV, BT] | unused
    h0,  # [N, HV, K, V] (or [N, HV, V, K] with STATE_V_FIRST) | unused
    o,  # [B, T, HV, V]
    ht,  # [N, HV, K, V] fp32 | unused
    h,  # [B, NT, HV, K, V] | unused
    v_new,  # [B, T, HV, V] | unused
    cu_seqlens,  # [N + 1] | unused
    chunk_offsets,  # [N + 1] | unused
    seq_order,  # [N] int32, the order the sequences are launched in (scan_order) | unused
    scale,
    T,
    T_total,
    N,
    WORK,  # autotune key only: tuning.work_bucket(sequences x value heads)
    HQ: tl.constexpr,
    HK: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    GATE: tl.constexpr,
    Q_GATED: tl.constexpr,
    HAS_AQK: tl.constexpr,
    USE_H0: tl.constexpr,
    STORE_HT: tl.constexpr,
    STORE_O: tl.constexpr,
    SAVE_H: tl.constexpr,
    SAVE_V_NEW: tl.constexpr,
    STATE_V_FIRST: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    VK: tl.constexpr = False,
    WY_FROM_A: tl.constexpr = False,
):
    # One program per (V-block, value head, sequence); the V-blocks of one head are adjacent
    # program ids, so they run together and share q, k, w and the gate through L2.
    # The [K, BV] fp32 state lives in registers as K-slices of BK = 64 rows (two for K = 128; two
    # of BK = 128 rows at K = 256):
    # every [BT, K] operand is then handled 64 columns at a time, which halves the transient
    # registers of the query gating.
    TWO_K: tl.constexpr = K > BK
    # K_ONCE (the key-major layout in GDN's recompute form above K = 128: from A, no output): k is loaded
    # once a chunk and the state update takes the loaded tile's transpose (of a loaded tile, never of a
    # dot result), where k and k^T were both loaded: at K = 256 the shared memory of BV32-w4-s2 falls
    # from 172 to 107 KB (two programs an SM where one fitted) and the scan went 1.794 -> 1.293 ms at
    # B=8 T=8192 H=6 V=512 (H100, 2026-12-05; docs/gdn.md). At K = 128 the recompute's pick (BV64-w4-s2)
    # was level with it and BV32-w4-s2 9% slower, so K <= 128 keeps the two loads. With the output (k^T
    # also against q) it is not taken: there, on the H100 with Triton 3.6, four-warp one-stage
    # configurations (BV16/BV32-w4-s1, BV32-w4-s1-r168, BV64-w4-s1-r128) made illegal memory accesses.
    K_ONCE: tl.constexpr = WY_FROM_A and not STORE_O and K > 128
    i_v, i_nh, i_n, i_hv, i_hq, i_hk, bos, eos, T, boh = scan_program(
        cu_seqlens, chunk_offsets, seq_order, T, V, HQ, HK, HV, BT, BV, IS_VARLEN, SAVE_H)
    NT = tl.cdiv(T, BT)

    o_k1 = tl.arange(0, BK)
    m_k1 = o_k1 < K
    o_k2 = BK + o_k1
    m_k2 = o_k2 < K
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    o_i = tl.arange(0, BT)
    m_kv1 = m_k1[:, None] & m_v[None, :]
    m_kv2 = m_k2[:, None] & m_v[None, :]
    if STATE_V_FIRST:  # [BK, BV] tiles of a [V, K] state
        s_off1 = o_v[None, :] * K + o_k1[:, None]
        s_off2 = o_v[None, :] * K + o_k2[:, None]
    else:  # [BK, BV] tiles of a [K, V] state
        s_off1 = o_k1[:, None] * V + o_v[None, :]
        s_off2 = o_k2[:, None] * V + o_v[None, :]

    # Per-head base pointers, in int64 (B*T*HV*V passes 2**31 at production shapes). Inside
    # the loop they advance by one chunk per step, so every offset computed from them stays
    # within one chunk and fits in int32.
    if Q_GATED:
        q += (bos * HV + i_hv) * K
    else:
        q += (bos * HQ + i_hq) * K
    k += (bos * HK + i_hk) * K
    if WY_FROM_A:
        w += (bos * HV + i_hv) * BT
        beta += bos * HV + i_hv
    else:
        w += (bos * HV + i_hv) * K
    u += (bos * HV + i_hv) * V
    o += (bos * HV + i_hv) * V
    o_seq = o
    if GATE == 1:
        g += bos * HV + i_hv
    if GATE == 2:
        g += (bos * HV + i_hv) * K
    if HAS_AQK:
        Aqk += (bos * HV + i_hv) * BT
    if SAVE_V_NEW:
        v_new += (bos * HV + i_hv) * V
    if SAVE_H:
        h += (boh * HV + i_hv) * K * V

    if VK:
        # Value-major layout: the state is held transposed, S^T [BV, K] (one tile over all of
        # K), and every product is written with the V-block as its M dimension:
        #     v_new^T = u^T - S^T w^T,   o^T = S^T qg^T + v_new^T Aqk^T,   S^T += v_new^T kg
        # With BV = 128 and 8 warps each warpgroup owns 64 rows of V in every product (no
        # replicated work), and the left operands (S^T, v_new^T) come from registers: only
        # the right operands (loaded tiles, the gated queries, the masked Aqk) pass through
        # shared memory, where the key-major layout stages the state and v_new every chunk.
        KP: tl.constexpr = BK if K <= BK else (2 * BK if K <= 2 * BK else 4 * BK)  # one tile over all of K
        o_k = tl.arange(0, KP)
        m_k = o_k < K
        m_vk = m_v[:, None] & m_k[None, :]
        if STATE_V_FIRST:  # [BV, KP] tiles of a [V, K] state
            s_off = o_v[:, None] * K + o_k[None, :]
        else:  # [BV, KP] tiles of a [K, V] state
            s_off = o_k[None, :] * V + o_v[:, None]
        b_s = tl.zeros([BV, KP], dtype=tl.float32)
        if USE_H0:
            b_s += tl.load(h0 + i_nh * K * V + s_off, mask=m_vk, other=0.0).to(tl.float32)
        # [j, i] (key token, query token): the transposed causal mask, diagonal included
        m_upper = o_i[:, None] <= o_i[None, :]
        for i_t in range(NT):
            n_t = T - i_t * BT
            m_t = o_i < n_t
            m_kt = m_k[:, None] & m_t[None, :]
            m_vt = m_v[:, None] & m_t[None, :]
            last = tl.minimum(n_t, BT) - 1

            b_sc = b_s.to(w.dtype.element_ty)
            if SAVE_H:
                tl.store(h + s_off, b_sc.to(h.dtype.element_ty), mask=m_vk)

            if GATE == 1:
                b_g = tl.load(g + o_i * HV, mask=m_t, other=0.0).to(tl.float32)
            if WY_FROM_A:
                # v_new^T = (v^T - S^T k^T diag(gamma)) diag(beta) A^T: w and u never formed
                # (A^T loaded transposed, masked by A's rows only: its zeros above the diagonal are
                # stored). Made before the output's products, so that its operands are dead before q^T
                # loads. k is loaded once a chunk as it lies (the state update's operand) and its
                # transpose taken: of a loaded tile, never of a dot result (the Triton 3.4-3.7.0 Hopper
                # miscompile needs the latter). Against loading k^T transposed and k again (H200, gdn's
                # stages, 2026-12-04, bench/records/2026-12-04-h200-stages-gdn-scans-konce-*.json):
                # VK-BV64-w4-s2 0.351 -> 0.346 ms at B=4 T=4096 HV=32, 0.701 -> 0.677 at B=8
                # T=8192 HV=16; 115 -> 82 KB of shared memory; the same values bit for bit.
                b_k = tl.load(k + o_i[:, None] * (HK * K) + o_k[None, :], mask=m_t[:, None] & m_k[None, :], other=0.0)
                b_kt = tl.trans(b_k)
                b_ks = tl.dot(b_sc, b_kt, input_precision=DOT_PRECISION)
                if GATE == 1:
                    b_ks *= tl.exp2(b_g)[None, :]
                b_bt = tl.load(beta + o_i * HV, mask=m_t, other=0.0).to(tl.float32)
                b_x = tl.load(u + o_i[None, :] * (HV * V) + o_v[:, None], mask=m_vt, other=0.0).to(tl.float32)
                b_x = ((b_x - b_ks) * b_bt[None, :]).to(w.dtype.element_ty)
                b_awt = tl.load(w + o_i[None, :] * (HV * BT) + o_i[:, None], mask=m_t[None, :], other=0.0)
                b_vn = tl.dot(b_x, b_awt, input_precision=DOT_PRECISION)
            if STORE_O:
                # Output, inter-chunk part: S^T (before the chunk) against the gated queries^T.
                if Q_GATED:
                    b_qt = tl.load(q + o_i[None, :] * (HV * K) + o_k[:, None], mask=m_kt, other=0.0)
                else:
                    b_qt = tl.load(q + o_i[None, :] * (HQ * K) + o_k[:, None], mask=m_kt, other=0.0)
                if GATE == 2 and not Q_GATED:
                    b_gkt = tl.load(g + o_i[None, :] * (HV * K) + o_k[:, None], mask=m_kt, other=0.0).to(tl.float32)
                    b_ekt = tl.exp2(b_gkt)
                    b_qgt = (b_qt * b_ekt).to(b_qt.dtype)
                else:
                    b_qgt = b_qt
                b_o = tl.dot(b_sc, b_qgt, input_precision=DOT_PRECISION)
                if GATE == 1:
                    b_o *= tl.exp2(b_g)[None, :]
                b_o *= scale

            if not WY_FROM_A:
                # v_new^T = u^T - S^T w^T  (w^T and u^T loaded transposed from memory)
                b_wt = tl.load(w + o_i[None, :] * (HV * K) + o_k[:, None], mask=m_kt, other=0.0)
                b_vn = tl.load(u + o_i[None, :] * (HV * V) + o_v[:, None], mask=m_vt, other=0.0).to(tl.float32)
                b_vn = b_vn - tl.dot(b_sc, b_wt, input_precision=DOT_PRECISION)
            if SAVE_V_NEW:
                tl.store(v_new + o_i[None, :] * (HV * V) + o_v[:, None], b_vn.to(v_new.dtype.element_ty), mask=m_vt)
            b_vnc = b_vn.to(w.dtype.element_ty)
            if GATE == 1:
                b_gl = tl.load(g + last * HV).to(tl.float32)
                b_vu = (b_vn * tl.where(m_t, tl.exp2(b_gl - b_g), 0.0)[None, :]).to(w.dtype.element_ty)
            else:
                b_vu = b_vnc

            # State update: S^T = S^T diag(exp2(G_last)) + v_new^T kg.
            if not WY_FROM_A:
                b_k = tl.load(k + o_i[:, None] * (HK * K) + o_k[None, :], mask=m_t[:, None] & m_k[None, :], other=0.0)
            if GATE == 2:
                b_glk = tl.load(g + last * (HV * K) + o_k, mask=m_k, other=0.0).to(tl.float32)
                b_s *= tl.exp2(b_glk)[None, :]
            if GATE == 1:
                b_s *= tl.exp2(b_gl)
            b_s = tl.dot(b_vu, b_k, b_s, input_precision=DOT_PRECISION)

            if STORE_O:
                # Output, intra-chunk part: v_new^T Aqk^T, Aqk^T [j, i] loaded transposed (its
                # unwritten upper triangle is dropped with where, never multiplied).
                m_causal = m_upper & m_t[None, :]
                if HAS_AQK:
                    b_at = tl.load(Aqk + o_i[None, :] * (HV * BT) + o_i[:, None], mask=m_t[None, :], other=0.0)
                    b_at = tl.where(m_causal, b_at, 0.0)
                    b_o += tl.dot(b_vnc, b_at.to(b_vnc.dtype), input_precision=DOT_PRECISION)
                else:
                    # Aqk^T = k q^T from loaded operands (never a transposed product)
                    b_at = tl.dot(b_k, b_qt, input_precision=DOT_PRECISION)
                    if GATE == 1:
                        b_at *= tl.exp2(tl.where(m_causal, b_g[None, :] - b_g[:, None], 0.0))
                    b_at = tl.where(m_causal, b_at, 0.0)
                    b_o += tl.dot(b_vnc, b_at.to(b_vnc.dtype), input_precision=DOT_PRECISION) * scale
                tl.store(o + o_i[None, :] * (HV * V) + o_v[:, None], b_o.to(o.dtype.element_ty), mask=m_vt)

            q, k, w, u, o, g, Aqk, v_new, h, beta = _next_chunk(
                q, k, w, u, o, g, Aqk, v_new, h, beta, HQ, HK, HV, K, V, BT, GATE, Q_GATED, HAS_AQK,
                SAVE_V_NEW, SAVE_H, WY_FROM_A)

        if STORE_HT:
            tl.store(ht + i_nh * K * V + s_off, b_s.to(ht.dtype.element_ty), mask=m_vk)
    else:
        b_s1 = tl.zeros([BK, BV], dtype=tl.float32)
        if TWO_K:
            b_s2 = tl.zeros([BK, BV], dtype=tl.float32)
        if USE_H0:
            b_s1 += tl.load(h0 + i_nh * K * V + s_off1, mask=m_kv1, other=0.0).to(tl.float32)
            if TWO_K:
                b_s2 += tl.load(h0 + i_nh * K * V + s_off2, mask=m_kv2, other=0.0).to(tl.float32)

        m_lower = o_i[:, None] >= o_i[None, :]
        for i_t in range(NT):
            n_t = T - i_t * BT  # tokens left in the sequence from this chunk on
            m_t = o_i < n_t
            m_tk1 = m_t[:, None] & m_k1[None, :]
            m_tk2 = m_t[:, None] & m_k2[None, :]
            m_tv = m_t[:, None] & m_v[None, :]
            last = tl.minimum(n_t, BT) - 1  # the chunk's last token, chunk-local

            # The state before this chunk, as a product operand (fla stores h in this dtype).
            b_s1c = b_s1.to(w.dtype.element_ty)
            if TWO_K:
                b_s2c = b_s2.to(w.dtype.element_ty)
            if SAVE_H:
                tl.store(h + s_off1, b_s1c.to(h.dtype.element_ty), mask=m_kv1)
                if TWO_K:
                    tl.store(h + s_off2, b_s2c.to(h.dtype.element_ty), mask=m_kv2)

            if GATE == 1:
                b_g = tl.load(g + o_i * HV, mask=m_t, other=0.0).to(tl.float32)
            if WY_FROM_A:
                # v_new = A diag(beta) (v - diag(gamma) k S): w and u never formed
                # k loaded as it lies; above K = 128 without the output the state update takes its
                # transpose (K_ONCE below)
                b_kn1 = tl.load(k + o_i[:, None] * (HK * K) + o_k1[None, :], mask=m_tk1, other=0.0)
                b_ks = tl.dot(b_kn1, b_s1c, input_precision=DOT_PRECISION)
                if TWO_K:
                    b_kn2 = tl.load(k + o_i[:, None] * (HK * K) + o_k2[None, :], mask=m_tk2, other=0.0)
                    b_ks = tl.dot(b_kn2, b_s2c, b_ks, input_precision=DOT_PRECISION)
                if GATE == 1:
                    b_ks *= tl.exp2(b_g)[:, None]
                b_bt = tl.load(beta + o_i * HV, mask=m_t, other=0.0).to(tl.float32)
                b_x = tl.load(u + o_i[:, None] * (HV * V) + o_v[None, :], mask=m_tv, other=0.0).to(tl.float32)
                b_x = ((b_x - b_ks) * b_bt[:, None]).to(w.dtype.element_ty)
                b_aw = tl.load(w + o_i[:, None] * (HV * BT) + o_i[None, :], mask=m_t[:, None], other=0.0)
                b_vn = tl.dot(b_aw, b_x, input_precision=DOT_PRECISION)
            else:
                # v_new = u - w S
                b_w = tl.load(w + o_i[:, None] * (HV * K) + o_k1[None, :], mask=m_tk1, other=0.0)
                b_wh = tl.dot(b_w, b_s1c, input_precision=DOT_PRECISION)
                if TWO_K:
                    b_w = tl.load(w + o_i[:, None] * (HV * K) + o_k2[None, :], mask=m_tk2, other=0.0)
                    b_wh = tl.dot(b_w, b_s2c, b_wh, input_precision=DOT_PRECISION)
                b_vn = tl.load(u + o_i[:, None] * (HV * V) + o_v[None, :], mask=m_tv, other=0.0).to(tl.float32) - b_wh
            if SAVE_V_NEW:
                tl.store(v_new + o_i[:, None] * (HV * V) + o_v[None, :], b_vn.to(v_new.dtype.element_ty), mask=m_tv)
            b_vnc = b_vn.to(w.dtype.element_ty)
            if GATE == 1:
                # the scalar gate decays v_new to the chunk end before it enters the state
                b_gl = tl.load(g + last * HV).to(tl.float32)
                b_vu = (b_vn * tl.where(m_t, tl.exp2(b_gl - b_g), 0.0)[:, None]).to(w.dtype.element_ty)
            else:
                b_vu = b_vnc

            # State update to the end of the chunk, issued before the output products, which
            # only need the state before the chunk (already in b_s*c). k^T comes as [BK, BT]
            # loaded transposed from memory, never as a transposed product (the Triton 3.4-3.7.0
            # Hopper miscompile, fla issue #640).
            if K_ONCE:  # k^T the transpose of the tile loaded for k S
                b_k1t = tl.trans(b_kn1)
            else:
                b_k1t = tl.load(k + o_i[None, :] * (HK * K) + o_k1[:, None], mask=m_k1[:, None] & m_t[None, :],
                                other=0.0)
            if GATE == 2:
                b_gl1 = tl.load(g + last * (HV * K) + o_k1, mask=m_k1, other=0.0).to(tl.float32)
                b_s1 *= tl.exp2(b_gl1)[:, None]
            if GATE == 1:
                b_s1 *= tl.exp2(b_gl)
            b_s1 = tl.dot(b_k1t, b_vu, b_s1, input_precision=DOT_PRECISION)
            if TWO_K:
                if K_ONCE:
                    b_k2t = tl.trans(b_kn2)
                else:
                    b_k2t = tl.load(k + o_i[None, :] * (HK * K) + o_k2[:, None], mask=m_k2[:, None] & m_t[None, :],
                                    other=0.0)
                if GATE == 2:
                    b_gl2 = tl.load(g + last * (HV * K) + o_k2, mask=m_k2, other=0.0).to(tl.float32)
                    b_s2 *= tl.exp2(b_gl2)[:, None]
                if GATE == 1:
                    b_s2 *= tl.exp2(b_gl)
                b_s2 = tl.dot(b_k2t, b_vu, b_s2, input_precision=DOT_PRECISION)

            if STORE_O:
                # Output, inter-chunk part: the (gated) queries against the state before the chunk.
                b_q1 = _gated_q(q, g, o_i, o_k1, m_tk1, HQ, HV, K, GATE, Q_GATED)
                b_o = tl.dot(b_q1, b_s1c, input_precision=DOT_PRECISION)
                if TWO_K:
                    b_q2 = _gated_q(q, g, o_i, o_k2, m_tk2, HQ, HV, K, GATE, Q_GATED)
                    b_o = tl.dot(b_q2, b_s2c, b_o, input_precision=DOT_PRECISION)
                if GATE == 1:
                    b_o *= tl.exp2(b_g)[:, None]
                b_o *= scale

                # Output, intra-chunk part. Masks are applied with where, never by multiplying:
                # Aqk's upper triangle is unwritten memory (NaN possible), and exp2(G_i - G_j)
                # overflows above the diagonal. (Aqk is loaded with a row mask only, which keeps the
                # load vectorized.)
                m_causal = m_lower & m_t[:, None]
                if HAS_AQK:
                    b_a = tl.load(Aqk + o_i[:, None] * (HV * BT) + o_i[None, :], mask=m_t[:, None], other=0.0)
                    b_a = tl.where(m_causal, b_a, 0.0)
                    b_o += tl.dot(b_a.to(b_vnc.dtype), b_vnc, input_precision=DOT_PRECISION)
                else:
                    b_a = tl.dot(b_q1, b_k1t, input_precision=DOT_PRECISION)
                    if TWO_K:
                        b_a = tl.dot(b_q2, b_k2t, b_a, input_precision=DOT_PRECISION)
                    if GATE == 1:
                        b_a *= tl.exp2(tl.where(m_causal, b_g[:, None] - b_g[None, :], 0.0))
                    b_a = tl.where(m_causal, b_a, 0.0)
                    b_o += tl.dot(b_a.to(b_vnc.dtype), b_vnc, input_precision=DOT_PRECISION) * scale
                tl.store(o + o_i[:, None] * (HV * V) + o_v[None, :], b_o.to(o.dtype.element_ty), mask=m_tv)

            q, k, w, u, o, g, Aqk, v_new, h, beta = _next_chunk(
                q, k, w, u, o, g, Aqk, v_new, h, beta, HQ, HK, HV, K, V, BT, GATE, Q_GATED, HAS_AQK,
                SAVE_V_NEW, SAVE_H, WY_FROM_A)

        if STORE_HT:
            tl.store(ht + i_nh * K * V + s_off1, b_s1.to(ht.dtype.element_ty), mask=m_kv1)
            if TWO_K:
                tl.store(ht + i_nh * K * V + s_off2, b_s2.to(ht.dtype.element_ty), mask=m_kv2)

    if IS_VARLEN and STORE_O:
        # fla's KDA chain returns zeros for the padding tokens after the last sequence.
        if i_n == N - 1:
            for i_p in range(tl.cdiv(T_total - eos, BT)):
                o_p = (eos - bos) + i_p * BT + o_i  # rows after the sequence, int64
                m_p = (o_p < T_total - bos)[:, None] & m_v[None, :]
                tl.store(o_seq + o_p[:, None] * (HV * V) + o_v[None, :],
                         tl.zeros([BT, BV], dtype=tl.float32).to(o.dtype.element_ty), mask=m_p)


def _slice_rows(K: int) -> int:
    """BK, the rows of one of the key-major layout's state slices: 64 up to K = 128 (two slices at
    K = 128), 128 above it (K = 256 as two [128, BV] slices; the value-major layout's one tile is
    unchanged, KP = 2 BK = 256)."""
    return min(64, max(16, next_pow2(K))) if K <= 128 else 128


_AUTOTUNE_KEY = ["HQ", "HK", "HV", "K", "V", "BT", "GATE", "Q_GATED", "HAS_AQK", "USE_H0", "STORE_HT", "STORE_O",
                 "SAVE_H", "SAVE_V_NEW", "STATE_V_FIRST", "IS_VARLEN", "WY_FROM_A", "WORK"]
# Production autotune set: the measured winners. H200, KDA T=8192, H=HV=16, K=128, V=256, bf16,
# every configuration forced, 2026-11-30 (bench/records/raw/2026-11-30-h200-delta-scan-bench-r2.json):
# at B=8 VK-BV128-w8-s2 1.265 ms, BV128-w8-s2 1.576, VK-BV64-w4-s2 2.024, BV64-w4-s2 2.020 (fla's
# fwd_h + fwd_o 1.863); at B=16 2.520 / 3.118 (fla 3.714); with q_gated VK-BV64-w4-s2 0.930 and
# VK-BV128-w8-s2 1.076 at B=8. Every other configuration (CANDIDATES, which benches and GPU tests
# force) was slower (1.39-4.6 ms). The first entry (in _CONFIG_TUPLES order) is the one the
# interpreter runs.
# At K = 256 (fla's default GatedDeltaNet heads, where gdn's chain runs this scan without o: the split
# forward and the backward's recompute) the key-major layout with two [128, BV] slices: H100, gdn's
# recompute-form probe, every config forced, 2026-12-05 (tools/scan_configs.py;
# bench/records/2026-12-05-h100-gdn-scan-k256-configs-b{4,8}-1c952a0.json): at B=4 T=4096 H=6 K=256 V=512
# BV32-w4-s2 0.461 ms, BV64-w8-s2 0.495, BV16-w4-s1 0.789 against the value-major VK-BV32-w4-s2 0.566
# (shipped until then), VK-BV64-w8-s2 0.568, VK-BV16-w4-s1 0.811 (fla's fwd_h there about 0.41, from
# the model's profile); at B=8 T=8192 BV64-w8-s2 1.465, BV32-w4-s2 1.795 against VK-BV32-w4-s2 1.734
# (fla's fwd_h 1.540 in the op bench). BV16-w4-s1 (128 registers, 4 programs an SM) is kept for small
# launches. Since K_ONCE in this form (k loaded once a chunk; H100, 2026-12-05, old and new alternated,
# bench/records/2026-12-05-h100-gdn-scan-k-once-ab.json): BV32-w4-s2 0.461 -> 0.417 ms at B=4 and 1.794 ->
# 1.293 at B=8 (now the pick at both), BV64-w8-s2 0.493 -> 0.485 and 1.459 -> 1.454.
_WIDE = ("BV32-w4-s2-rNone", "BV64-w8-s2-rNone", "BV16-w4-s1-rNone")
# Above K = 128 with the output (which gdn's chain never asks for there: it splits the forward) the s2
# configurations need 237-265 KB of shared memory (H100, 2026-12-05); BV16-w4-s1 fits.
_WIDE_WITH_O = ("BV16-w4-s1-rNone",)
_SHIPPED = ("VK-BV128-w8-s2-rNone", "BV128-w8-s2-rNone", "VK-BV64-w4-s2-rNone", "BV64-w4-s2-rNone") + _WIDE
CONFIGS = [c for c in _ALL if config_name(c) in _SHIPPED]
# the interpreter's autotuner runs CONFIGS' first, which is not of the set above K = 128: there it runs this
_WIDE_INTERPRETED = next(c for c in _ALL if config_name(c) == _WIDE[0])
CANDIDATES = [c for c in _ALL if config_name(c) not in _SHIPPED]
_prune = k_pruner(_WIDE, wide_with_o=_WIDE_WITH_O)
state_scan_fwd_kernel_tuned = triton.autotune(
    configs=autotune_configs(CONFIGS), **autotune_cache(),
    key=_AUTOTUNE_KEY,
    prune_configs_by={"early_config_prune": _prune},
)(state_scan_fwd_kernel)

def state_scan_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    w: torch.Tensor | None,
    u: torch.Tensor | None,
    g: torch.Tensor | None = None,
    gk: torch.Tensor | None = None,
    Aqk: torch.Tensor | None = None,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    chunk_indices: torch.LongTensor | None = None,
    chunk_offsets: torch.LongTensor | None = None,
    chunk_size: int = 64,
    save_h: bool = False,
    save_v_new: bool = False,
    state_v_first: bool = False,
    *,
    q_gated: bool = False,
    store_o: bool = True,
    wy: tuple | None = None,
    config: triton.Config | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """The forward state scan of the chunked delta rule, with the output made inside it.

    One launch replaces fla's ``chunk_gated_delta_rule_fwd_h`` + ``chunk_gla_fwd_o_gk`` (KDA)
    or + ``chunk_fwd_o`` (GDN) and, unless asked, writes neither h nor v_new.

    Which tensors it expects (names as in fla 0.6.0's chains):

    KDA (``fla/ops/kda/chunk_fwd.py``: ``gk=`` given, ``g=None``):
        q   ``[B, T, H, K]``   the raw queries, exactly what fla passes to ``chunk_gla_fwd_o_gk``
            (after the l2norm when ``use_qk_l2norm_in_kernel``); NOT ``qg`` (unless
            ``q_gated``, below).
        k   ``[B, T, HV, K]``  ``kg`` = k * exp2(gk_last - gk), what fla passes to fwd_h as
            ``k`` (returned by ``chunk_kda_fwd_intra``); NOT the raw keys.
        w   ``[B, T, HV, K]``, u ``[B, T, HV, V]``: from ``chunk_kda_fwd_intra``.
        gk  ``[B, T, HV, K]`` (fp32): the chunk-local cumulative gate in log2 space (the ``g``
            after ``kda_gate_chunk_cumsum``/``chunk_local_cumsum(scale=RCP_LN2)``), the same
            tensor both fla stages receive.
        Aqk ``[B, T, HV, BT]``: from ``chunk_kda_fwd_intra`` (scale and gate included);
            required. Only its lower triangle (diagonal included) is read.
    GDN (``fla/ops/gated_delta_rule/chunk.py``: ``g=`` given, ``gk=None``):
        q   ``[B, T, H, K]`` raw queries, k ``[B, T, H, K]`` raw keys (the tensors fla passes
            to both fwd_h and ``chunk_fwd_o``); w, u from ``chunk_gated_delta_rule_fwd_intra``;
        g   ``[B, T, HV]`` (fp32): chunk-local cumulative gate in log2 space.
        Aqk None: the intra scores ``scale * Lower(q k^T * exp2(g_i - g_j))`` are formed in the
            kernel as ``chunk_fwd_o`` does (a precomputed Aqk is also accepted and then used).
    With neither gate: the plain delta rule (Aqk optional as for GDN).

    ``wy=(A, v, beta)`` in place of ``w, u`` (pass ``None, None``; GDN and the plain rule, not
    the per-channel gate): A ``[B, T, HV, BT]`` the WY inverse (I + StrictLower(diag(beta) K K^T
    Gamma))^-1 as ``gdn/_kernels/wy_inverse.py`` writes it, with its zeros above the diagonal stored
    (A is masked by its rows only: under the triangular mask Triton 3.6 read the tile's pipelined
    copy back from shared memory, masked it and stored it again, once a chunk on the scan's dependent
    chain), v ``[B, T, HV, V]``, beta ``[B, T, HV]``. The scan then never
    reads w = A diag(beta gamma) K and u = A diag(beta) V: per chunk it forms
    v_new = A diag(beta) (v - diag(gamma) K S) (one more [BT, BT] x [BT, BV] product, one rounding
    point, of the bracket, instead of w's and u's), so fla's ``recompute_w_u`` need not run.

    ``q_gated=True`` (KDA only): q is ``qg [B, T, HV, K]`` = q * exp2(gk) rounded to q's dtype,
    as ``chunk_kda_fwd_intra(..., disable_recompute=True)`` returns it (the same rounding fla's
    fwd_o applies in-kernel, so o is unchanged); the scan then reads only the last row of gk
    in each chunk instead of all of it (half the bytes of its biggest input, and no gating
    registers).

    scale: float, required (fla's ``scale``; with a given Aqk it only scales the inter part).
    initial_state ``[N, HV, K, V]`` (any float dtype, read as fp32; ``[N, HV, V, K]`` with
    ``state_v_first``). cu_seqlens ``[N + 1]`` (then ``B == 1``). chunk_indices is only used
    for the number of chunks of ``h`` (saves a host sync when ``save_h``); chunk_offsets
    ``[N + 1]`` (fla's ``prepare_chunk_offsets``) is computed when needed and not given.
    ``config`` forces one configuration (a ``triton.Config`` from ``CONFIGS`` or ``CANDIDATES``).
    ``store_o=False`` (the backward's recompute, which wants only h and v_new): o is neither
    computed nor written (q and Aqk are not read) and comes back as None.

    Returns ``(o, final_state, h, v_new)``:
        o           ``[B, T, HV, V]`` in u's dtype (None with ``store_o=False``): what fla's fwd_o returns, before the
                    chain's ``.type_as(q)``; zero on padding tokens after ``cu_seqlens[-1]``.
        final_state ``[N, HV, K, V]`` fp32 if ``output_final_state`` else None.
        h           ``[B, NT, HV, K, V]`` in k's dtype (the state before each chunk, as fla's
                    fwd_h returns it; NT summed over sequences when varlen) if ``save_h``.
        v_new       ``[B, T, HV, V]`` in u's dtype (``u - w h``, before any gating) if
                    ``save_v_new``.
    """
    if scale is None:
        raise TypeError("state_scan_fwd: scale is required")
    if g is not None and gk is not None:
        raise ValueError("state_scan_fwd: pass g (scalar gate) or gk (per-channel gate), not both")
    if gk is not None and Aqk is None:
        raise ValueError("state_scan_fwd: a per-channel gate (gk) needs Aqk from the intra stage")
    B, T, HQ, K = q.shape
    HK = k.shape[2]
    BT = chunk_size
    beta = None
    if wy is not None:
        if w is not None or u is not None:
            raise ValueError("state_scan_fwd: pass w, u or wy=(A, v, beta), not both")
        if gk is not None:
            raise ValueError("state_scan_fwd: wy=(A, v, beta) is for the scalar gate or none (not gk)")
        w, u, beta = wy  # the kernel reads A through w's pointer and v through u's
        HV = u.shape[2]
        if tuple(w.shape) != (B, T, HV, BT) or tuple(beta.shape) != (B, T, HV) or w.dtype != k.dtype:
            raise ValueError(f"state_scan_fwd: A {tuple(w.shape)} ({w.dtype}) must be {(B, T, HV, BT)} in k's "
                             f"dtype, beta {tuple(beta.shape)} must be {(B, T, HV)}")
    elif w is None or u is None:
        raise ValueError("state_scan_fwd: w and u (or wy=(A, v, beta)) are required")
    HV, V = u.shape[2], u.shape[3]
    w_shape = (B, T, HV, BT) if beta is not None else (B, T, HV, K)
    if k.shape[:2] != (B, T) or k.shape[3] != K or tuple(w.shape) != w_shape or u.shape[:2] != (B, T):
        raise ValueError(f"state_scan_fwd: shapes q {tuple(q.shape)} k {tuple(k.shape)} "
                         f"w {tuple(w.shape)} u {tuple(u.shape)} do not agree")
    if HV % HQ or HV % HK:
        raise ValueError(f"state_scan_fwd: HV={HV} must be a multiple of HQ={HQ} and HK={HK}")
    if K > 256 or BT < 16 or BT & (BT - 1):
        raise ValueError(f"state_scan_fwd: needs K <= 256 and a power-of-two chunk_size >= 16 (K={K}, BT={BT})")
    if config is None and K > 128 and interpreting():
        config = _WIDE_INTERPRETED
    if q_gated and (gk is None or HQ != HV):
        raise ValueError("state_scan_fwd: q_gated needs gk and qg shaped [B, T, HV, K]")
    if gk is not None and tuple(gk.shape) != (B, T, HV, K):
        raise ValueError(f"state_scan_fwd: gk {tuple(gk.shape)} must be {(B, T, HV, K)}")
    if g is not None and tuple(g.shape) != (B, T, HV):
        raise ValueError(f"state_scan_fwd: g {tuple(g.shape)} must be {(B, T, HV)}")
    if Aqk is not None and tuple(Aqk.shape) != (B, T, HV, BT):
        raise ValueError(f"state_scan_fwd: Aqk {tuple(Aqk.shape)} must be {(B, T, HV, BT)}")
    is_varlen = cu_seqlens is not None
    check_varlen_batch("state_scan_fwd", B, cu_seqlens)
    N = cu_seqlens.numel() - 1 if is_varlen else B
    state_shape = (N, HV, V, K) if state_v_first else (N, HV, K, V)
    if initial_state is not None and tuple(initial_state.shape) != state_shape:
        raise ValueError(f"state_scan_fwd: initial_state {tuple(initial_state.shape)} must be {state_shape}")

    q, k, w, u = (x.contiguous() for x in (q, k, w, u))
    gate = gk if gk is not None else g
    gate_kind = GATE_CHANNEL if gk is not None else (GATE_SCALAR if g is not None else GATE_NONE)
    if gate is not None:
        gate = gate.contiguous()
    if Aqk is not None:
        Aqk = Aqk.contiguous()
    if beta is not None:
        beta = beta.contiguous()
    if initial_state is not None:
        initial_state = initial_state.contiguous()

    if not (store_o or save_h or save_v_new or output_final_state):
        raise ValueError("state_scan_fwd: store_o=False with nothing else to write")
    o = alloc((B, T, HV, V), dtype=u.dtype, device=u.device) if store_o else None
    final_state = alloc(state_shape, dtype=torch.float32, device=u.device) if output_final_state else None
    v_new = alloc(tuple(u.shape), dtype=u.dtype, device=u.device) if save_v_new else None
    h = None
    if save_h:
        NT, chunk_offsets = total_chunks(B, T, BT, cu_seqlens, chunk_indices, chunk_offsets)
        h_shape = (B, NT, HV, V, K) if state_v_first else (B, NT, HV, K, V)
        h = alloc(h_shape, dtype=k.dtype, device=k.device)

    dummy = u  # pointer for arguments a constexpr switch leaves unused (never written through)
    args = dict(
        q=q, k=k, w=w, u=u, beta=beta if beta is not None else dummy,
        g=gate if gate is not None else dummy,
        Aqk=Aqk if Aqk is not None else dummy,
        h0=initial_state if initial_state is not None else dummy,
        o=o if o is not None else dummy,
        ht=final_state if final_state is not None else dummy,
        h=h if h is not None else dummy,
        v_new=v_new if v_new is not None else dummy,
        cu_seqlens=cu_seqlens if is_varlen else dummy,
        chunk_offsets=chunk_offsets if (is_varlen and save_h) else dummy,
        seq_order=scan_order(cu_seqlens) if is_varlen else dummy,
        scale=float(scale), T=T, T_total=T, N=N, WORK=work_bucket(N * HV),
        HQ=HQ, HK=HK, HV=HV, K=K, V=V, BT=BT, BK=_slice_rows(K),
        GATE=gate_kind, Q_GATED=q_gated, HAS_AQK=Aqk is not None, USE_H0=initial_state is not None,
        STORE_HT=output_final_state, STORE_O=store_o, SAVE_H=save_h, SAVE_V_NEW=save_v_new,
        STATE_V_FIRST=state_v_first, IS_VARLEN=is_varlen, WY_FROM_A=beta is not None,
        # fp32 inputs: exact fp32 products (the GPU default would be tf32); 16-bit inputs keep
        # the default, which only concerns fp32 operands.
        DOT_PRECISION="ieee" if w.dtype == torch.float32 else "tf32",
    )
    launch(state_scan_fwd_kernel_tuned, scan_grid(V, N * HV), config, **args)
    record_launch("delta.state_scan_fwd")
    return o, final_state, h, v_new

