"""Triton kernels of the delta-rule engine, one file per stage or fused stage."""
