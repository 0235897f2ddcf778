"""`_common.fastmath.round_tf32` (interpreted): every fp32 value to its nearest tf32 value (ties away
from zero), exactly as a frexp-based reference rounds it; unbiased where truncation (what Hopper's
tensor cores do to an fp32 operand of a tf32 dot) is biased toward zero."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernel_fun._common.fastmath import round_tf32


@triton.jit
def _round_kernel(x, y, n, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    tl.store(y + o, round_tf32(tl.load(x + o, mask=m, other=0.)), mask=m)


def _round(x):
    y = torch.empty_like(x)
    _round_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    return y


def _nearest_tf32(x):
    """fp64 reference: |x| = m 2^e with m in [0.5, 1); keep 11 significant bits (1 implicit + 10),
    half away from zero."""
    xd = x.double()
    m, e = torch.frexp(xd)
    r = torch.sign(m) * torch.floor(m.abs() * 2.0 ** 11 + 0.5) / 2.0 ** 11
    return torch.ldexp(r, e).float()


def test_round_tf32_is_round_to_nearest():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(50_000, generator=gen) * torch.exp2(torch.randint(-40, 40, (50_000,), generator=gen).float())
    ties = torch.tensor([1.0 + 2.0 ** -11, -(1.0 + 2.0 ** -11), 1.0 + 3 * 2.0 ** -11, 0.0, -0.0, 2.0 ** -120, 3.0e38])
    x = torch.cat([x, ties])
    y = _round(x)
    assert torch.equal(y, _nearest_tf32(x))
    assert torch.equal(y[-7:-4], torch.tensor([1.0 + 2.0 ** -10, -(1.0 + 2.0 ** -10), 1.0 + 2 * 2.0 ** -10]))
    # the low 13 mantissa bits are clear: the tensor cores' truncation keeps such a value as it is
    assert not (y.view(torch.int32) & 0x1FFF).any()
    ax = x.double().abs().clamp_min(1e-300)
    rel = (y.double().abs() - x.double().abs()) / ax  # the move of the magnitude
    assert rel.abs().max() <= 2.0 ** -11
    trunc = (x.view(torch.int32) & -8192).view(torch.float32)
    bias_rn = rel.mean().item()
    bias_trunc = ((trunc.double().abs() - x.double().abs()) / ax).mean().item()
    assert abs(bias_rn) < 2e-5 and bias_trunc < -2e-4, (bias_rn, bias_trunc)
