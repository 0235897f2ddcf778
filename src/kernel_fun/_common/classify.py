"""Argument classification: every argument of a call is handled by us, or routes the call to
fla with a reason that names it. An argument never seen routes to fla; none is ignored.

A family declares one ``Rule`` per parameter of fla's public signature::

    RULES = {
        "x": ours(),                                  # any value is ours
        "residual": only(None, "residual"),           # ours only at its default
        "backend": check(lambda v, call: ...),        # ours when the check returns None
    }

``classify(RULES, call, extra)`` answers ``(ok, reason)``; ``signature_problems`` is the
reusable test check that fails when fla's signature gains a parameter nobody classified.
Per call this is one dict walk: ``ours()`` rules are skipped and ``only(None)`` is an identity
test, so the cost is the few real checks (it runs on every call of every public op).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable

_ANY = object()  # ours(): nothing to check
_NONE = object()  # only(None, ...): ours while the value is None


@dataclass(frozen=True)
class Rule:
    # check(value, call) -> None when ours, else the reason it routes to fla. ``kind`` lets
    # classify skip the call for the two rules that need none.
    check: Callable[[Any, dict], str | None]
    kind: object = None
    what: str = ""


def ours() -> Rule:
    """Any value of this argument is handled by our kernels (validated elsewhere)."""
    return Rule(lambda value, call: None, _ANY)


def only(default: Any, what: str) -> Rule:
    """Ours only while the argument keeps its default; otherwise route with ``what``."""

    def _check(value, call):
        same = value is default if default is None or isinstance(default, bool) else value == default
        return None if same else f"{what} is not supported (routed to fla)"

    return Rule(_check, _NONE if default is None else None, what)


def check(fn: Callable[[Any, dict], str | None]) -> Rule:
    """Ours when ``fn(value, call)`` returns None; else the string it returns is the reason."""
    return Rule(fn)


def classify(rules: dict, call: dict, extra: dict | None = None) -> tuple[bool, str]:
    """``call``: the named arguments as received; ``extra``: the ``**kwargs`` of the call."""
    for items in (call.items(), extra.items() if extra else ()):
        for name, value in items:
            rule = rules.get(name)
            if rule is None:
                return False, f"argument '{name}' is not classified by kernel-fun"
            kind = rule.kind
            if kind is _ANY or (kind is _NONE and value is None):
                continue
            reason = rule.check(value, call)
            if reason:
                return False, reason
    return True, ""


def signature_problems(ours_fn: Callable, fla_fn: Callable, rules: dict) -> list[str]:
    """What breaks the drop-in contract between our entry and fla's current one: a parameter of
    fla's that has no rule, or that our signature lacks or defaults differently."""
    problems = []
    fla_params = inspect.signature(fla_fn).parameters
    our_params = inspect.signature(ours_fn).parameters
    for name, p in fla_params.items():
        if p.kind is p.VAR_KEYWORD:
            if not any(q.kind is q.VAR_KEYWORD for q in our_params.values()):
                problems.append("fla accepts **kwargs but our entry does not")
            continue
        if name not in rules:
            problems.append(f"fla parameter '{name}' is not classified")
        if name not in our_params:
            problems.append(f"fla parameter '{name}' is missing from our signature")
        elif our_params[name].default != p.default:
            problems.append(
                f"default of '{name}' differs: ours {our_params[name].default!r}, fla {p.default!r}"
            )
    for name, p in our_params.items():
        if p.kind is not p.VAR_KEYWORD and name not in fla_params:
            problems.append(f"our parameter '{name}' is not in fla's signature")
    return problems
