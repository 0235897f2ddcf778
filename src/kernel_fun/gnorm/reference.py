"""Plain-torch fp64 reference for the gated RMSNorm: the tests' oracle, written from the math.

For x, g `[..., V]` (rows over every leading dimension):

    h    = x + residual                     (x alone without a residual)
    y    = h / sqrt(mean(h^2, -1) + eps) * weight (+ bias)
    out  = y * g * sigmoid(g)               (activation 'swish' or 'silu')
         = y * sigmoid(g)                   (activation 'sigmoid')

`rms_norm_gated_ref` returns out, or (out, h) with prenorm, like fla 0.6.0's
`rms_norm_gated`; gradients come from autograd through it (`rms_norm_gated_ref_grads`).
"""
from __future__ import annotations

import torch


def rms_norm_gated_ref(x, g, weight=None, bias=None, activation="swish", residual=None,
                       prenorm=False, eps=1e-6, *, dtype=torch.float64):
    """out `[..., V]` (and h with prenorm) in fp64, differentiable; ``dtype`` computes it at another
    precision (a test's fp32 floor)."""
    h = x.to(dtype) if residual is None else x.to(dtype) + residual.to(dtype)
    y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.to(dtype)
    if bias is not None:
        y = y + bias.to(dtype)
    g64 = g.to(dtype)
    if activation in ("swish", "silu"):
        out = y * g64 * torch.sigmoid(g64)
    elif activation == "sigmoid":
        out = y * torch.sigmoid(g64)
    else:
        raise ValueError(f"activation {activation!r}")
    return (out, h) if prenorm else out


def rms_norm_gated_ref_grads(x, g, weight, bias, dout, activation="swish", residual=None,
                             dres=None, eps=1e-6) -> dict:
    """fp64 gradients by autograd: keys x, g, weight, bias, residual (present inputs only).
    ``dres``: the gradient of the prenorm output h (None: h unused)."""
    leaves = {k: t.detach().double().requires_grad_() for k, t in
              (("x", x), ("g", g), ("weight", weight), ("bias", bias), ("residual", residual))
              if t is not None}
    out, h = rms_norm_gated_ref(leaves["x"], leaves["g"], leaves.get("weight"), leaves.get("bias"),
                                activation, leaves.get("residual"), True, eps)
    outs, grads_in = [out], [dout.double()]
    if dres is not None:
        outs.append(h)
        grads_in.append(dres.double())
    grads = torch.autograd.grad(outs, list(leaves.values()), grads_in)
    return dict(zip(leaves.keys(), grads))
