"""Triton kernels of the cconv family: `fwd` (the convolution) and `bwd` (dx, dw, db)."""
