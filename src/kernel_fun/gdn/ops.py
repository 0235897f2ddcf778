"""The public entry of gdn: classify the call, run our chain or fla's (and say why), log once.

Drop-in for fla 0.6.0 ``fla.ops.gated_delta_rule.chunk_gated_delta_rule``; returns
``(o, final_state)``.
"""
from __future__ import annotations

import torch

from .._common import classify as C
from .._common import capture
from .._common import device as D
from .._common import gate
from .._common import hardware
from .._common import report
from .._common.compat import fla_backend_taking, fla_symbol
from .._delta import frontend

FAMILY = "gdn"


# One rule per parameter of fla's signature and per keyword fla reads from **kwargs.
RULES = {
    **frontend.RULES,  # the parameters kda and gdn share (_delta/frontend.py)
    "chunk_indices": C.ours(),  # fla's prepare_chunk_indices(cu_seqlens, 64), passed through
    "head_first": C.check(lambda value, call: "head_first (removed in fla; fla raises)"),
}


def _box(call: dict, extra: dict):
    """The box as the arguments alone decide it (kept per ``frontend.static_key``)."""
    ok, reason, _ = frontend.box(FAMILY, call, extra, scalar_gate=True)
    if not ok:
        return ok, reason
    if call["cu_seqlens"] is None and call["chunk_indices"] is not None:
        return False, "chunk_indices without cu_seqlens"
    return True, ""


def _backend(call: dict, extra: dict):
    """A backend fla dispatches to (FlashQLA, where installed) keeps the calls it takes: a user
    who installed it expects its speed, and ours is not measured faster than it (docs/gdn.md).
    Asked every call: its switch is an environment variable."""
    taker = fla_backend_taking("gated_delta_rule", "chunk_gated_delta_rule", {**call, **extra})
    if taker is not None:
        name, env = taker
        return False, (f"fla hands this call to its {name} backend (installed and enabled"
                       + (f"; {env}=0 gives the call to kernel-fun" if env else "") + ")")
    return True, ""


def _signature(call: dict, extra: dict, fused: bool):
    """What makes a call warm for the capture gate: shapes, dtypes, flags, and whether the backward
    writes the fused q/k/v gradient (``_fused_qkv``), as the forward records it."""
    q, v = call["q"], call["v"]
    cu = call["cu_seqlens"]
    flags = tuple(bool(call[n]) for n in ("output_final_state", "use_qk_l2norm_in_kernel",
                                          "use_beta_sigmoid_in_kernel", "allow_neg_eigval"))
    return (tuple(q.shape), tuple(v.shape), q.dtype, call["g"].dtype, call["beta"].dtype,
            None if cu is None else cu.numel(), call["initial_state"] is not None, flags,
            bool(extra.get("use_gate_in_kernel", False)), extra.get("dt_bias") is not None,
            frontend.state_v_first(call, extra), fused)


def _fused_qkv(q, k, v, use_qk_l2norm: bool):
    """The tensor q, k and v are column slices of, ``[B, T, H*K | H*K | HV*V]`` in that order (fla's
    ``GatedDeltaNet`` splits its fused q/k/v conv output so), when the backward can write its
    gradient whole: the backward then writes dq, dk and dv into one tensor of the base's shape, and
    autograd's split backward (a copy of all three into a new tensor) never runs. None otherwise
    (the gradients of q, k, v as three tensors, as before)."""
    base = q._base
    if (base is None or k._base is not base or v._base is not base or not use_qk_l2norm
            or not torch.is_grad_enabled() or not base.requires_grad or base.dim() != 3
            or base.dtype != q.dtype or not base.is_contiguous()):
        return None
    if any(x.grad_fn is None for x in (q, k, v)):  # a view made under no_grad: no gradient reaches the base
        return None
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    C, o = base.shape[2], base.storage_offset()
    if tuple(base.shape[:2]) != (B, T) or C != 2 * H * K + HV * V:
        return None
    for x, col, d in ((q, 0, K), (k, H * K, K), (v, 2 * H * K, V)):
        if x.storage_offset() - o != col or x.stride() != (T * C, C, d, 1):
            return None
    return base


def _tensors(call: dict, extra: dict) -> list:
    out = [call[n] for n in ("q", "k", "v", "g", "beta", "initial_state")]
    return out + [extra.get("A_log"), extra.get("dt_bias")]


def _needs_grad(call: dict, extra: dict) -> bool:
    return torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in _tensors(call, extra))


def fla_refuses_backward(q) -> str | None:
    """Why fla 0.6.0's own GDN backward raises on this device, or None: its ``chunk_bwd_dqkwg``
    refuses Hopper with Triton >= 3.4 and < 3.7.1 (a miscompile, fla #640) unless tilelang or
    flash-qla is installed (neither is checked here: the note says so)."""
    if not isinstance(q, torch.Tensor) or q.device.type != "cuda":
        return None
    if tuple(hardware.device_capability(D.index(q.device))) != (9, 0):
        return None
    ver = hardware.triton_version()
    if (3, 4, 0) <= ver < (3, 7, 1):
        return (f"fla 0.6.0 itself refuses this call's backward here (Hopper, Triton "
                f"{'.'.join(map(str, ver))} < 3.7.1, fla #640) unless tilelang or flash-qla is installed")
    return None


_VERDICTS = gate.Verdicts()


def _decide(call: dict, extra: dict):
    def describe():
        fused = _fused_qkv(call["q"], call["k"], call["v"], call["use_qk_l2norm_in_kernel"]) is not None
        return _signature(call, extra, fused), _needs_grad(call, extra)

    def tensors():
        return hardware.tensor_gate(*_tensors(call, extra), call["cu_seqlens"], family=FAMILY)

    ok, reason = gate.decide_keyed(
        FAMILY, _VERDICTS, frontend.static_key(call, extra),
        (lambda: C.classify(RULES, call, extra), lambda: _box(call, extra)),
        (lambda: _backend(call, extra), tensors, lambda: capture.capture_gate(FAMILY, describe, call["q"].device)),
    )
    if not ok and _needs_grad(call, extra):
        note = fla_refuses_backward(call["q"])
        if note:
            reason = f"{reason}; note: {note}"
    return ok, reason


def is_supported(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                 use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                 state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None, chunk_indices=None,
                 cp_context=None, **kwargs):
    """(ok, reason): would ``chunk_gated_delta_rule`` with these arguments run our chain?"""
    call = dict(locals())
    extra = call.pop("kwargs")
    return _decide(call, extra)


@torch.compiler.disable  # as fla's: the chain launches many autotuned kernels
def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    state_v_first: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    cu_seqlens_cpu: torch.LongTensor | None = None,
    chunk_indices: torch.LongTensor | None = None,
    cp_context=None,
    **kwargs,
):
    """Gated DeltaNet, chunked (64), forward and backward.

    Args: q, k ``[B, T, H, K]``; v ``[B, T, HV, V]`` (HV a multiple of H); g ``[B, T, HV]``
    (the log-space decay, or with ``use_gate_in_kernel=True`` the raw gate input, with
    ``A_log [HV]`` and ``dt_bias [HV]`` passed as keywords: g = -exp(A_log) * softplus(g +
    dt_bias)); beta ``[B, T, HV]`` (raw logits with ``use_beta_sigmoid_in_kernel``);
    initial_state fp32 ``[N, HV, K, V]`` (``[N, HV, V, K]`` with ``state_v_first``, as fla's
    layer passes); cu_seqlens ``[N+1]`` for packed documents (B == 1).
    Returns ``(o [B, T, HV, V], final_state in initial_state's layout or None)``. Calls outside
    our box go to fla's ``chunk_gated_delta_rule`` verbatim (see ``is_supported`` and the INFO
    log for why).
    """
    call = dict(locals())
    kwargs = call.pop("kwargs")
    ok, reason = _decide(call, kwargs)
    report.report(FAMILY, ok, reason,
                  detail=lambda: f"q {tuple(q.shape)} v {tuple(v.shape)}" if hasattr(q, "shape") else "")
    if not ok:
        return fla_symbol("fla.ops.gated_delta_rule", "chunk_gated_delta_rule")(**call, **kwargs)
    from .autograd import ChunkGatedDeltaRuleFunction

    v_first, initial_state = frontend.states_in(call, kwargs, initial_state)
    gate_in = bool(kwargs.get("use_gate_in_kernel", False))
    K = q.shape[-1]
    qkv = _fused_qkv(q, k, v, use_qk_l2norm_in_kernel)
    if qkv is not None:  # autograd's edge goes to the fused tensor; q, k, v are read through it
        q, k, v = q.detach(), k.detach(), v.detach()
    o, final_state = ChunkGatedDeltaRuleFunction.apply(
        q, k, v, g, beta, kwargs.get("A_log") if gate_in else None, kwargs.get("dt_bias") if gate_in else None,
        initial_state, K ** -0.5 if scale is None else scale, output_final_state, use_qk_l2norm_in_kernel,
        gate_in, use_beta_sigmoid_in_kernel, allow_neg_eigval, cu_seqlens, cu_seqlens_cpu,
        chunk_indices if cu_seqlens is not None else None, _signature(call, kwargs, qkv is not None), qkv)
    return o, frontend.states_out(v_first, final_state)
