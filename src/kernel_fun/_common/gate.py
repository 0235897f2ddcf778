"""The decision every public entry makes first: ours, or fla and exactly why."""
from __future__ import annotations

from .compat import drift_gate
from .switches import disabled_reason


class Verdicts:
    """A family's static verdicts by call key: the answer of its checks that depend on the
    arguments alone (the classification of every argument, the support box), so a call whose
    key was seen pays for one dict lookup instead of them (a gnorm forward on the CPU with the
    launch a no-op, 2026-12-01, noisy VM: 0-4 us less in the best of 9 rounds, 15-20 us in the
    median). The key holds everything those checks read (types, shapes, dtypes,
    flag values); a call without one (unusual arguments) runs them every time. What can change
    under a fixed key is never cached: the switches, fla's drift, the device's gate, capture.
    Bounded: cleared when full, so shapes that never repeat cost the checks, never memory."""

    LIMIT = 4096
    _all: list = []

    def __init__(self):
        self._d: dict = {}
        Verdicts._all.append(self)

    def get(self, key):
        return self._d.get(key)

    def put(self, key, verdict) -> None:
        if len(self._d) >= self.LIMIT:
            self._d.clear()
        self._d[key] = verdict

    def __len__(self) -> int:
        return len(self._d)

    @classmethod
    def reset_all(cls) -> None:
        for v in cls._all:
            v._d.clear()


def _switch_gate(family: str) -> tuple[bool, str]:
    reason = disabled_reason(family)
    return (False, reason) if reason else (True, "")


def _first_refusal(checks) -> tuple[bool, str]:
    for gate in checks:
        ok, reason = gate()
        if not ok:
            return False, reason
    return True, ""


def decide(family: str, *checks) -> tuple[bool, str]:
    """Run a family's gates in order and return the first refusal, or (True, "").

    Order: the switches, the fla drift check (raises ``FlaDriftError`` unless
    ``KERNEL_FUN_FALLBACK=1``; ``FlaMissingError`` when fla is absent), then ``checks``:
    zero-argument callables answering (ok, reason), e.g. argument classification, the box,
    the tensor gate, the capture gate.
    """
    return decide_keyed(family, None, None, checks, ())


def decide_keyed(family: str, verdicts: Verdicts, key, static, dynamic) -> tuple[bool, str]:
    """``decide`` with the ``static`` checks' verdict kept in ``verdicts`` under ``key`` (None:
    not kept, and ``verdicts`` may be None). Same order and answers as ``decide(family, *static, *dynamic)``: the switches,
    the drift check, ``static``, then ``dynamic``. A check that raises (bad input) keeps nothing."""
    verdict = _first_refusal((lambda: _switch_gate(family), drift_gate))
    if not verdict[0]:
        return verdict
    verdict = verdicts.get(key) if key is not None else None
    if verdict is None:
        verdict = _first_refusal(static)
        if key is not None:
            verdicts.put(key, verdict)
    if not verdict[0]:
        return verdict
    return _first_refusal(dynamic)
