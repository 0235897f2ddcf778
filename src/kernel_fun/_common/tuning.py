"""Launch and autotune helpers shared by every family's kernels.

The config convention: each kernel module lists ``CONFIGS`` (the shipped configurations: what
the autotuner sees, each timed and checked on a GPU) and ``CANDIDATES`` (extra ones a bench or
a GPU test may force; a candidate joins ``CONFIGS`` only after both; may be empty), names one
with ``config_name(c)``, and its launcher takes ``config=c`` (keyword) to force one
(``launch``). ``kernel-fun bench --stages FAMILY`` forces each in turn. A module holding a
second tuned kernel prefixes its lists with that kernel's name (cconv's ``TMA_CONFIGS``,
``TMA_CANDIDATES``); a kernel its launcher runs with one fixed configuration (the fixed-order
dw/db reductions: their bits must not depend on a pick) has no lists. Every output a launcher
allocates goes through ``alloc``, so tests can poison outputs with NaN (``POISON_OUTPUTS``) and
an element a kernel forgets to write fails.

Under Triton's interpreter (``TRITON_INTERPRET=1``, read by ``triton.jit`` when a kernel
module is imported) autotuning would run every configuration on the CPU for nothing, so
kernels autotune over the first configuration only.
"""
from __future__ import annotations

import os


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for host-side ints. ``triton.cdiv`` is a ``ConstexprFunction`` in Triton
    3.6 and 3.9 and costs 2-4 us a call on the host (0.07 us here; CPU, 2026-12-01): launchers and
    grid lambdas run per call, some several times."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """The smallest power of two >= ``n`` (0 for n <= 0), as ``triton.next_power_of_2``, without
    its ~3.6 us of ``ConstexprFunction`` dispatch per host call."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


def interpreting() -> bool:
    """True when Triton kernels run through the interpreter (CPU tensors)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on")


# Tests set this (monkeypatch) to make ``alloc`` fill with NaN.
POISON_OUTPUTS = False


def alloc(size, dtype=None, device=None):
    """A kernel output: ``torch.empty``, or NaN-filled while ``POISON_OUTPUTS`` (tests)."""
    import torch

    if POISON_OUTPUTS:
        return torch.full(size, float("nan"), dtype=dtype, device=device)
    return torch.empty(size, dtype=dtype, device=device)


def row_stride(t, name: str) -> int:
    """The token-row stride (elements) of a ``[B, T, *inner]`` output a launcher is handed to
    write into: its inner dimensions contiguous and its B x T rows evenly spaced (a contiguous
    tensor, or a column slice of one, as a fused q/k/v gradient's parts are); ValueError else."""
    inner = 1
    for d in range(t.dim() - 1, 1, -1):
        if t.shape[d] > 1 and t.stride(d) != inner:
            raise ValueError(f"{name}: inner dimensions not contiguous (shape {tuple(t.shape)}, "
                             f"strides {t.stride()})")
        inner *= t.shape[d]
    B, T = t.shape[0], t.shape[1]
    s = t.stride(1) if T > 1 else (t.stride(0) if B > 1 else inner)
    if s < inner or (B > 1 and T > 1 and t.stride(0) != T * s):
        raise ValueError(f"{name}: rows not evenly spaced (shape {tuple(t.shape)}, strides {t.stride()})")
    return s


def launch(kernel, grid, config, *args, **kwargs):
    """Launch an autotuned kernel, or, with ``config`` (a ``triton.Config`` from its module's
    ``CONFIGS`` or ``CANDIDATES``), the underlying jit function with exactly that
    configuration (GPU tests check every configuration: Triton 3.4-3.7.0 miscompiles some dot
    patterns on Hopper, per configuration)."""
    if config is None:
        return kernel[grid](*args, **kwargs)
    return kernel.fn[grid](*args, **kwargs, **config.all_kwargs())


def config_name(c) -> str:
    """A short, stable name of a configuration for test ids and bench records:
    ``BK64-HOIST_S0-w4-s1-r168``."""
    parts = [f"{k}{int(v) if isinstance(v, bool) else v}" for k, v in c.kwargs.items()]
    parts += [f"w{c.num_warps}", f"s{c.num_stages}"] + ([f"r{c.maxnreg}"] if getattr(c, "maxnreg", None) else [])
    return "-".join(parts)


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
