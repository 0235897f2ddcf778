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
