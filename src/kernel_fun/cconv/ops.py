"""The public entry of cconv: classify the call, run ours or fla's (and say why), log once.

Drop-in for fla 0.6.0 ``fla.modules.causal_conv1d.causal_conv1d``: same signature, returns
``(y, final_state)``: ``final_state`` is fla's conv state after the call with
``output_final_state=True`` (generation's prefill; ``_final_state``), else None.

Bad input is a ValueError naming the argument and the shapes, raised before any launch and
before routing (fla 0.6.0 checks only x against weight: a wrong-length bias or a wrong-shape
initial_state reads out of bounds in its kernels). Under ``KERNEL_FUN_DISABLE`` /
``KERNEL_FUN_CCONV_DISABLE`` fla gets the call verbatim, bad input included.
"""
from __future__ import annotations

import torch

from .._common import classify as C
from .._common.capture import capture_gate
from .._common.compat import fla_symbol
from .._common.gate import decide
from .._common.hardware import tensor_gate
from .._common.report import report
from .._common.varlen import packed_gate

FAMILY = "cconv"
_kernels = None  # (use_tma, CausalConv1dFunction), imported on the first call (Triton is heavy)
_FLOATS = (torch.bfloat16, torch.float16, torch.float32)


# fla's backends name its implementations of one function: 'triton' (its kernels), 'cuda'
# (Dao's causal-conv1d, ShortConvolution's choice when that package is installed or
# FLA_CONV_BACKEND=cuda) and 'mix' (Triton forward, Dao's backward). Within our box (no
# residual, no initial state, no cp_context) all three compute y = act(conv(x) + bias), and so do we;
# 'triton' and 'cuda' give the same final state (fla's causal_conv1d_update_states), 'mix' none
# (it asserts output_final_state is False: that call routes, so the caller sees fla's error).
# Anything else (None included) makes fla raise "Unsupported backend": routed, so the caller
# sees fla's own error.
_OUR_BACKENDS = ("triton", "cuda", "mix")


def _backend(value, call):
    return None if value in _OUR_BACKENDS else f"backend={value!r} (ours replaces 'triton', 'cuda', 'mix')"


def _activation(value, call):
    return None if value in (None, "silu", "swish") else f"activation={value!r} (ours: None, 'silu', 'swish')"


# One rule per parameter of fla's signature (tests/cconv check this against the installed fla).
RULES = {
    "x": C.ours(),
    "weight": C.check(lambda v, call: "weight=None" if v is None else None),
    "bias": C.ours(),
    "residual": C.only(None, "residual"),
    "initial_state": C.only(None, "initial_state"),
    # ours: the last W inputs of each sequence (_final_state), torch ops; not with 'mix' (above)
    "output_final_state": C.check(lambda v, call: "output_final_state=True with backend='mix' (fla's has no final "
                                  "state there)" if v and call.get("backend") == "mix" else None),
    "activation": C.check(_activation),
    "backend": C.check(_backend),
    "cu_seqlens": C.ours(),
    "cu_seqlens_cpu": C.ours(),  # used to validate cu_seqlens without a device sync
    "chunk_indices": C.ours(),  # fla's chunk list derived from cu_seqlens; our kernels need none
    "cp_context": C.only(None, "cp_context"),
}


def _shape(t) -> tuple:
    return tuple(getattr(t, "shape", ()))


def _validate(x, weight, bias, residual, initial_state, cu_seqlens) -> None:
    """Raise a ValueError naming the argument for input no implementation can compute.

    x ``[B, T, D]`` float; weight ``[D, W]`` float, W >= 1 (None routes: fla's business);
    bias ``[D]`` float; residual ``[B, T, D]``; initial_state ``[N, D, W]`` float with N = B,
    or the number of documents under cu_seqlens. Empty B, T or D are valid (see ``_box``).
    """
    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        raise ValueError(f"cconv: x must be [B, T, D], got shape {_shape(x)}")
    if not x.is_floating_point():
        raise ValueError(f"cconv: x must be a float tensor, got {x.dtype}")
    B, T, D = x.shape
    if weight is None:
        return
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise ValueError(f"cconv: weight must be [D, W], got shape {_shape(weight)}")
    if weight.shape[0] != D:
        raise ValueError(f"cconv: x {tuple(x.shape)} and weight {tuple(weight.shape)} disagree on D")
    W = weight.shape[1]
    if W == 0:
        raise ValueError(f"cconv: weight {tuple(weight.shape)} has width W=0")
    if not weight.is_floating_point():
        raise ValueError(f"cconv: weight must be a float tensor, got {weight.dtype}")
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or bias.shape != (D,):
            raise ValueError(f"cconv: bias must be [D] = [{D}], got shape {_shape(bias)}")
        if not bias.is_floating_point():
            raise ValueError(f"cconv: bias must be a float tensor, got {bias.dtype}")
    if residual is not None and (not isinstance(residual, torch.Tensor) or residual.shape != x.shape):
        raise ValueError(f"cconv: residual must be [B, T, D] = {list(x.shape)}, got shape {_shape(residual)}")
    if initial_state is not None:
        N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
        if not isinstance(initial_state, torch.Tensor) or initial_state.shape != (N, D, W):
            raise ValueError(f"cconv: initial_state must be [N, D, W] = [{N}, {D}, {W}] "
                             f"(N = {'B' if cu_seqlens is None else 'documents in cu_seqlens'}), "
                             f"got shape {_shape(initial_state)}")
        if not initial_state.is_floating_point():
            raise ValueError(f"cconv: initial_state must be a float tensor, got {initial_state.dtype}")


def _box(x, weight, cu_seqlens, cu_seqlens_cpu):
    """What our kernels cover (after classification: weight is a validated tensor)."""
    if x.dtype not in _FLOATS:
        return False, f"x dtype {x.dtype} (ours: bfloat16, float16, float32)"
    W = weight.shape[1]
    if W > 4:
        return False, f"kernel width W={W} (ours: 1..4)"
    # Empty B, T or D stay ours: y is empty and the gradients are zeros, computed without a
    # launch (conv_fwd / conv_bwd return before launching), whatever fla's launcher would do
    # with a zero-size grid.
    routed, _ = packed_gate(FAMILY, x.shape[0], x.shape[1], cu_seqlens, cu_seqlens_cpu)
    if routed:
        return False, routed
    return True, ""


def _final_state(x, W, cu_seqlens):
    """fla's conv state after a call without ``initial_state``: ``[N, D, W]`` in x's dtype, slot w of
    sequence n holding x at its token ``end - W + w`` (zeros before the sequence's first token), as
    fla's ``causal_conv1d_update_states`` writes it. Torch ops on x: autograd carries the state's
    gradient to x, and CUDA graph capture needs no warm-up for them."""
    T, D = x.shape[1], x.shape[2]
    if cu_seqlens is None:
        last = x[:, max(T - W, 0):]
        if T < W:
            last = torch.nn.functional.pad(last, (0, 0, W - T, 0))
        return last.transpose(1, 2).contiguous()
    cu = cu_seqlens.to(device=x.device, dtype=torch.long)
    if T == 0:
        return x.new_zeros(cu.numel() - 1, D, W)
    idx = cu[1:, None] - W + torch.arange(W, device=x.device)  # [N, W] token of each slot
    rows = x[0, idx.clamp_min(0)]  # [N, W, D]
    rows = torch.where((idx >= cu[:-1, None])[..., None], rows, rows.new_zeros(()))
    return rows.transpose(1, 2).contiguous()


def _signature(x, weight, bias, silu, cu_seqlens, tma):
    # What picks kernels and configs: shapes, strides, dtypes, x's 16-byte alignment (16 B
    # vector loads) and the forward's kernel (`tma`: fwd.use_tma(x)). torch.Size and stride()
    # are tuples already (hashable, no copy).
    return (x.shape, x.stride(), x.dtype, x.data_ptr() % 16 == 0, tma, weight.shape[1], weight.dtype,
            None if bias is None else bias.dtype, silu, cu_seqlens is not None)


def _needs_grad(x, weight, bias) -> bool:
    return torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                        or (bias is not None and bias.requires_grad))


def _ours():
    # An import statement inside the call costs ~1 us each time even when cached: once here.
    global _kernels
    if _kernels is None:
        from ._kernels.fwd import use_tma
        from .autograd import CausalConv1dFunction

        _kernels = (use_tma, CausalConv1dFunction)
    return _kernels


def _decide(call: dict, extra: dict) -> tuple[bool, str]:
    x, weight, bias, cu = call["x"], call["weight"], call["bias"], call["cu_seqlens"]

    def validate():
        _validate(x, weight, bias, call["residual"], call["initial_state"], cu)
        return True, ""

    def describe():
        use_tma = _ours()[0]
        return _signature(x, weight, bias, call["activation"] is not None, cu, use_tma(x)), _needs_grad(x, weight, bias)

    return decide(
        FAMILY,
        validate,
        lambda: C.classify(RULES, call, extra),
        lambda: _box(x, weight, cu, call["cu_seqlens_cpu"]),
        lambda: tensor_gate(x, weight, bias, cu),
        lambda: capture_gate(FAMILY, describe, x.device),
    )


def is_supported(x, weight=None, bias=None, residual=None, initial_state=None,
                 output_final_state=False, activation=None, backend="triton", cu_seqlens=None,
                 cu_seqlens_cpu=None, chunk_indices=None, cp_context=None, **kwargs):
    """(ok, reason): would ``causal_conv1d`` with these arguments run our kernels?
    Raises ValueError for bad input, as ``causal_conv1d`` does."""
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
        activation: None, "silu" or "swish". backend: "triton", "cuda" or "mix" (fla's
            implementations of the same function; ours replaces each).
        cu_seqlens: ``[N+1]`` offsets of packed documents (B == 1); no document sees another's tokens.
        output_final_state: also return fla's conv state after the call, ``[N, D, W]`` in x's
            dtype (the last W inputs of each sequence), as a prefill caches it.
    Returns:
        ``(y, final_state)``: y ``[B, T, D]`` in x's dtype; final_state None unless asked. Anything
        outside our box goes to fla's ``causal_conv1d`` verbatim (see ``is_supported`` and the
        INFO log for why).
    Raises:
        ValueError: bad input (wrong dtype or shape of x, weight, bias, residual,
            initial_state; malformed cu_seqlens), before any launch.
    """
    call = dict(locals())
    kwargs = call.pop("kwargs")
    ok, reason = _decide(call, kwargs)
    report(FAMILY, ok, reason, detail=lambda: f"x {_shape(x)} {getattr(x, 'dtype', type(x).__name__)}")
    if not ok:
        return fla_symbol("fla.modules.causal_conv1d", "causal_conv1d")(**call, **kwargs)
    use_tma, CausalConv1dFunction = _ours()
    silu = activation is not None
    tma = use_tma(x)  # decided once: the forward's kernel and the signature both take it
    sig = _signature(x, weight, bias, silu, cu_seqlens, tma)
    y = CausalConv1dFunction.apply(x, weight, bias, silu, cu_seqlens, sig, tma)
    return y, (_final_state(x, weight.shape[1], cu_seqlens) if output_final_state else None)
