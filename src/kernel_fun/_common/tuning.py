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


def autotune_cache() -> dict:
    """``triton.autotune`` keyword arguments that keep each autotune result on disk (Triton's
    cache, keyed by the kernel source, the GPU target, the configs and the tuning key), so a
    restarted job does not re-time every configuration; fla 0.6.0 does the same for its own
    kernels. Empty where Triton predates the option. Triton skips it under the interpreter."""
    import inspect

    import triton

    return {"cache_results": True} if "cache_results" in inspect.signature(triton.autotune).parameters else {}


def install_interpreter_shims() -> None:
    """Let the interpreter run ``for i in range(n)`` with a runtime ``n``.

    Triton 3.6's interpreter holds scalars as 1-element arrays and converts them with
    ``int(array)``, which NumPy >= 2.4 rejects ("only 0-dimensional arrays can be
    converted"), so every loop with a runtime bound fails under ``TRITON_INTERPRET=1``.
    Interpreter only (a no-op otherwise), idempotent; every kernel module calls it at import.
    tests/common/test_tuning.py runs a runtime-bound loop through it.
    """
    if not interpreting():
        return
    from triton.runtime import interpreter as interp

    if getattr(interp, "_kernel_fun_index_shim", False) or not hasattr(interp, "_patch_lang_tensor"):
        return
    original = interp._patch_lang_tensor

    def patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interp._patch_lang_tensor = patch_lang_tensor
    interp._kernel_fun_index_shim = True
