"""Plain-torch fp64 reference for the short causal depthwise convolution: the tests' oracle.

Written from the math, one `F.conv1d` per sequence:

    y[b, t, d] = act(bias[d] + sum_{i=0}^{W-1} weight[d, i] * x[b, t - (W-1) + i, d])

with x before the start of the token's own sequence taken as 0. This is the orientation of
fla 0.6.0's `causal_conv1d` (its kernel multiplies weight[:, i] with x shifted by
i - (W-1)), i.e. PyTorch's `conv1d` (a cross-correlation) on x left-padded with W-1 zeros.
With `cu_seqlens` ([N+1], B == 1) the tokens are packed documents that never see each other.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _segments(T: int, cu_seqlens: torch.Tensor | None) -> list[tuple[int, int]]:
    if cu_seqlens is None:
        return [(0, T)]
    cu = [int(c) for c in cu_seqlens.detach().cpu().tolist()]
    return [(cu[i], cu[i + 1]) for i in range(len(cu) - 1)]


def conv_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    silu: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    *,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """y `[B, T, D]` in fp64 (differentiable) from x `[B, T, D]`, weight `[D, W]`, bias `[D]`;
    ``dtype`` computes it at another precision (a test's fp32 floor)."""
    B, T, D = x.shape
    W = weight.shape[1]
    if cu_seqlens is not None:
        assert B == 1, "cu_seqlens packs documents along T of a single batch row"
    x64 = x.to(dtype)
    w64 = weight.to(dtype)
    b64 = bias.to(dtype) if bias is not None else None
    ys = []
    for bos, eos in _segments(T, cu_seqlens):
        if eos == bos:
            continue
        xs = x64[:, bos:eos].transpose(1, 2)  # [B, D, L]
        ys.append(F.conv1d(F.pad(xs, (W - 1, 0)), w64[:, None, :], b64, groups=D).transpose(1, 2))
    y = torch.cat(ys, dim=1)
    return F.silu(y) if silu else y


def conv_ref_bwd(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    dy: torch.Tensor,
    silu: bool = False,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(dx, dw, db) in fp64 by autograd through `conv_ref`; db is None without a bias."""
    x64 = x.detach().double().requires_grad_()
    w64 = weight.detach().double().requires_grad_()
    b64 = bias.detach().double().requires_grad_() if bias is not None else None
    y = conv_ref(x64, w64, b64, silu, cu_seqlens)
    inputs = [x64, w64] + ([b64] if b64 is not None else [])
    grads = torch.autograd.grad(y, inputs, dy.double())
    return grads[0], grads[1], (grads[2] if b64 is not None else None)
