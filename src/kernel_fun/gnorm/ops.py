"""The public entry of gnorm: classify the call, run ours or fla's (and say why), log once.

Drop-in for fla 0.6.0 ``fla.modules.norm.fused_norm_gate.rms_norm_gated``: same signature
and return contract (y, or ``(y, h)`` with ``prenorm=True``, h = x + residual in the
residual's dtype, fp32 under ``residual_in_fp32``, else x itself).
"""
from __future__ import annotations

import numbers

import torch

from .._common import classify as C
from .._common import capture
from .._common import gate
from .._common import hardware
from .._common import report
from .._common.compat import fla_symbol
from ._kernels.common import GATES, MAX_V

FAMILY = "gnorm"
_FLOATS = (torch.bfloat16, torch.float16, torch.float32)


def _activation(value, call):
    return None if value in GATES else f"activation={value!r} (ours: 'swish', 'silu', 'sigmoid')"


def _flag(name):
    def check(value, call):
        return None if isinstance(value, bool) else f"{name}={value!r} (ours: a bool)"
    return C.check(check)


def _eps(value, call):
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    return None if ok else f"eps={value!r} (ours: a Python number)"


# One rule per parameter of fla's signature (tests/gnorm check this against the installed fla).
RULES = {
    "x": C.ours(),
    "g": C.ours(),
    "weight": C.ours(),  # a [V] tensor or None
    "bias": C.ours(),  # a [V] tensor or None
    "activation": C.check(_activation),
    "residual": C.ours(),
    "prenorm": _flag("prenorm"),
    "residual_in_fp32": _flag("residual_in_fp32"),
    "eps": C.check(_eps),
}


def _validate(x, g, weight, bias, residual) -> None:
    """Bad input is a clear ValueError on our path (fla's own errors where we forward)."""
    if not isinstance(x, torch.Tensor) or x.dim() == 0:
        raise ValueError(f"gnorm: x must be a tensor [..., V], got {type(x).__name__} "
                         f"{tuple(getattr(x, 'shape', ()))}")
    if not isinstance(g, torch.Tensor) or g.shape != x.shape:
        raise ValueError(f"gnorm: g must have x's shape {tuple(x.shape)}, got "
                         f"{tuple(getattr(g, 'shape', ())) if isinstance(g, torch.Tensor) else type(g).__name__}")
    V = x.shape[-1]
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and (not isinstance(t, torch.Tensor) or tuple(t.shape) != (V,)):
            raise ValueError(f"gnorm: {name} must be [V] = [{V}] or None, got "
                             f"{tuple(getattr(t, 'shape', ())) if isinstance(t, torch.Tensor) else type(t).__name__}")
    if residual is not None and (not isinstance(residual, torch.Tensor) or residual.shape != x.shape):
        raise ValueError(f"gnorm: residual must have x's shape {tuple(x.shape)}, got "
                         f"{tuple(getattr(residual, 'shape', ()))}")
    for name, t in (("x", x), ("g", g), ("weight", weight), ("bias", bias), ("residual", residual)):
        if t is not None and not t.is_floating_point():
            raise ValueError(f"gnorm: {name} must be a float tensor, got {t.dtype}")


def _box(x, g, weight, bias, residual):
    _validate(x, g, weight, bias, residual)
    for name, t in (("x", x), ("g", g), ("weight", weight), ("bias", bias), ("residual", residual)):
        if t is not None and t.dtype not in _FLOATS:
            return False, f"{name} dtype {t.dtype} (ours: bfloat16, float16, float32)"
    V = x.shape[-1]
    if not 1 <= V <= MAX_V:
        return False, f"V={V} (ours: 1..{MAX_V})"
    return True, ""


def _signature(x, g, weight, bias, residual, activation, prenorm, residual_in_fp32):
    # everything that picks a compiled kernel or an autotune key: shapes, dtypes, flags (prenorm:
    # the backward adds the prenorm output's gradient), row strides and 16-byte alignment
    # (Triton specializes on both)
    def t(v):
        return None if v is None else (v.dtype, v.stride(), v.data_ptr() % 16 == 0)

    return (tuple(x.shape), t(x), t(g), t(weight), t(bias), t(residual), GATES[activation],
            bool(prenorm), bool(residual_in_fp32))


_VERDICTS = gate.Verdicts()


def _tkey(t):
    return None if t is None else (type(t), t.shape, t.dtype)


def _static_key(call: dict, extra: dict):
    """What the classification and the box read, or None (then nothing is kept): the common
    call's flags are a str, two bools and a Python number, with no extra keywords."""
    if extra or type(call["activation"]) is not str or type(call["prenorm"]) is not bool \
            or type(call["residual_in_fp32"]) is not bool or type(call["eps"]) not in (float, int):
        return None
    x, g = call["x"], call["g"]
    if not (isinstance(x, torch.Tensor) and isinstance(g, torch.Tensor)):
        return None
    w, b, r = call["weight"], call["bias"], call["residual"]
    if not all(t is None or isinstance(t, torch.Tensor) for t in (w, b, r)):
        return None
    return (call["activation"], call["prenorm"], call["residual_in_fp32"], type(call["eps"]),
            _tkey(x), _tkey(g), _tkey(w), _tkey(b), _tkey(r))


def _decide(call: dict, extra: dict, key=None) -> tuple[bool, str]:
    x, g, weight, bias, residual = call["x"], call["g"], call["weight"], call["bias"], call["residual"]

    def describe():
        needs_grad = torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (x, g, weight, bias, residual))
        return (_signature(x, g, weight, bias, residual, call["activation"], call["prenorm"],
                           call["residual_in_fp32"]), needs_grad)

    return gate.decide_keyed(
        FAMILY, _VERDICTS, key,
        (lambda: C.classify(RULES, call, extra), lambda: _box(x, g, weight, bias, residual)),
        (lambda: hardware.tensor_gate(x, g, weight, bias, residual),
         lambda: capture.capture_gate(FAMILY, describe, x.device)),
    )


def is_supported(x, g, weight, bias, activation="swish", residual=None, prenorm=False,
                 residual_in_fp32=False, eps=1e-6, **kwargs):
    """(ok, reason): would ``rms_norm_gated`` with these arguments run our kernels?"""
    call = dict(locals())
    extra = call.pop("kwargs")
    return _decide(call, extra)


@torch.compiler.disable  # the gate reads env switches and logs: keep it out of traced graphs
def rms_norm_gated(
    x: torch.Tensor,
    g: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    activation: str = "swish",
    residual: torch.Tensor | None = None,
    prenorm: bool = False,
    residual_in_fp32: bool = False,
    eps: float = 1e-6,
    **kwargs,
):
    """Gated RMSNorm over the last dimension: ``rmsnorm(x (+ residual)) * weight (+ bias) * act(g)``.

    Args:
        x, g: ``[..., V]``, same shape, bf16/fp16/fp32 (may differ), any leading shape.
        weight, bias: ``[V]`` or None (any of the three float dtypes).
        activation: 'swish' / 'silu' (``g * sigmoid(g)``) or 'sigmoid'.
        residual: ``[..., V]`` or None, added to x before the norm.
        prenorm: also return h = x + residual (in residual's dtype; fp32 with
            ``residual_in_fp32`` and no residual; else x itself).
    Returns:
        y ``[..., V]`` in x's dtype, or ``(y, h)`` with prenorm. Anything outside our box goes
        to fla's ``rms_norm_gated`` verbatim (see ``is_supported`` and the INFO log for why).
    """
    call = {"x": x, "g": g, "weight": weight, "bias": bias, "activation": activation,
            "residual": residual, "prenorm": prenorm, "residual_in_fp32": residual_in_fp32, "eps": eps}
    ok, reason = _decide(call, kwargs, _static_key(call, kwargs))
    report.report(FAMILY, ok, reason, detail=lambda: f"x {tuple(x.shape)} {x.dtype}" if hasattr(x, "shape") else "")
    if not ok:
        return fla_symbol("fla.modules.norm.fused_norm_gate", "rms_norm_gated")(**call, **kwargs)
    from .autograd import RMSNormGatedFunction

    sig = _signature(x, g, weight, bias, residual, activation, prenorm, residual_in_fp32)
    return RMSNormGatedFunction.apply(x, g, weight, bias, residual, activation, float(eps), prenorm,
                                      residual_in_fp32, sig)
