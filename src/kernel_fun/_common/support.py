"""The gates of the call contract: can this call use our kernels, and if not, exactly why.

Sections: environment switches; hardware probes; the tensor and capture gates; logging.

Environment switches, read on every call (never at import):

| variable | effect |
|---|---|
| ``KERNEL_FUN_DISABLE=1`` | every family routes to fla |
| ``KERNEL_FUN_<FAMILY>_DISABLE=1`` | that family routes to fla |
| ``KERNEL_FUN_DEBUG=1`` | log every call's decision at DEBUG (a stderr handler is attached) |
| ``KERNEL_FUN_FALLBACK=1`` | fla drift becomes a warning plus fallback to fla, not an error |
| ``KERNEL_FUN_<FAMILY>_MIN_CTAS=<n>`` | a family's grid-size gate, where it has one |
| ``KERNEL_FUN_CCONV_TMA=0`` | cconv's forward never takes its TMA kernel (the pointer one runs) |

A malformed value is warned about once and the default is used: a launcher typo costs
throughput, never the run. A variable naming no known family is ignored (``doctor`` lists it).
"""
from __future__ import annotations

import os
import warnings

FAMILIES = ("cconv", "kda", "gdn", "gnorm")

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")
_warned: set = set()


def _warn_once(name: str, value: str, default) -> None:
    key = (name, value)
    if key not in _warned:
        _warned.add(key)
        warnings.warn(
            f"kernel-fun: ignoring malformed {name}={value!r}; using the default ({default!r})",
            RuntimeWarning,
            stacklevel=3,
        )


def env_flag(name: str, default: bool = False) -> bool:
    """A boolean switch: 1/true/yes/on or 0/false/no/off (any case); anything else warns once."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    _warn_once(name, raw, default)
    return default


def env_int(name: str, default: int, minimum: int = 0) -> int:
    """A non-negative integer switch; anything else (or below ``minimum``) warns once."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        _warn_once(name, raw, default)
        return default
    if value < minimum:
        _warn_once(name, raw, default)
        return default
    return value


def disabled_reason(family: str) -> str | None:
    """Why the switches route ``family`` to fla, or None."""
    if env_flag("KERNEL_FUN_DISABLE"):
        return "disabled by KERNEL_FUN_DISABLE=1"
    name = f"KERNEL_FUN_{family.upper()}_DISABLE"
    if env_flag(name):
        return f"disabled by {name}=1"
    return None


def debug() -> bool:
    return env_flag("KERNEL_FUN_DEBUG")


def fallback_on_drift() -> bool:
    return env_flag("KERNEL_FUN_FALLBACK")


def min_ctas(family: str, default: int) -> int:
    """The family's grid-size gate: calls whose grid has fewer CTAs route to fla."""
    return env_int(f"KERNEL_FUN_{family.upper()}_MIN_CTAS", default)


def cconv_tma() -> bool:
    """cconv's TMA forward allowed (``KERNEL_FUN_CCONV_TMA``, default on)."""
    return env_flag("KERNEL_FUN_CCONV_TMA", True)


def unknown_variables() -> list[str]:
    """``KERNEL_FUN_*`` variables set in the environment that no switch reads."""
    known = {"KERNEL_FUN_DISABLE", "KERNEL_FUN_DEBUG", "KERNEL_FUN_FALLBACK", "KERNEL_FUN_CCONV_TMA"}
    for fam in FAMILIES:
        known |= {f"KERNEL_FUN_{fam.upper()}_DISABLE", f"KERNEL_FUN_{fam.upper()}_MIN_CTAS"}
    return sorted(k for k in os.environ if k.startswith("KERNEL_FUN_") and k not in known)


# --------------------------------------------------------------------------- hardware probes
# Triton families are built and tested for Hopper (sm90) and datacenter Blackwell
# (sm100, sm103); anything else routes to fla with its capability in the reason.
ADMITTED_CAPABILITIES = ((9, 0), (10, 0), (10, 3))
_capability_cache: dict = {}


def _read_capability(index: int) -> tuple[int, int]:
    import torch

    return tuple(torch.cuda.get_device_capability(index))


def device_capability(index: int) -> tuple[int, int]:
    """The compute capability of CUDA device ``index``, probed once and cached."""
    if index not in _capability_cache:
        _capability_cache[index] = _read_capability(index)
    return _capability_cache[index]


def reset_probes() -> None:
    """Forget the cached probes (tests monkeypatch ``_read_capability`` and call this)."""
    _capability_cache.clear()


def device_gate(index: int) -> tuple[bool, str]:
    cap = device_capability(index)
    if tuple(cap) in ADMITTED_CAPABILITIES:
        return True, ""
    return False, (
        f"compute capability sm{cap[0]}{cap[1]} is not Hopper (sm90) or datacenter "
        f"Blackwell (sm100/sm103)"
    )


def tensor_gate(*tensors) -> tuple[bool, str]:
    """Where the tensors live: one admitted CUDA device, or CPU under the interpreter."""
    from .tuning import interpreting

    devices = {t.device for t in tensors if t is not None}
    if len(devices) > 1:
        return False, "tensors on different devices: " + ", ".join(sorted(map(str, devices)))
    (dev,) = devices
    if dev.type == "cuda":
        index = dev.index if dev.index is not None else _current_device()
        return device_gate(index)
    if dev.type == "cpu" and interpreting():
        return True, ""
    return False, "not a CUDA tensor"


def _current_device() -> int:
    import torch

    return torch.cuda.current_device()


# --------------------------------------------------------------------------- capture gate
# Compile and autotune cannot run inside CUDA graph capture, so under capture our kernels
# run only for a call signature that already ran eagerly: the forward, and the backward
# when gradients are needed. The stream is not part of the signature.
_warm: dict = {}


def _capturing() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def is_capturing() -> bool:
    return _capturing()


def mark_warm(family: str, signature, phase: str) -> None:
    """Record that ``signature`` ran ``phase`` ("fwd" or "bwd") eagerly."""
    _warm.setdefault((family, signature), set()).add(phase)


def capture_gate(family: str, describe) -> tuple[bool, str]:
    """``describe()`` -> (signature, needs_grad); called only under capture, so an eager
    call pays for nothing but the capture query."""
    if not is_capturing():
        return True, ""
    signature, needs_grad = describe()
    seen = _warm.get((family, signature), set())
    need = {"fwd", "bwd"} if needs_grad else {"fwd"}
    if need <= seen:
        return True, ""
    missing = "/".join(sorted(need - seen))
    return False, (
        f"CUDA graph capture of a call that has not run eagerly ({missing} cold): "
        f"compile and autotune cannot be captured; run it once eagerly or call warmup()"
    )


def reset_warm() -> None:
    _warm.clear()


# --------------------------------------------------------------------------- logging
import logging  # noqa: E402

logger = logging.getLogger("kernel_fun")
_logged: set = set()
_debug_handler = None


def log_once(key, message: str, level: int = logging.INFO) -> bool:
    """Log ``message`` once per process per ``key``; True when it was logged now."""
    if key in _logged:
        return False
    _logged.add(key)
    logger.log(level, message)
    return True


def _ensure_debug_handler() -> None:
    # KERNEL_FUN_DEBUG=1 must show the per-call lines even where nobody configured logging.
    global _debug_handler
    if _debug_handler is None and not logger.handlers:
        _debug_handler = logging.StreamHandler()
        _debug_handler.setFormatter(logging.Formatter("%(name)s %(levelname)s: %(message)s"))
        logger.addHandler(_debug_handler)
    if logger.level == logging.NOTSET or logger.level > logging.DEBUG:
        logger.setLevel(logging.DEBUG)


def report(family: str, ok: bool, reason: str, detail: str = "") -> None:
    """Say what a call did: once per process per (family, reason) at INFO; per call at
    DEBUG under ``KERNEL_FUN_DEBUG=1``."""
    if ok:
        message = f"kernel-fun {family}: engaged"
        if ("versions",) not in _logged:  # once, the first time any family engages
            from .. import versions

            log_once(("versions",), f"kernel-fun versions: {versions()}")
        log_once((family, "engaged"), message)
    else:
        message = f"kernel-fun {family}: falling back to fla: {reason}"
        log_once((family, reason), message)
    if debug():
        _ensure_debug_handler()
        logger.debug("%s%s", message, f" [{detail}]" if detail else "")


def reset_logged() -> None:
    _logged.clear()


# --------------------------------------------------------------------------- the decision
def decide(family: str, *checks) -> tuple[bool, str]:
    """Run a family's gates in order and return the first refusal, or (True, "").

    Order: the switches, the fla drift check (raises ``FlaDriftError`` unless
    ``KERNEL_FUN_FALLBACK=1``; ``FlaMissingError`` when fla is absent), then ``checks``:
    zero-argument callables answering (ok, reason), e.g. argument classification, the box,
    the tensor gate, the capture gate.
    """
    reason = disabled_reason(family)
    if reason:
        return False, reason
    from .compat import drift_gate

    ok, reason = drift_gate()
    if not ok:
        return False, reason
    for gate in checks:
        ok, reason = gate()
        if not ok:
            return False, reason
    return True, ""


def machine_gate() -> tuple[bool, str]:
    """Would a call on this machine's default device be admitted (doctor's question)?"""
    from .tuning import interpreting

    import torch

    if torch.cuda.is_available():
        return device_gate(torch.cuda.current_device())
    if interpreting():
        return True, "TRITON_INTERPRET=1: CPU tensors run through Triton's interpreter"
    return False, "no CUDA device"
