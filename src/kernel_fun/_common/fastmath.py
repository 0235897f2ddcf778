"""Elementwise math for the bandwidth-bound kernels, where the instruction count decides
whether the loads stay in flight.

`sigmoid`: 1 / (1 + exp(-x)) in fp32. ``tl.sigmoid`` compiles (sm_90a, Triton 3.6) to 13
instructions: a negate, the log2(e) scale, ``ex2.approx.f32`` with its denormal fix-up (a
compare and two predicated multiplies) and ``div.full.f32`` (a compare, a select, a
predicated scale, the reciprocal and a multiply). With FAST it is four: ``mul``,
``ex2.approx.ftz``, ``add``, ``rcp.approx.ftz``. Accuracy: ex2.approx ~2 ulp and rcp.approx
1 ulp, against div.full's 2 ulp; flushing subnormals changes nothing that survives the
fp32 sum (exp(-x) below 2**-126 gives 1 + e == 1 either way), and for x < -88 exp(-x) is
inf and the result 0, as before.

FAST must be False under Triton's interpreter (it cannot run PTX): launchers pass
`FAST_MATH`, which is False exactly there.

`round_tf32`: an fp32 dot operand rounded to nearest tf32 (the tensor cores truncate).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .tuning import interpreting

FAST_MATH = not interpreting()


@triton.jit
def sigmoid(x, FAST: tl.constexpr):
    """1 / (1 + exp(-x)) of an fp32 tensor (see the module docstring for FAST)."""
    if FAST:
        y = tl.inline_asm_elementwise(
            "{ .reg .f32 t; mul.f32 t, $1, 0fBFB8AA3B; ex2.approx.ftz.f32 t, t; "
            "add.f32 t, t, 0f3F800000; rcp.approx.ftz.f32 $0, t; }",
            "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1)
    else:
        y = tl.sigmoid(x)
    return y


@triton.jit
def round_tf32(x):
    """fp32 x rounded to the nearest tf32 value (10 stored mantissa bits; ties away from zero),
    in integer ops, so it runs the same under the interpreter. Before a ``tl.dot`` with
    ``input_precision="tf32"``: Hopper's tensor cores drop an fp32 operand's low 13 mantissa
    bits (truncation toward zero), so every product of such a dot is biased toward zero by about
    2^-11 of its size, and a sum of many (a gate gradient summed over tokens and channels, where
    terms cancel) keeps the bias. Rounded operands reach the tensor cores unchanged; their
    errors have no sign."""
    b = x.to(tl.int32, bitcast=True)
    b = (b + 0x1000) & -8192  # -8192 = 0xFFFFE000: keep sign, exponent and the top 10 mantissa bits
    return b.to(tl.float32, bitcast=True)
