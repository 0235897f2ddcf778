"""GDN backward, second half, one (chunk, qk head, K block) per program: dq, dk and dg from the
state products and the first half's score gradients (``wy_dv_bwd.py``), group-summed over the qk
head's value heads.

Per chunk (BT = 64 tokens) and value head, in the notation of ``wy_dqkwg_bwd.py``:

    dq  = diag(gamma scale) do S^T + dAqk K
    dk  = diag(gamma_L / gamma) vn dS^T - diag(gamma) dv S^T + dAqk^T Q + (dAkk + dAkk^T) K
          (diag(gamma) dv S^T = diag(beta gamma) A^T dvn S^T: the WY term of dw, taken from dv)
    dG  = dGz + rowsum(dq * Q) - rowsum(dk_before_dAkk * K),
          and on the last row also gamma_L sum(S * dS) + sum(rowsum(dk_state,w * K))
    dg  = the chunk-local reverse cumsum of dG

Every product's output is a [BT, BK] slice of dq or dk, so a K block (BK columns of K) needs only
its own columns of q, k, h, dh: split in NK = K / BK programs, none recomputes anything; they
read the same do, v_new, dv, dAqk, dAkk (adjacent program ids, so those reads meet in L2). dG is a
sum over K: each block adds its part, reverse-cumsummed, into a zeroed dg (two adds onto zero: the
result does not depend on their order, so it is deterministic); the dGz part is added by block 0.
Registers: dq, dk [BT, BK] fp32 (32 KB at BK = 64: 64 a thread on 4 warps), every product M = 64
rows (wgmma). At BK = K = 128, dq and dk alone are 128 registers a thread on 4 warps, and on 8
warps the grouped case (HV = 2H) spilled (sm_90a, 255 registers, 224-312 B of stack). Transpose-
free: h^T, dh^T and dAqk^T, dAkk^T are loaded transposed from memory; no dot result is
transposed (the Triton 3.4-3.7.0 Hopper miscompile, fla #640). The group's dq, dk accumulate in
one pair of registers (the per-head gate factors are folded into the operands) and are written
once; each head's share of rowsum(dq * Q) is the difference of the rowsums before and after it.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernel_fun._common.tuning import (  # noqa: F401  (config_name: every kernel module names its configs)
    alloc, autotune_cache, autotune_configs, cdiv, chunk_work, config_name, install_interpreter_shims, launch, next_pow2,
    row_stride)
from kernel_fun._common.witness import record_launch
from kernel_fun._delta.chunking import chunk_program

from .wy_dv_bwd import prune_bv

install_interpreter_shims()

# (BK, BV, num_warps, num_stages). The first is the only one the interpreter runs: BK=64 and
# BV=32, so that the CPU tests exercise the K split (K = 128) and the V loop (V = 64/128).
# Timed on the H200 (`--stages gdn`, B=4 T=4096 H=16 K=V=128, bf16, 2026-12-02; records
# bench/records/2026-12-02-h200-stages-gdn-hv{32,16}-cb9017d.json), ms at HV=32 | HV=16, and sm_90a
# registers / stack (Triton 3.6) at HV=32 | HV=16:
#   BK64  BV64 w4 0.823 | 0.444   255/32  | 254/0
#   BK64  BV32 w4 0.994 | 0.517   255/8   | 252/0
#   BK128 BV64 w8 1.283 | 0.545   255/312 | 246/0   (the unsplit kernel's best, shipped until then)
#   BK128 BV32 w8 1.414 | 0.681   255/224 | 248/0
#   BK64  BV64 w8 1.681 | 0.852   248/0   | 155/0
# Four warps (one warpgroup, M = 64 per wgmma) with half of K a program beat eight warps with all of
# it, spills included (a few spill ops at HV=32). Left out: BK64 BV32 w8 (237/0 | 154/0) hit an
# illegal memory access on the H200 (Triton 3.6, B=4 T=4096 H=16 HV=32, 2026-12-02; every other
# config ran in the same call, and it ran with the dgz load made unconditional: a miscompile of
# that config, as Triton #10486/#11366 describe for multi-dot Hopper kernels;
# bench/records/raw/2026-12-02-h200-gdn-wy-dqk-ima-diag.log). Tried and worse on the compile at
# HV=32: q, k loaded once before the group loop, the group loop unrolled (tl.static_range),
# maxnreg 128 on 8 warps (257 spill ops).
CONFIGS = [triton.Config({"BK": bk, "BV": bv}, num_warps=nw, num_stages=ns, maxnreg=mr)
           for bk, bv, nw, ns, mr in [(64, 32, 4, 2, None), (64, 64, 4, 2, None), (128, 64, 8, 2, None),
                                      (64, 128, 4, 1, 168)]]
CANDIDATES = [triton.Config({"BK": bk, "BV": bv}, num_warps=8, num_stages=2) for bk, bv in ((64, 64), (128, 32))]
# The value heads' blocks in one flat loop (FLAT: the next head's first block copied during this
# head's epilogue) lost on the H200 (2026-12-05, B=4 T=4096 H=16 HV=32,
# bench/records/2026-12-05-h200-stages-gdn-wy-ab-fc6b5e6-ee044dc.json; git ee044dc has it):
# BK64-BV64-FLAT-w4-s2 0.838, BK64-BV32-FLAT-w4-s2 0.974 and -s3 0.884 ms against BK64-BV64-w4-s2's 0.718.
# One value block (BV = V = 128; the last of CONFIGS, 2026-12-05): the loop over V has one trip, so
# every state tile (do, v_new, dv, S^T, dS^T) is requested at once instead of in two rounds, and at
# G = 1 the kernel needs fewer registers than at BV64 (sm_90a, Triton 3.6, HV=16: 183 registers, no
# stack, 48 KB, two programs an SM; capped at 168 still no stack, and three an SM; BK64-BV64-w4-s2
# 247, two an SM). H200 (bench/records/2026-12-05-h200-stages-gdn-wy-dqk-one-block-a46b7c2.json):
#   B=8 T=8192 H=HV=16 (prod_b8): BK64-BV128-w4-s1-r168 1.160 ms, uncapped 1.381, BK64-BV64-w4-s2 1.482
#   B=4 T=4096 H=16 HV=32 (the layer): 1.399, uncapped 0.965, BK64-BV64-w4-s2 0.718
# At G = 2 it spills (255 registers and 264 B of stack uncapped, 808 B at 168 with the group loop
# unrolled), so the autotuner, whose key holds HV, keeps BK64-BV64 there. The uncapped form lost at
# both shapes (deleted). sm_100a: 168 registers, no stack at HV=16.
# Quarter-K programs (BK32 on 4 warps, dG in per-K-block slices summed by the launcher; 163-218
# registers, no stack at HV=16) lost on the H200 (2026-12-02, B=4 T=4096 H=16, records
# bench/records/2026-12-02-h200-stages-gdn-wy-dqk-quarter-k-hv{32,16}-c5b3a36.json): 1.346-1.659 ms
# at HV=32 and 0.681-0.707 at HV=16 against BK64-BV64-w4 0.815 / 0.439; deleted (git 6ffaf44 has them).
# Three programs an SM (maxnreg 168 on 4 warps; 448 / 352 B of stack, 210 / 163 spill ops at HV=32)
# lost too (2026-12-03, B=4 T=4096 H=16 HV=32): BK64-BV64 1.020, BK64-BV32 1.029 against the shipped
# 0.830 ms (bench/records/2026-12-03-h200-stages-gdn-wy-dqk-maxnreg-82af0e9.json; git 82af0e9 has them).
MIN_BK = min(c.kwargs["BK"] for c in CONFIGS)  # of the autotuner's configs (whether dg needs zeroing)


@triton.jit
def _state_block(q, p_do, p_vn, p_dv, p_h, p_dh, s_dv, b_dq, b_dk, b_hdh, b_dos_f, b_decay, b_gam, i_v, o_i, m_t,
                 o_k, m_k, HV: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One value block of one value head: its state products into dq, dk (operands in q's dtype) and
    its part of sum(S * dS)."""
    dt_in = q.dtype.element_ty
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    m_tv = m_t[:, None] & m_v[None, :]
    m_vk = m_v[:, None] & m_k[None, :]
    b_do = tl.load(p_do + o_i[:, None] * (HV * V) + o_v[None, :], mask=m_tv, other=0.0)
    b_vn = tl.load(p_vn + o_i[:, None] * (HV * V) + o_v[None, :], mask=m_tv, other=0.0)
    b_dvv = tl.load(p_dv + o_i[:, None] * s_dv + o_v[None, :], mask=m_tv, other=0.0)
    # S^T and dS^T [BV, K] tiles of the [K, V] states, loaded transposed
    b_ht = tl.load(p_h + o_k[None, :] * V + o_v[:, None], mask=m_vk, other=0.0).to(dt_in)
    b_dht = tl.load(p_dh + o_k[None, :] * V + o_v[:, None], mask=m_vk, other=0.0).to(dt_in)
    b_hdh += tl.sum(tl.sum(b_ht.to(tl.float32) * b_dht.to(tl.float32), 1), 0)

    b_dog = (b_do.to(tl.float32) * b_dos_f[:, None]).to(dt_in)
    b_dq = tl.dot(b_dog, b_ht, b_dq, input_precision=DOT_PRECISION)
    b_vnd = (b_vn.to(tl.float32) * b_decay[:, None]).to(dt_in)
    b_dk = tl.dot(b_vnd, b_dht, b_dk, input_precision=DOT_PRECISION)
    # w = A diag(beta gamma) K:  dk += diag(beta gamma) A^T dw = -diag(gamma) dv S^T
    b_dvg = (b_dvv.to(tl.float32) * (-b_gam)[:, None]).to(dt_in)
    b_dk = tl.dot(b_dvg, b_ht, b_dk, input_precision=DOT_PRECISION)
    return b_dq, b_dk, b_hdh


@triton.jit
def _head_epilogue(q, k, dAqk, dAkk, dgz, dg, b_dq, b_dk, r_q0, r_k0, b_hdh, b_gl, row0, i_hv, i_kb, o_i, m_t, o_k,
                   m_tk, last, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BT: tl.constexpr,
                   NK: tl.constexpr, G: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """A value head's intra-chunk products into dq, dk and its dg (reverse-cumsummed, stored or added
    into the zeroed dg where K is split); returns dq, dk and the rowsums the next head starts from."""
    b_q = tl.load(q + o_i[:, None] * (H * K) + o_k[None, :], mask=m_tk, other=0.0)
    b_k = tl.load(k + o_i[:, None] * (H * K) + o_k[None, :], mask=m_tk, other=0.0)
    b_q32 = b_q.to(tl.float32)
    b_k32 = b_k.to(tl.float32)
    # this head's state + w part of rowsum(dk * K) (for the last row's dG)
    b_dgl = tl.exp2(b_gl) * tl.sum(b_hdh, 0) + tl.sum((tl.sum(b_dk * b_k32, 1) - r_k0)[None, :], 1)

    # Output, intra-chunk: dq += dAqk K, dk += dAqk^T Q (dAqk^T loaded transposed). dAqk and dAkk
    # are masked by their rows only: the first half writes every column of the chunk's rows (zeros
    # above the diagonal and past the chunk's end), and a mask along the contiguous dimension
    # would split each load into 2-byte accesses (sm_90a).
    p_s = dAqk + (row0 * HV + i_hv) * BT
    b_s = tl.load(p_s + o_i[:, None] * (HV * BT) + o_i[None, :], mask=m_t[:, None], other=0.0)
    b_st = tl.load(p_s + o_i[None, :] * (HV * BT) + o_i[:, None], mask=m_t[None, :], other=0.0)
    b_dq = tl.dot(b_s, b_k, b_dq, input_precision=DOT_PRECISION)
    b_dk = tl.dot(b_st, b_q, b_dk, input_precision=DOT_PRECISION)

    p_gz = dgz + row0 * HV + i_hv + o_i * HV
    b_dgh = tl.where(i_kb == 0, tl.load(p_gz, mask=m_t, other=0.0), 0.0)  # block 0 adds the Z part
    b_dgh += (tl.sum(b_dq * b_q32, 1) - r_q0) - (tl.sum(b_dk * b_k32, 1) - r_k0)
    b_dgh += tl.where(o_i == last, b_dgl, 0.0)

    # A: dk += diag(beta) Z K + Z^T diag(beta) K = (dAkk + dAkk^T) K
    p_z = dAkk + (row0 * HV + i_hv) * BT
    b_z = tl.load(p_z + o_i[:, None] * (HV * BT) + o_i[None, :], mask=m_t[:, None], other=0.0).to(tl.float32)
    b_z += tl.load(p_z + o_i[None, :] * (HV * BT) + o_i[:, None], mask=m_t[None, :], other=0.0).to(tl.float32)
    b_dk = tl.dot(b_z.to(q.dtype.element_ty), b_k, b_dk, input_precision=DOT_PRECISION)
    if G > 1:
        r_q0 = tl.sum(b_dq * b_q32, 1)
        r_k0 = tl.sum(b_dk * b_k32, 1)

    # dG reverse-cumsummed within the chunk: dg_t = sum over s >= t of dG_s
    b_dgh = tl.where(m_t, b_dgh, 0.0)
    b_rc = tl.sum(b_dgh[None, :], 1) - tl.cumsum(b_dgh, 0) + b_dgh  # [1, N]: see wy_dv_bwd
    if NK == 1:
        tl.store(dg + row0 * HV + i_hv + o_i * HV, b_rc.to(dg.dtype.element_ty), mask=m_t)
    else:  # this block's part of a sum over K, into the zeroed dg
        tl.atomic_add(dg + row0 * HV + i_hv + o_i * HV, b_rc.to(dg.dtype.element_ty), mask=m_t)
    return b_dq, b_dk, r_q0, r_k0


@triton.jit(do_not_specialize=["T"])
def wy_dqk_bwd_kernel(
    q,  # [B, T, H, K] (l2-normalized where the op normalizes)
    k,  # [B, T, H, K]
    v_new,  # [B, T, HV, V]
    g,  # [B, T, HV] fp32, chunk-local cumulative log2 gate
    h,  # [B, NT, HV, K, V]: the state before each chunk
    dh,  # [B, NT, HV, K, V]: the gradient of the state after each chunk
    do,  # [B, T, HV, V]
    dv,  # [B, T, HV, V]: diag(beta) A^T dv2 (the first half's), rows s_dv elements apart
    dAqk,  # [B, T, HV, BT], every column of the chunk's rows written (zeros above the diagonal)
    dAkk,  # [B, T, HV, BT], likewise
    dgz,  # [B, T, HV] fp32
    dq,  # [B, T, H, K]
    dk,  # [B, T, H, K]
    dg,  # [B, T, HV] fp32 (reverse-cumsummed within the chunk)
    cu_seqlens,  # [N + 1] | unused
    chunk_indices,  # [NT, 2] | unused
    scale,
    T,
    WORK,  # autotune key only: tuning.chunk_work(chunks x the grid's heads)
    s_dv,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, KP: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    IS_VARLEN: tl.constexpr, DOT_PRECISION: tl.constexpr, PER_HEAD: tl.constexpr = False,
):
    NK: tl.constexpr = (KP + BK - 1) // BK
    if PER_HEAD:
        # one program per (chunk, value head, K block), writing that head's share of dq, dk ([B, T, HV, K])
        _, i_hv0, i_h, i_tg, row0, n_valid = chunk_program(cu_seqlens, chunk_indices, T, H, HV, BT, IS_VARLEN, NK)
        G: tl.constexpr = 1
        HO: tl.constexpr = HV
        i_o = i_hv0
    else:
        # one program per (chunk, qk head, K block): chunk_program's 'value head' is the qk head here
        _, i_h, _, i_tg, row0, n_valid = chunk_program(cu_seqlens, chunk_indices, T, H, H, BT, IS_VARLEN, NK)
        G: tl.constexpr = HV // H
        HO: tl.constexpr = H
        i_o = i_h
        i_hv0 = i_h * G
    i_kb = tl.program_id(0) % NK
    last = n_valid - 1

    o_i = tl.arange(0, BT)
    m_t = o_i < n_valid
    o_k = i_kb * BK + tl.arange(0, BK)
    m_k = o_k < K
    m_tk = m_t[:, None] & m_k[None, :]

    # Per-chunk base pointers (int64); offsets inside a chunk fit in int32.
    q += (row0 * H + i_h) * K
    k += (row0 * H + i_h) * K
    dq += (row0 * HO + i_o) * K
    dk += (row0 * HO + i_o) * K

    b_dq = tl.zeros([BT, BK], dtype=tl.float32)
    b_dk = tl.zeros([BT, BK], dtype=tl.float32)
    r_q0 = tl.zeros([BT], dtype=tl.float32)  # rowsum(dq * q), rowsum(dk * k) of the heads before
    r_k0 = tl.zeros([BT], dtype=tl.float32)
    for i_g in range(G):
        i_hv = i_hv0 + i_g
        p_g = g + row0 * HV + i_hv
        b_g = tl.load(p_g + o_i * HV, mask=m_t, other=0.0).to(tl.float32)
        b_gl = tl.load(p_g + last * HV).to(tl.float32)
        b_gam = tl.where(m_t, tl.exp2(b_g), 0.0)
        b_decay = tl.where(m_t, tl.exp2(b_gl - b_g), 0.0)  # gamma_L / gamma, <= 1
        b_dos_f = b_gam * scale
        p_h = h + (i_tg * HV + i_hv) * K * V
        p_dh = dh + (i_tg * HV + i_hv) * K * V
        p_vn = v_new + (row0 * HV + i_hv) * V
        p_do = do + (row0 * HV + i_hv) * V
        p_dv = dv + row0 * s_dv + i_hv * V

        b_hdh = tl.zeros([1], dtype=tl.float32)  # sum(S * dS)
        for i_v in range(tl.cdiv(V, BV)):
            b_dq, b_dk, b_hdh = _state_block(q, p_do, p_vn, p_dv, p_h, p_dh, s_dv, b_dq, b_dk, b_hdh, b_dos_f,
                                             b_decay, b_gam, i_v, o_i, m_t, o_k, m_k, HV, V, BV, DOT_PRECISION)
        b_dq, b_dk, r_q0, r_k0 = _head_epilogue(
            q, k, dAqk, dAkk, dgz, dg, b_dq, b_dk, r_q0, r_k0, b_hdh, b_gl, row0, i_hv, i_kb, o_i, m_t, o_k,
            m_tk, last, H, HV, K, BT, NK, G, DOT_PRECISION)

    tl.store(dq + o_i[:, None] * (HO * K) + o_k[None, :], b_dq.to(dq.dtype.element_ty), mask=m_tk)
    tl.store(dk + o_i[:, None] * (HO * K) + o_k[None, :], b_dk.to(dk.dtype.element_ty), mask=m_tk)


def _prune(configs, named_args, **kwargs):
    """Drop configurations whose K block is wider than the padded K (then BV as the first half)."""
    KP = kwargs.get("KP", named_args.get("KP"))
    kept = [c for c in configs if c.kwargs["BK"] <= KP] or list(configs[:1])
    return prune_bv(kept, named_args, **kwargs)


wy_dqk_bwd_kernel_tuned = triton.autotune(
    configs=autotune_configs(CONFIGS), **autotune_cache(),
    key=["H", "HV", "K", "V", "BT", "IS_VARLEN", "PER_HEAD", "WORK"], reset_to_zero=["dg"],
    prune_configs_by={"early_config_prune": _prune},
)(wy_dqk_bwd_kernel)


def wy_dqk_bwd(q, k, v_new, g, h, dh, do, dv, dAqk, dAkk, dgz, scale, NT: int, cu_seqlens=None,
               chunk_indices=None, chunk_size: int = 64, out_dtype=None, per_head: bool = False, *,
               config: triton.Config | None = None):
    """The second half of the GDN backward (shapes checked and made contiguous by the caller,
    ``wy_dqkwg_bwd``): q, k ``[B, T, H, K]``; v_new, do, dv ``[B, T, HV, V]`` (dv: the first
    half's, rows possibly strided); g ``[B, T, HV]``; h, dh ``[B, NT, HV, K, V]``; dAqk, dAkk ``[B, T, HV, BT]`` and
    dGz ``[B, T, HV]`` (the first half's). Returns ``(dq, dk [B, T, H, K]`` in ``out_dtype``
    (q's by default), ``dg [B, T, HV]`` fp32, reverse-cumsummed). ``per_head``: a program per value
    head, and dq, dk ``[B, T, HV, K]``, each value head's share (its group's sum is the gradient:
    ``inputs_bwd`` adds them as it loads them)."""
    B, T, H, K = q.shape
    HV, V = v_new.shape[2], v_new.shape[3]
    out_dtype = out_dtype or q.dtype
    HO = HV if per_head else H
    dq = alloc((B, T, HO, K), dtype=out_dtype, device=q.device)
    dk = alloc((B, T, HO, K), dtype=out_dtype, device=q.device)
    KP = max(16, next_pow2(K))
    # zeroed when a K block narrower than K may run: the blocks add their parts of dG into it
    split = (config.kwargs["BK"] if config is not None else MIN_BK) < KP
    dg = (torch.zeros if split else alloc)((B, T, HV), dtype=torch.float32, device=q.device)
    is_varlen = cu_seqlens is not None
    args = dict(
        q=q, k=k, v_new=v_new, g=g, h=h, dh=dh, do=do, dv=dv, dAqk=dAqk, dAkk=dAkk, dgz=dgz, dq=dq, dk=dk, dg=dg,
        cu_seqlens=cu_seqlens if is_varlen else dg, chunk_indices=chunk_indices if is_varlen else dg,
        scale=float(scale), T=T, WORK=chunk_work(B, T, chunk_size, HO), s_dv=row_stride(dv, "dv"),
        H=H, HV=HV, K=K, V=V, BT=chunk_size, KP=KP,
        IS_VARLEN=is_varlen, DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", PER_HEAD=bool(per_head),
    )
    # the K blocks of one (chunk, head) adjacent on axis 0 (chunk_program's SPLIT)
    grid = lambda meta: (NT * cdiv(KP, meta["BK"]), B * HO)  # noqa: E731
    launch(wy_dqk_bwd_kernel_tuned, grid, config, **args)
    record_launch("gdn.wy_dqk_bwd")
    return dq, dk, dg
