"""Triton kernels of the gnorm family: `fwd` (norm, gate, residual), `bwd` (dx, dg, dw/db
partials) and `dw_reduce` (the fixed-order sum of those partials)."""
