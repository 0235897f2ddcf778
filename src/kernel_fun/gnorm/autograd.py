"""The autograd.Function of gnorm.

Saved for backward: h (x + residual as the forward stored it, or x itself), g, weight, bias
and rstd (fp32 [N]): nothing is recomputed but the per-element math inside the backward
kernel. The prenorm output's gradient, when the caller uses it, is added into dx in the same
kernel. Both directions launch under ``on_device(x.device)`` (Triton launches on the current
device; ``_common/device.py``).
"""
from __future__ import annotations

import torch

from .._common import capture
from .._common import device as D
from ._kernels.bwd import gnorm_bwd
from ._kernels.fwd import gnorm_fwd


def rows2d(t: torch.Tensor, V: int) -> torch.Tensor:
    """``t`` as ``[N, V]`` rows with unit column stride: a view where one exists, else a copy."""
    t2 = t.reshape(-1, V)
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


class RMSNormGatedFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, g, weight, bias, residual, activation: str, eps: float, prenorm: bool,
                residual_in_fp32: bool, signature):
        shape, V = x.shape, x.shape[-1]
        x2, g2 = rows2d(x, V), rows2d(g, V)
        r2 = rows2d(residual, V) if residual is not None else None
        # fla's contract: h is stored in the residual's dtype, or fp32 under residual_in_fp32
        # (when x is not fp32 already); otherwise h is x and nothing is stored.
        if residual is not None:
            res_dtype = residual.dtype
        elif residual_in_fp32 and x.dtype != torch.float32:
            res_dtype = torch.float32
        else:
            res_dtype = None
        with D.on_device(x.device):
            y, rstd, h = gnorm_fwd(x2, g2, weight, bias, r2, res_dtype, eps, activation)
        h = x2 if h is None else h
        ctx.save_for_backward(h, g2, weight, bias, rstd)
        ctx.set_materialize_grads(False)
        ctx.activation = activation
        ctx.prenorm = prenorm
        ctx.shapes = (shape, g.shape)
        ctx.dtypes = (x.dtype, residual.dtype if residual is not None else None)
        ctx.signature = signature
        if not capture.is_capturing():
            capture.mark_warm("gnorm", signature, "fwd", x.device)
        y = y.view(shape)
        return (y, h.view(shape)) if prenorm else y

    @staticmethod
    def backward(ctx, dy, *rest):
        h, g2, weight, bias, rstd = ctx.saved_tensors
        (shape, g_shape), (x_dtype, res_dtype) = ctx.shapes, ctx.dtypes
        V = shape[-1]
        dres = rest[0] if ctx.prenorm else None
        # A gradient of an unused output arrives as None (not materialized). Zeros stand in, so
        # the backward's compiled variant depends on the call's signature alone (prenorm), not
        # on which outputs the caller used: a captured backward never meets a cold variant.
        if dy is None:
            dy = torch.zeros(h.shape, dtype=x_dtype, device=h.device)
        if ctx.prenorm and dres is None:
            dres = torch.zeros(h.shape, dtype=h.dtype, device=h.device)
        dy2 = rows2d(dy, V)
        dres2 = rows2d(dres, V) if dres is not None else None
        need = ctx.needs_input_grad
        with D.on_device(h.device):
            dx, dg, dw, db, dres_in = gnorm_bwd(h, g2, weight, bias, rstd, dy2, dres2, ctx.activation,
                                                x_dtype, res_dtype, need[2], need[3])
        if not capture.is_capturing():
            capture.mark_warm("gnorm", ctx.signature, "bwd", h.device)
        dx = dx.view(shape)
        d_res = None
        if res_dtype is not None and need[4]:
            d_res = dres_in.view(shape) if dres_in is not None else dx
        return (dx if need[0] else None, dg.view(g_shape) if need[1] else None, dw, db, d_res,
                None, None, None, None, None)
