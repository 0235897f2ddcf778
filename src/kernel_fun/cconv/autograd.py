"""The autograd.Function of cconv.

Saved for backward: x, weight, bias, cu_seqlens (no activations). The backward recomputes the
pre-activation inside its kernel from x, so nothing re-runs the forward as a separate launch.
Both directions launch under ``on_device(x.device)`` (Triton launches on the current device;
``_common/device.py`` says why the backward needs it too).
"""
from __future__ import annotations

import torch

from .._common import device as D
from .._common.capture import is_capturing, mark_warm
from ._kernels.bwd import conv_bwd
from ._kernels.fwd import conv_fwd


class CausalConv1dFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, silu: bool, cu_seqlens, signature, tma: bool):
        with D.on_device(x.device):
            y = conv_fwd(x, weight, bias, silu, cu_seqlens, tma=tma)
        ctx.save_for_backward(x, weight, bias, cu_seqlens)
        ctx.silu = silu
        ctx.signature = signature
        if not is_capturing():
            mark_warm("cconv", signature, "fwd", x.device)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, bias, cu_seqlens = ctx.saved_tensors
        with D.on_device(x.device):
            dx, dw, db = conv_bwd(x, weight, bias, dy, ctx.silu, cu_seqlens)
        if not is_capturing():
            mark_warm("cconv", ctx.signature, "bwd", x.device)
        need = ctx.needs_input_grad
        return (dx if need[0] else None, dw if need[1] else None,
                db if (bias is not None and need[2]) else None, None, None, None, None)
