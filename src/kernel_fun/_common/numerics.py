"""The one error measure of the design's Numerics, used by tests, checks and benches."""
from __future__ import annotations


def rel_rms(out, ref) -> float:
    """``||out - ref|| / ||ref||`` in fp64. NaN anywhere in ``out`` gives NaN, which fails every
    ``<=`` bound, so an unwritten (poisoned) element fails the comparison."""
    out, ref = out.detach().double(), ref.detach().double()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))
