"""Launch witness: every launcher of ours counts its launches here.

Tests and the benchmark read these counters to observe, not assume, that our kernels ran
(on the GPU the profiler's kernel names are a second witness).
"""
from __future__ import annotations

import threading
from collections import Counter

_lock = threading.Lock()
_counts: Counter = Counter()


def record_launch(name: str) -> None:
    """Count one launch of the kernel ``name`` (``"<family>.<stage>"``)."""
    with _lock:
        _counts[name] += 1


def launch_counts(prefix: str = "") -> dict[str, int]:
    """A snapshot of the counters whose name starts with ``prefix``."""
    with _lock:
        return {k: v for k, v in _counts.items() if k.startswith(prefix)}


def launches(prefix: str = "") -> int:
    """Total launches counted under ``prefix``."""
    return sum(launch_counts(prefix).values())
