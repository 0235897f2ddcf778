"""gdn: Gated DeltaNet, chunked, forward and backward.

Drop-in for fla 0.6.0 ``fla.ops.gated_delta_rule.chunk_gated_delta_rule``.
"""
from .ops import chunk_gated_delta_rule, is_supported
from .warmup import warmup

__all__ = ["chunk_gated_delta_rule", "is_supported", "warmup"]
