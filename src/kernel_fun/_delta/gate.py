"""The in-op gate both front-ends take, ``-exp(A_log) * softplus(g_raw + dt_bias)`` (KDA per
channel, GDN per head), as Triton helpers on a tile of ``b_x = g_raw + dt_bias`` (fp32) with
``b_nA = -exp(A_log)``. softplus as fla's: x past 20 taken as is (fla evaluates it with
approximate exp2/log2, these with exp/log)."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def gate_value(b_x, b_nA):
    """The gate on a tile (exp taken only below 20, so nothing overflows)."""
    m_sm = b_x < 20.0
    return b_nA * tl.where(m_sm, tl.log(1.0 + tl.exp(tl.where(m_sm, b_x, 0.0))), b_x)


@triton.jit
def gate_grad(b_dyg, b_x, b_nA):
    """The gate's backward on a tile: ``b_dyg`` the gradient of the gate value (fp32). Returns
    (the gradient of g_raw, the terms whose sum is dA_log). softplus and sigmoid from one exp:
    3 MUFU ops per element (exp, log, reciprocal), not 4."""
    b_e = tl.exp(b_x)
    m_sm = b_x < 20.0
    b_sp = tl.where(m_sm, tl.log(1.0 + b_e), b_x)
    b_sig = tl.where(m_sm, tl.fdiv(b_e, 1.0 + b_e), 1.0)
    return b_nA * b_dyg * b_sig, b_dyg * (b_nA * b_sp)
