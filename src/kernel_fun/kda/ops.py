"""The public entry of kda: classify the call, run our chain or fla's (and say why), log once.

Drop-in for fla 0.6.0 ``fla.ops.kda.chunk_kda``; returns ``(o, final_state)``.
"""
from __future__ import annotations

import torch

from .._common import classify as C
from .._common import capture
from .._common import gate
from .._common import hardware
from .._common import report
from .._common.compat import fla_symbol
from .._delta import frontend

FAMILY = "kda"


# One rule per parameter of fla's signature and per keyword fla reads from **kwargs.
RULES = {
    **frontend.RULES,  # the parameters kda and gdn share (_delta/frontend.py)
    "safe_gate": C.only(False, "safe_gate (a different gate function)"),
    "lower_bound": C.only(None, "lower_bound (a different gate function)"),
    "disable_recompute": C.only(False, "disable_recompute"),
    "return_intermediate_states": C.only(False, "return_intermediate_states"),
    "use_graph": C.only(False, "use_graph"),
    "max_num_seqs": C.only(None, "max_num_seqs"),
}


def _box(call: dict, extra: dict):
    ok, reason, _ = frontend.box(FAMILY, call, extra, scalar_gate=False)
    if not ok:
        return ok, reason
    return True, ""


def _signature(call: dict, extra: dict):
    q, v = call["q"], call["v"]
    cu = call["cu_seqlens"]
    flags = tuple(bool(call[n]) for n in ("output_final_state", "use_qk_l2norm_in_kernel",
                                          "use_gate_in_kernel", "use_beta_sigmoid_in_kernel",
                                          "allow_neg_eigval"))
    return (tuple(q.shape), tuple(v.shape), q.dtype, call["g"].dtype, call["beta"].dtype,
            None if cu is None else cu.numel(), call["initial_state"] is not None, flags,
            frontend.state_v_first(call, extra))


_VERDICTS = gate.Verdicts()


def _decide(call: dict, extra: dict):
    def describe():
        tensors = [call[n] for n in ("q", "k", "v", "g", "beta", "initial_state")]
        tensors += [extra.get("A_log"), extra.get("dt_bias")]
        needs_grad = torch.is_grad_enabled() and any(
            isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)
        return _signature(call, extra), needs_grad

    def tensors():
        return hardware.tensor_gate(call["q"], call["k"], call["v"], call["g"], call["beta"],
                                   call["initial_state"], call["cu_seqlens"],
                                   extra.get("A_log"), extra.get("dt_bias"), family=FAMILY)

    return gate.decide_keyed(
        FAMILY, _VERDICTS, frontend.static_key(call, extra),
        (lambda: C.classify(RULES, call, extra), lambda: _box(call, extra)),
        (tensors, lambda: capture.capture_gate(FAMILY, describe, call["q"].device)),
    )


def is_supported(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                 use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                 use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, safe_gate=False,
                 lower_bound=None, disable_recompute=False, return_intermediate_states=False,
                 state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None, cp_context=None,
                 use_graph=False, max_num_seqs=None, **kwargs):
    """(ok, reason): would ``chunk_kda`` with these arguments run our chain?"""
    call = dict(locals())
    extra = call.pop("kwargs")
    return _decide(call, extra)


@torch.compiler.disable  # as fla's chunk_kda: the chain launches many autotuned kernels
def chunk_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    safe_gate: bool = False,
    lower_bound: float | None = None,
    disable_recompute: bool = False,
    return_intermediate_states: bool = False,
    state_v_first: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    cu_seqlens_cpu: torch.LongTensor | None = None,
    cp_context=None,
    use_graph: bool = False,
    max_num_seqs: int | None = None,
    **kwargs,
):
    """Kimi Delta Attention, chunked (64), forward and backward.

    Args: q, k ``[B, T, H, K]``; v ``[B, T, HV, V]`` (HV a multiple of H); g ``[B, T, HV, K]``
    (log-space decay, or the raw gate input with ``use_gate_in_kernel`` and ``A_log [HV]``,
    ``dt_bias [HV*K]`` passed as keywords); beta ``[B, T, HV]``; initial_state fp32
    ``[N, HV, K, V]`` (``[N, HV, V, K]`` with ``state_v_first``, as fla's layers pass);
    cu_seqlens ``[N+1]`` for packed documents (B == 1).
    Returns ``(o [B, T, HV, V], final_state in initial_state's layout or None)``. Calls outside our box go
    to fla's ``chunk_kda`` verbatim (see ``is_supported`` and the INFO log for why).
    """
    call = dict(locals())
    kwargs = call.pop("kwargs")
    ok, reason = _decide(call, kwargs)
    report.report(FAMILY, ok, reason,
                  detail=lambda: f"q {tuple(q.shape)} v {tuple(v.shape)}" if hasattr(q, "shape") else "")
    if not ok:
        return fla_symbol("fla.ops.kda", "chunk_kda")(**call, **kwargs)
    from .autograd import ChunkKDAFunction

    v_first, initial_state = frontend.states_in(call, kwargs, initial_state)
    K = q.shape[-1]
    o, final_state = ChunkKDAFunction.apply(
        q, k, v, g, beta, kwargs.get("A_log") if use_gate_in_kernel else None,
        kwargs.get("dt_bias") if use_gate_in_kernel else None, initial_state,
        K ** -0.5 if scale is None else scale, output_final_state, use_qk_l2norm_in_kernel,
        use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval, cu_seqlens,
        cu_seqlens_cpu, _signature(call, kwargs))
    return o, frontend.states_out(v_first, final_state)
