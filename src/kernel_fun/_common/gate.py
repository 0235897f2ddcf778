"""The decision every public entry makes first: ours, or fla and exactly why."""
from __future__ import annotations

from .compat import drift_gate
from .switches import disabled_reason


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
    ok, reason = drift_gate()
    if not ok:
        return False, reason
    for gate in checks:
        ok, reason = gate()
        if not ok:
            return False, reason
    return True, ""
