"""cconv: the short depthwise causal conv (+ silu) that feeds KDA and GDN, fwd + bwd.

Drop-in for fla 0.6.0 ``fla.modules.causal_conv1d.causal_conv1d``.
"""
from .ops import causal_conv1d, is_supported
from .warmup import warmup

__all__ = ["causal_conv1d", "is_supported", "warmup"]
