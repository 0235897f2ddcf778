"""What both delta-rule front-ends (kda, gdn) do to their inputs around the chain, with fla's
own functions: contiguous inputs (fla's stages need them; its entries' ``input_guard`` makes
them so, and GatedDeltaNet's fused q/k/v conv hands over column slices of one buffer), the
l2norm of q and k, beta's sigmoid (times 2 with ``allow_neg_eigval``), and their backward.
"""
from __future__ import annotations

from .._common.compat import fla_symbol


def _fla(module: str, symbol: str):  # one place for the CPU tests' plain-torch stand-ins
    return fla_symbol(module, symbol)


def prepare(q, k, v, g, beta, use_qk_l2norm: bool, use_beta_sigmoid: bool, allow_neg_eigval: bool):
    """Returns ``(q, q_rstd, k, k_rstd, v, g, beta_raw, beta, beta_scale)``: q, k normalized (with
    their rstd) when asked, beta activated when asked, every tensor contiguous."""
    q, k, v, g, beta = (t.contiguous() for t in (q, k, v, g, beta))
    q_rstd = k_rstd = None
    if use_qk_l2norm:
        q, q_rstd = l2norm_fwd(q)
        k, k_rstd = l2norm_fwd(k)
    beta_scale = 2.0 if allow_neg_eigval else 1.0
    beta_act = beta_sigmoid_fwd(beta, beta_scale) if use_beta_sigmoid else beta
    return q, q_rstd, k, k_rstd, v, g, beta, beta_act, beta_scale


def l2norm_fwd(x):
    return _fla("fla.modules.norm.l2norm", "l2norm_fwd")(x)


def l2norm_bwd(y, rstd, dy):
    return _fla("fla.modules.norm.l2norm", "l2norm_bwd")(y, rstd, dy)


def beta_sigmoid_fwd(x, scale):
    return _fla("fla.ops.common.gate", "fused_beta_sigmoid_fwd")(x, scale=scale)


def beta_sigmoid_bwd(x, dy, scale):
    return _fla("fla.ops.common.gate", "fused_beta_sigmoid_bwd")(x, dy, scale=scale)
