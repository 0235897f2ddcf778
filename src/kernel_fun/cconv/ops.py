"""The public entry of cconv: classify the call, run ours or fla's (and say why), log once.

Drop-in for fla 0.6.0 ``fla.modules.causal_conv1d.causal_conv1d``: same signature, returns
``(y, final_state)`` with ``final_state`` None on our path (``output_final_state=True`` routes).
"""
from __future__ import annotations

import torch

from .._common import classify as C
from .._common import support
from .._common.compat import fla_symbol
from .._common.varlen import check_cu_seqlens

FAMILY = "cconv"
_FLOATS = (torch.bfloat16, torch.float16, torch.float32)


def _backend(value, call):
    return None if value in (None, "triton") else f"backend={value!r} (ours replaces the 'triton' backend)"


def _activation(value, call):
    return None if value in (None, "silu", "swish") else f"activation={value!r} (ours: None, 'silu', 'swish')"


# One rule per parameter of fla's signature (tests/cconv check this against the installed fla).
RULES = {
    "x": C.ours(),
    "weight": C.check(lambda v, call: "weight=None" if v is None else None),
    "bias": C.ours(),
    "residual": C.only(None, "residual"),
    "initial_state": C.only(None, "initial_state"),
    "output_final_state": C.check(lambda v, call: "output_final_state=True" if v else None),
    "activation": C.check(_activation),
    "backend": C.check(_backend),
    "cu_seqlens": C.ours(),
    "cu_seqlens_cpu": C.ours(),  # used to validate cu_seqlens without a device sync
    "chunk_indices": C.ours(),  # fla's chunk list derived from cu_seqlens; our kernels need none
    "cp_context": C.only(None, "cp_context"),
}


def _validate(x, weight, bias) -> None:
    """Bad input is a clear ValueError on our path (fla's own errors where we forward)."""
    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        raise ValueError(f"cconv: x must be [B, T, D], got shape {tuple(getattr(x, 'shape', ()))}")
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise ValueError(f"cconv: weight must be [D, W], got shape {tuple(getattr(weight, 'shape', ()))}")
    if weight.shape[0] != x.shape[-1]:
        raise ValueError(f"cconv: x {tuple(x.shape)} and weight {tuple(weight.shape)} disagree on D")
    if bias is not None and tuple(bias.shape) != (x.shape[-1],):
        raise ValueError(f"cconv: bias must be [D] = [{x.shape[-1]}], got {tuple(bias.shape)}")
    for name, t in (("x", x), ("weight", weight), ("bias", bias)):
        if t is not None and not t.is_floating_point():
            raise ValueError(f"cconv: {name} must be a float tensor, got {t.dtype}")


def _signature(x, weight, bias, silu, cu_seqlens, tma):
    # x's 16-byte alignment and the forward's kernel (`tma`: fwd.use_tma(x)) pick kernels and
    # configs too (the TMA forward, 16 B vector loads)
    return (tuple(x.shape), tuple(x.stride()), x.dtype, x.data_ptr() % 16 == 0, tma,
            weight.shape[1], weight.dtype, None if bias is None else bias.dtype, silu,
            cu_seqlens is not None)


def _box(x, weight, bias, cu_seqlens, cu_seqlens_cpu):
    _validate(x, weight, bias)
    if x.dtype not in _FLOATS:
        return False, f"x dtype {x.dtype} (ours: bfloat16, float16, float32)"
    W = weight.shape[1]
    if not 1 <= W <= 4:
        return False, f"kernel width W={W} (ours: 1..4)"
    if x.shape[1] == 0 or x.shape[0] == 0 or x.shape[2] == 0:
        return False, "empty input"
    if cu_seqlens is not None:
        if x.shape[0] != 1:
            return False, f"cu_seqlens with batch size {x.shape[0]} (packed documents need B == 1)"
        check_cu_seqlens(FAMILY, cu_seqlens, cu_seqlens_cpu, x.shape[1])
    return True, ""


def _decide(call: dict, extra: dict) -> tuple[bool, str]:
    x, weight, bias = call["x"], call["weight"], call["bias"]
    cu = call["cu_seqlens"]

    def describe():
        from ._kernels.fwd import use_tma

        needs_grad = torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (x, weight, bias))
        return _signature(x, weight, bias, call["activation"] is not None, cu, use_tma(x)), needs_grad

    return support.decide(
        FAMILY,
        lambda: C.classify(RULES, call, extra),
        lambda: _box(x, weight, bias, cu, call["cu_seqlens_cpu"]),
        lambda: support.tensor_gate(x, weight, bias, cu),
        lambda: support.capture_gate(FAMILY, describe),
    )


def is_supported(x, weight=None, bias=None, residual=None, initial_state=None,
                 output_final_state=False, activation=None, backend="triton", cu_seqlens=None,
                 cu_seqlens_cpu=None, chunk_indices=None, cp_context=None, **kwargs):
    """(ok, reason): would ``causal_conv1d`` with these arguments run our kernels?"""
    call = dict(locals())
    extra = call.pop("kwargs")
    return _decide(call, extra)


@torch.compiler.disable  # the gate reads env switches and logs: keep it out of traced graphs
def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool | None = False,
    activation: str | None = None,
    backend: str | None = "triton",
    cu_seqlens: torch.Tensor | None = None,
    cu_seqlens_cpu: torch.LongTensor | None = None,
    chunk_indices: torch.LongTensor | None = None,
    cp_context=None,
    **kwargs,
):
    """Depthwise causal conv of width W over time, with optional bias and silu.

    Args:
        x: ``[B, T, D]`` bf16/fp16/fp32, any strides (a column slice, a transposed buffer).
        weight: ``[D, W]``, W in 1..4, any float dtype. bias: ``[D]`` or None.
        activation: None, "silu" or "swish".
        cu_seqlens: ``[N+1]`` offsets of packed documents (B == 1); no document sees another's tokens.
    Returns:
        ``(y, None)``: y ``[B, T, D]`` in x's dtype. Anything outside our box goes to fla's
        ``causal_conv1d`` verbatim (see ``is_supported`` and the INFO log for why).
    """
    call = dict(locals())
    kwargs = call.pop("kwargs")
    ok, reason = _decide(call, kwargs)
    support.report(FAMILY, ok, reason, detail=f"x {tuple(x.shape)} {x.dtype}" if hasattr(x, "shape") else "")
    if not ok:
        return fla_symbol("fla.modules.causal_conv1d", "causal_conv1d")(**call, **kwargs)
    from ._kernels.fwd import use_tma
    from .autograd import CausalConv1dFunction

    silu = activation is not None
    tma = use_tma(x)  # decided once: the forward's kernel and the signature both take it
    sig = _signature(x, weight, bias, silu, cu_seqlens, tma)
    y = CausalConv1dFunction.apply(x, weight, bias, silu, cu_seqlens, sig, tma)
    return y, None
