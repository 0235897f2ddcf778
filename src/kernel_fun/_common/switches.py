"""Environment switches, read on every call (never at import).

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

Per-call cost: ``getenv`` reads os.environ's own dict with a pre-encoded key (~0.1 us against
~1 us for ``os.environ.get``; a public call reads three to five switches).
"""
from __future__ import annotations

import os
import warnings

FAMILIES = ("cconv", "kda", "gdn", "gnorm")

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")
_warned: set = set()


_ENCODED: dict = {}


def getenv(name: str) -> str | None:
    """``os.environ.get(name)``, read now, at a fraction of its cost: os.environ's own bytes
    dict with the key encoded once per name (``os.environ[...] = v`` and ``del`` keep that dict
    current, exactly what ``os.environ.get`` reads)."""
    env = os.environ
    data = getattr(env, "_data", None)
    if data is None:  # not CPython's _Environ
        return env.get(name)
    key = _ENCODED.get(name)
    if key is None:
        key = _ENCODED[name] = env.encodekey(name)
    raw = data.get(key)
    return None if raw is None else env.decodevalue(raw)


def _warn_once(name: str, value: str, default) -> None:
    key = (name, value)
    if key not in _warned:
        _warned.add(key)
        warnings.warn(
            f"kernel-fun: ignoring malformed {name}={value!r}; using the default ({default!r})",
            RuntimeWarning,
            stacklevel=3,
        )


def parse_flag(name: str, raw: str | None, default: bool = False) -> bool:
    """A boolean switch's value: 1/true/yes/on or 0/false/no/off (any case); anything else
    warns once and gives ``default``; None (unset) gives ``default``."""
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    _warn_once(name, raw, default)
    return default


def env_flag(name: str, default: bool = False) -> bool:
    """A boolean switch read now (see ``parse_flag``)."""
    return parse_flag(name, getenv(name), default)


def env_int(name: str, default: int, minimum: int = 0) -> int:
    """A non-negative integer switch; anything else (or below ``minimum``) warns once."""
    raw = getenv(name)
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


def _disable_name(family: str) -> str:
    return f"KERNEL_FUN_{family.upper()}_DISABLE"


_DISABLE_NAMES = {fam: _disable_name(fam) for fam in FAMILIES}


def disabled_reason(family: str) -> str | None:
    """Why the switches route ``family`` to fla, or None."""
    if parse_flag("KERNEL_FUN_DISABLE", getenv("KERNEL_FUN_DISABLE")):
        return "disabled by KERNEL_FUN_DISABLE=1"
    name = _DISABLE_NAMES.get(family) or _disable_name(family)
    if parse_flag(name, getenv(name)):
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
