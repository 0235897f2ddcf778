"""What the delta-rule front-ends (kda, gdn) share in their call contract: the rules for the
parameters both of fla's entries take, and the state layout (``state_v_first``, which fla's
layers always pass, and its deprecated alias ``transpose_state_layout``).

The chain keeps states ``[N, HV, K, V]``; a V-first call's states are transposed around it
(they are small next to q, k, v), and autograd carries dh0 back through the transpose.
"""
from __future__ import annotations

import warnings

from .._common import classify as C


def _chunk_size(value, call):
    return None if value == 64 else f"chunk_size={value!r} (ours: 64)"


def _transpose_state_layout(value, call):
    # fla's deprecated alias of state_v_first: fla raises when both are set, so that goes there
    if call["state_v_first"]:
        return "both state_v_first and transpose_state_layout (fla raises)"
    return None


# The parameters of both fla entries (and the keywords both read from **kwargs); each family
# adds its own to these.
RULES = {
    "q": C.ours(), "k": C.ours(), "v": C.ours(), "g": C.ours(), "beta": C.ours(),
    "scale": C.ours(),
    "initial_state": C.ours(),
    "output_final_state": C.ours(),
    "use_qk_l2norm_in_kernel": C.ours(),
    "use_gate_in_kernel": C.ours(),
    "use_beta_sigmoid_in_kernel": C.ours(),
    "allow_neg_eigval": C.ours(),
    "state_v_first": C.ours(),
    "cu_seqlens": C.ours(),
    "cu_seqlens_cpu": C.ours(),
    "cp_context": C.only(None, "cp_context"),
    "A_log": C.ours(),
    "dt_bias": C.ours(),
    "chunk_size": C.check(_chunk_size),
    "transpose_state_layout": C.check(_transpose_state_layout),
}


def state_v_first(call: dict, extra: dict) -> bool:
    return bool(call["state_v_first"] or extra.get("transpose_state_layout", False))


def states_in(call: dict, extra: dict, initial_state):
    """(v_first, the initial state in the chain's ``[N, HV, K, V]``)."""
    if "transpose_state_layout" in extra:
        warnings.warn("`transpose_state_layout` is deprecated and renamed to `state_v_first`.",
                      DeprecationWarning, stacklevel=3)
    v_first = state_v_first(call, extra)
    if v_first and initial_state is not None:
        initial_state = initial_state.transpose(-1, -2).contiguous()
    return v_first, initial_state


def states_out(v_first: bool, final_state):
    """The final state in the call's layout (fla returns V-first ones contiguous)."""
    if v_first and final_state is not None:
        final_state = final_state.transpose(-1, -2).contiguous()
    return final_state
