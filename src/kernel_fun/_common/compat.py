"""The fla internals kernel-fun calls, as data, and the drift check over them.

Every fla symbol a family calls is listed in ``FLA_CALLS`` with the keywords we pass it (and,
for a raw Triton kernel we launch ourselves, its ordered argument names). ``check_fla()``
imports each one and compares: a moved symbol or a renamed keyword is found at ``warmup()``
(or at a family's first call), not at step 40,000. Families fetch fla objects only through
``fla_symbol()``, which refuses a symbol that is not listed here.
"""
from __future__ import annotations

import importlib
import inspect
import sys
import warnings
from dataclasses import dataclass

from .switches import fallback_on_drift

TESTED_FLA_VERSIONS = ("0.6.0",)
INSTALL_HINT = "pip install 'fla-core>=0.6.0,<0.7'"


@dataclass(frozen=True)
class FlaCall:
    """One fla symbol we call: where it lives and the keywords we pass."""

    module: str
    symbol: str
    keywords: tuple = ()


FLA_CALLS: tuple = (
    # cconv: the public op we route to.
    FlaCall("fla.modules.causal_conv1d", "causal_conv1d", (
        "x", "weight", "bias", "residual", "initial_state", "output_final_state", "activation",
        "backend", "cu_seqlens", "cu_seqlens_cpu", "chunk_indices", "cp_context")),
    # kda: the public op we route to, and the stage functions of its chain that we call.
    FlaCall("fla.ops.kda", "chunk_kda", (
        "q", "k", "v", "g", "beta", "scale", "initial_state", "output_final_state",
        "use_qk_l2norm_in_kernel", "use_gate_in_kernel", "use_beta_sigmoid_in_kernel",
        "allow_neg_eigval", "safe_gate", "lower_bound", "disable_recompute",
        "return_intermediate_states", "state_v_first", "cu_seqlens", "cu_seqlens_cpu",
        "cp_context", "use_graph", "max_num_seqs")),
    FlaCall("fla.ops.utils.index", "prepare_chunk_indices", ("cu_seqlens", "chunk_size", "cu_seqlens_cpu")),
    FlaCall("fla.ops.utils.index", "prepare_chunk_offsets", ("cu_seqlens", "chunk_size")),
    FlaCall("fla.ops.kda.gate", "kda_gate_chunk_cumsum", (
        "g", "A_log", "dt_bias", "scale", "chunk_size", "cu_seqlens", "chunk_indices")),
    FlaCall("fla.ops.utils.cumsum", "chunk_local_cumsum", (
        "g", "chunk_size", "scale", "cu_seqlens", "chunk_indices")),
    FlaCall("fla.ops.kda.chunk_intra", "chunk_kda_fwd_intra", (
        "q", "k", "v", "gk", "beta", "scale", "cu_seqlens", "chunk_size", "chunk_indices",
        "disable_recompute")),
    FlaCall("fla.ops.kda.wy_fast", "recompute_w_u_fwd", (
        "q", "k", "v", "beta", "A", "gk", "cu_seqlens", "chunk_indices")),
    FlaCall("fla.ops.common.chunk_delta_h", "chunk_gated_delta_rule_fwd_h", (
        "k", "w", "u", "gk", "initial_state", "output_final_state", "cu_seqlens", "chunk_indices",
        "chunk_offsets", "chunk_size")),
    FlaCall("fla.modules.norm.l2norm", "l2norm_fwd", ("x",)),
    FlaCall("fla.modules.norm.l2norm", "l2norm_bwd", ("y", "rstd", "dy")),
    FlaCall("fla.ops.common.gate", "fused_beta_sigmoid_fwd", ("x", "scale")),
    FlaCall("fla.ops.common.gate", "fused_beta_sigmoid_bwd", ("x", "dy", "scale")),
    # gdn: the public op we route to, and the stage functions of its chain that we call (the
    # l2norm, beta sigmoid, chunk_local_cumsum and chunk-index entries above are shared).
    FlaCall("fla.ops.gated_delta_rule", "chunk_gated_delta_rule", (
        "q", "k", "v", "g", "beta", "scale", "initial_state", "output_final_state",
        "use_qk_l2norm_in_kernel", "use_beta_sigmoid_in_kernel", "allow_neg_eigval", "state_v_first",
        "cu_seqlens", "cu_seqlens_cpu", "chunk_indices", "cp_context")),
    FlaCall("fla.ops.gated_delta_rule.gate", "gdn_gate_chunk_cumsum", (
        "g", "A_log", "chunk_size", "scale", "dt_bias", "cu_seqlens", "chunk_indices")),
    FlaCall("fla.ops.gated_delta_rule.gate", "gdn_gate_bwd", ("g", "A_log", "dt_bias", "dyg")),
    # fla's backend dispatch (the registry fla's public ops consult before their Triton default):
    # gdn asks it whether fla would hand a call to an installed backend (FlashQLA).
    FlaCall("fla.backends", "_load_operation_registry", ("operation",)),
    # gnorm: the public op we route to.
    FlaCall("fla.modules.norm.fused_norm_gate", "rms_norm_gated", (
        "x", "g", "weight", "bias", "activation", "residual", "prenorm", "residual_in_fp32", "eps")),
)


class FlaDriftError(RuntimeError):
    """An fla symbol or keyword that kernel-fun calls has moved."""


class FlaMissingError(ImportError):
    """fla is not installed: there is nothing to fall back to."""


@dataclass
class FlaStatus:
    version: str | None
    tested: bool
    problems: list


_status: FlaStatus | None = None
_warned: set = set()


def _fla_version() -> str | None:
    from .. import _dist_version

    return _dist_version("fla-core") or _dist_version("flash-linear-attention")


def _check_call(call: FlaCall) -> list:
    where = f"{call.module}.{call.symbol}"
    try:
        mod = importlib.import_module(call.module)
    except Exception as exc:  # ImportError, or an import-time crash inside fla
        return [f"{call.module}: cannot import ({type(exc).__name__}: {exc})"]
    if not hasattr(mod, call.symbol):
        return [f"{where}: symbol missing"]
    obj = getattr(mod, call.symbol)
    problems = []
    if call.keywords:
        try:
            params = inspect.signature(obj).parameters
        except (TypeError, ValueError):
            return [f"{where}: no inspectable signature"]
        for kw in call.keywords:
            if kw not in params:
                problems.append(f"{where}: keyword '{kw}' missing")
    return problems


def check_fla(refresh: bool = False) -> FlaStatus:
    """Import every listed fla symbol and check its keywords; cached per process.

    Raises ``FlaMissingError`` when fla is not installed, ``FlaDriftError`` naming what moved
    (a warning instead under ``KERNEL_FUN_FALLBACK=1``, and the families then route to fla).
    Warns once when fla's version is outside the tested set.
    """
    global _status
    if _status is None or refresh:
        version = _fla_version()
        if version is None:
            raise FlaMissingError(f"kernel-fun needs fla (flash-linear-attention): {INSTALL_HINT}")
        problems = []
        for call in FLA_CALLS:
            problems.extend(_check_call(call))
        _status = FlaStatus(version, version in TESTED_FLA_VERSIONS, problems)
    st = _status
    if not st.tested and ("version", st.version) not in _warned:
        _warned.add(("version", st.version))
        warnings.warn(
            f"kernel-fun was tested with fla {', '.join(TESTED_FLA_VERSIONS)}; found fla {st.version}",
            RuntimeWarning,
            stacklevel=2,
        )
    if st.problems:
        msg = "fla drift: " + "; ".join(st.problems)
        if not fallback_on_drift():
            raise FlaDriftError(msg + " (set KERNEL_FUN_FALLBACK=1 to route to fla instead)")
        if ("drift", msg) not in _warned:
            _warned.add(("drift", msg))
            warnings.warn(msg + "; KERNEL_FUN_FALLBACK=1: routing to fla", RuntimeWarning, stacklevel=2)
    return st


def drift_gate() -> tuple[bool, str]:
    """(ok, reason) for the families: fla present and undrifted (raises unless FALLBACK)."""
    st = check_fla()
    if st.problems:
        return False, "fla drift (KERNEL_FUN_FALLBACK=1): " + "; ".join(st.problems)
    return True, ""


def reset() -> None:
    global _status
    _status = None
    _warned.clear()


_listed: frozenset = frozenset()


def fla_symbol(module: str, symbol: str):
    """The fla object ``module.symbol``; it must be listed in ``FLA_CALLS``."""
    global _listed
    if (module, symbol) not in _listed:  # on every call of a fallback or fla stage: a set lookup
        _listed = frozenset((c.module, c.symbol) for c in FLA_CALLS)
        if (module, symbol) not in _listed:
            raise KeyError(f"{module}.{symbol} is not listed in kernel_fun._common.compat.FLA_CALLS")
    mod = sys.modules.get(module)
    if mod is not None:
        obj = getattr(mod, symbol)
        return _patch.original(module, symbol, obj) if _patch.is_patched() else obj
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        if _fla_version() is None:
            raise FlaMissingError(f"kernel-fun needs fla (flash-linear-attention): {INSTALL_HINT}") from exc
        raise
    obj = getattr(mod, symbol)
    # patch_fla() may have rebound this name to our drop-in: the fallback must reach fla's own
    return _patch.original(module, symbol, obj) if _patch.is_patched() else obj


def fla_backend_taking(operation: str, function: str, arguments: dict) -> tuple[str, str] | None:
    """``(backend_type, env_var)`` of the backend fla's own dispatch would hand this call to (e.g.
    FlashQLA for ``gated_delta_rule``, when installed), or None when fla would run its Triton
    default. The same walk as the wrapper ``fla.backends.dispatch`` puts around the public op:
    backends by priority, available, enabled (their environment switch), their verifier accepting
    the arguments, an implementation registered. A registry whose shape changed answers
    ``("unknown: ...", "")``: the caller routes to fla, which then dispatches as it will."""
    backends = importlib.import_module("fla.backends")
    if getattr(backends, "_DISPATCH_DISABLED", False):
        return None
    try:
        registry = fla_symbol("fla.backends", "_load_operation_registry")(operation=operation)
        for backend in registry._get_sorted_backends():
            if not (backend.is_available() and backend.is_enabled()):
                continue
            accepted, _ = backend.verify(function, **arguments)
            if accepted and backend.get_implementation(function) is not None:
                return backend.backend_type, backend.env_var or ""
    except (AttributeError, TypeError) as exc:
        return f"unknown: fla's backend registry changed ({type(exc).__name__}: {exc})", ""
    return None


from .. import patch as _patch  # noqa: E402  (patch imports compat only inside functions)
