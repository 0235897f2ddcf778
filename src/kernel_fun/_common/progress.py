"""Progress lines for warmup(): what is compiling now and how long it took, on stderr."""
from __future__ import annotations

import sys
import time


def run_steps(family: str, steps: list, verbose: bool = True) -> None:
    """Run ``steps`` (label, zero-argument callable) in order, one progress line each."""
    for i, (label, fn) in enumerate(steps):
        t0 = time.perf_counter()
        if verbose:
            print(f"kernel-fun {family} warmup [{i + 1}/{len(steps)}] {label} ...", end="",
                  file=sys.stderr, flush=True)
        fn()
        if verbose:
            print(f" {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
