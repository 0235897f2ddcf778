"""gnorm: the gated RMSNorm that closes KDA and GDN layers (``o_norm(o, g)``), fwd + bwd.

Drop-in for fla 0.6.0 ``fla.modules.norm.fused_norm_gate.rms_norm_gated`` and
``FusedRMSNormGated``.
"""
from .module import FusedRMSNormGated
from .ops import is_supported, rms_norm_gated
from .warmup import warmup

__all__ = ["FusedRMSNormGated", "is_supported", "rms_norm_gated", "warmup"]
