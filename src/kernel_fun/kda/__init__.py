"""kda: Kimi Delta Attention, chunked, forward and backward.

Drop-in for fla 0.6.0 ``fla.ops.kda.chunk_kda``.
"""
from .ops import chunk_kda, is_supported
from .warmup import warmup

__all__ = ["chunk_kda", "is_supported", "warmup"]
