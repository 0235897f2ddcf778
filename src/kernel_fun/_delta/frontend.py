"""What the delta-rule front-ends (kda, gdn) share in their call contract: the rules for the
parameters both of fla's entries take, and the state layout (``state_v_first``, which fla's
layers always pass, and its deprecated alias ``transpose_state_layout``).

The chain keeps states ``[N, HV, K, V]``; a V-first call's states are transposed around it
(they are small next to q, k, v), and autograd carries dh0 back through the transpose.
"""
from __future__ import annotations

import warnings

import torch

from .._common import classify as C
from .._common.varlen import packed_gate


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


_HALF = (torch.bfloat16, torch.float16)
_PLAIN = (bool, int, float, str)


def static_key(call: dict, extra: dict):
    """The key under which a front-end keeps its static verdict (the classification and ``box``,
    ``gate.Verdicts``): what those read of each argument (a tensor's type, shape and dtype; a
    plain value's type and value; None), or None where an argument is anything else or the call
    is packed (``box`` then reads cu_seqlens' values): such calls run the checks every time."""
    if call.get("cu_seqlens") is not None or call.get("cu_seqlens_cpu") is not None:
        return None
    key = []
    for name, value in (*call.items(), *sorted(extra.items())):
        if value is None:
            key.append((name, None))
        elif isinstance(value, torch.Tensor):
            key.append((name, type(value), value.shape, value.dtype))
        elif type(value) in _PLAIN:
            key.append((name, type(value), value))
        else:
            return None
    return tuple(key)


def box(family: str, call: dict, extra: dict, scalar_gate: bool) -> tuple[bool, str, int]:
    """The box both front-ends draw: bad input raises a ValueError naming the argument (before
    any launch); a call outside the box answers ``(False, reason)``. ``scalar_gate``: g is
    ``[B, T, HV]`` and dt_bias ``[HV]`` (gdn), else ``[B, T, HV, K]`` and ``[HV * K]`` (kda).
    Returns ``(ok, reason, N)`` with N the number of sequences."""
    q, k, v, g, beta = (call[n] for n in ("q", "k", "v", "g", "beta"))
    if any(not isinstance(t, torch.Tensor) for t in (q, k, v, g, beta)):
        raise ValueError(f"{family}: q, k, v, g, beta must be tensors")
    if q.dim() != 4 or v.dim() != 4:
        raise ValueError(f"{family}: q, k must be [B, T, H, K] and v [B, T, HV, V]; "
                         f"got q {tuple(q.shape)}, v {tuple(v.shape)}")
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if tuple(k.shape) != tuple(q.shape) or v.shape[:2] != q.shape[:2]:
        raise ValueError(f"{family}: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} disagree")
    if 0 in (B, T, H, K, HV, V):
        raise ValueError(f"{family}: empty input: q {tuple(q.shape)}, v {tuple(v.shape)} "
                         f"(B, T, H, K, HV, V must be >= 1)")
    if HV % H:
        raise ValueError(f"{family}: HV={HV} value heads must be a multiple of H={H}")
    if scalar_gate and (tuple(g.shape) != (B, T, HV) or tuple(beta.shape) != (B, T, HV)):
        raise ValueError(f"{family}: g and beta must be [B, T, HV]={[B, T, HV]}; got g {tuple(g.shape)}, "
                         f"beta {tuple(beta.shape)}")
    if not scalar_gate and (tuple(g.shape) != (B, T, HV, K) or tuple(beta.shape) != (B, T, HV)):
        raise ValueError(f"{family}: g must be [B, T, HV, K]={[B, T, HV, K]} and beta [B, T, HV]; "
                         f"got g {tuple(g.shape)}, beta {tuple(beta.shape)}")
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        if not t.dtype.is_floating_point:
            raise ValueError(f"{family}: {name} must be a floating-point tensor, got {t.dtype}")
    gate_in = bool(call.get("use_gate_in_kernel", extra.get("use_gate_in_kernel", False)))
    if gate_in:
        lengths = (("A_log", "HV", HV), ("dt_bias", "HV" if scalar_gate else "HV*K", HV if scalar_gate else HV * K))
        for name, dims, n in lengths:
            t = extra.get(name)
            if t is None:
                continue
            if not isinstance(t, torch.Tensor) or not t.dtype.is_floating_point:
                raise ValueError(f"{family}: {name} must be a floating-point tensor, got "
                                 f"{getattr(t, 'dtype', type(t).__name__)}")
            if t.numel() != n:
                raise ValueError(f"{family}: {name} must have {dims}={n} elements, got shape {tuple(t.shape)}")
    h0 = call["initial_state"]
    if h0 is not None and not isinstance(h0, torch.Tensor):
        raise ValueError(f"{family}: initial_state must be a tensor")
    routed, N = packed_gate(family, B, T, call["cu_seqlens"], call["cu_seqlens_cpu"])
    if h0 is not None:
        want = (N, HV, V, K) if state_v_first(call, extra) else (N, HV, K, V)
        if tuple(h0.shape) != want:
            layout = "[N, HV, V, K]" if state_v_first(call, extra) else "[N, HV, K, V]"
            raise ValueError(f"{family}: initial_state must be {layout}={list(want)}, got {tuple(h0.shape)}")
    if call["allow_neg_eigval"] and not call["use_beta_sigmoid_in_kernel"]:
        return False, "allow_neg_eigval without use_beta_sigmoid_in_kernel (fla raises)", N
    if gate_in and extra.get("A_log") is None:
        return False, "use_gate_in_kernel without A_log (fla raises)", N
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype not in _HALF:
            return False, f"{name} dtype {t.dtype} (ours: bfloat16, float16)", N
    if not (q.dtype == k.dtype == v.dtype):
        return False, f"mixed q/k/v dtypes {q.dtype}, {k.dtype}, {v.dtype}", N
    # gdn also takes fla's default GatedDeltaNet heads (head_dim 256, expand_v 2: K = 256, V = 512)
    ks, vs = ((64, 128, 256), (64, 128, 256, 512)) if scalar_gate else ((64, 128), (64, 128, 256))
    if K not in ks:
        return False, f"K={K} (ours: {', '.join(map(str, ks))})", N
    if V not in vs:
        return False, f"V={V} (ours: {', '.join(map(str, vs))})", N
    if routed:
        return False, routed, N
    if h0 is not None and h0.dtype != torch.float32:
        return False, f"initial_state dtype {h0.dtype} (fla asserts float32)", N
    return True, "", N
