"""Autotune helpers shared by every family's kernels.

Under Triton's interpreter (``TRITON_INTERPRET=1``, read by ``triton.jit`` when a kernel
module is imported) autotuning would run every configuration on the CPU for nothing, so
kernels autotune over the first configuration only.
"""
from __future__ import annotations

import os


def interpreting() -> bool:
    """True when Triton kernels run through the interpreter (CPU tensors)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on")


def autotune_configs(configs: list) -> list:
    """The configurations to autotune over: all on a GPU, the first under the interpreter."""
    return list(configs[:1]) if interpreting() else list(configs)
