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


def fitting_blocks(configs, limits: dict) -> list:
    """The configurations whose blocks are no wider than ``limits`` (e.g. ``{"BV": max(V, 32)}``: a
    wider block runs only masked lanes); the first one where none fits."""
    kept = [c for c in configs if all(c.kwargs[b] <= most for b, most in limits.items())]
    return kept or list(configs[:1])


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


# The configuration Triton's autotuner chose, per kernel and tuning key (``launch``).
_chosen: dict = {}
_UNSET = object()  # a key argument the call does not pass (the autotuner leaves it out of its key)


def launch(kernel, grid, config, *args, **kwargs):
    """Launch an autotuned kernel, or, with ``config`` (a ``triton.Config`` from its module's
    ``CONFIGS`` or ``CANDIDATES``), the underlying jit function with exactly that
    configuration (GPU tests check every configuration: Triton 3.4-3.7.0 miscompiles some dot
    patterns on Hopper, per configuration).

    Autotuned, a call whose tuning key was seen goes straight to the jit function with the
    configuration the autotuner chose for that key: Triton's ``Autotuner.run`` rebuilds its key
    on every call (dicts of all arguments, a list search per argument, ``str`` of every dtype), 13
    us of host a launch of a 16-argument kernel and 38 us of a 40-argument one (H200 host, Triton
    3.6, ``tools/launch_cost.py``), against 20 and 39 us for the jit launch itself. The key here
    holds what the autotuner's holds (the values of its ``key`` arguments, the dtype of every
    argument that has one, in the call's order), so every call gets the configuration the
    autotuner gives it; a new key, or a configuration with a ``pre_hook``, goes through the
    autotuner (which tunes, or finds its cached pick) and is remembered. Either way the kernel's
    ``best_config`` is this call's configuration afterwards (launchers read it back: gnorm's
    backward sizes its dw reduction by it; without that, 4 of its GPU tests failed on 2026-12-03)."""
    if config is not None:
        return kernel.fn[grid](*args, **kwargs, **config.all_kwargs())
    names, keys, configs = (getattr(kernel, a, None) for a in ("arg_names", "keys", "configs"))
    if names is None or keys is None or not configs:  # not a triton.autotune kernel
        return kernel[grid](*args, **kwargs)
    call = {**dict(zip(names, args)), **kwargs} if args else kwargs  # positional ones by name, as the autotuner reads them
    try:
        key = (id(kernel), *[call.get(k, _UNSET) for k in keys], *[v.dtype for v in call.values() if hasattr(v, "dtype")])
        chosen = _chosen.get(key)
    except TypeError:  # an unhashable key argument
        return kernel[grid](**call)
    if chosen is not None:
        picked, kw = chosen
        kernel.best_config = picked  # as the autotuner's run sets it (gnorm's backward reads it back)
        return kernel.fn.run(grid=grid, warmup=False, **call, **kw)
    ret = kernel[grid](**call)
    picked = _autotuner_pick(kernel, call)
    if picked is not None and picked.pre_hook is None:
        if len(_chosen) >= 4096:  # bounded: shapes that never repeat cost the autotuner's path, never memory
            _chosen.clear()
        _chosen[key] = (picked, picked.all_kwargs())
    return ret


def _autotuner_pick(kernel, call: dict):
    """The configuration ``kernel`` (a ``triton.autotune`` Autotuner) holds for this call: its
    only one, or the one in its cache under the key it builds (Triton 3.6 and 3.9 build it alike:
    the ``key`` arguments' values, then ``str`` of the dtype of every argument that has one, in
    the call's order); None where that cache has no entry (the call is then not remembered)."""
    if len(kernel.configs) == 1:
        return kernel.configs[0]
    names = set(kernel.arg_names)
    args = {k: v for k, v in call.items() if k in names}
    tkey = tuple([args[k] for k in kernel.keys if k in args] + [str(v.dtype) for v in args.values() if hasattr(v, "dtype")])
    cache = getattr(kernel, "cache", None)
    return cache.get(tkey) if isinstance(cache, dict) else None


def config_name(c) -> str:
    """A short, stable name of a configuration for test ids and bench records:
    ``BK64-HOIST_S0-w4-s1-r168``."""
    parts = [f"{k}{int(v) if isinstance(v, bool) else v}" for k, v in c.kwargs.items()]
    parts += [f"w{c.num_warps}", f"s{c.num_stages}"] + ([f"r{c.maxnreg}"] if getattr(c, "maxnreg", None) else [])
    return "-".join(parts)


def work_bucket(units: int) -> int:
    """The ``WORK`` autotune key of the delta-rule kernels (the scans, gdn's and kda's chunk
    kernels): how much parallel work a launch has, as a coarse bucket of ``units`` (a scan's
    sequences x value heads; a chunk kernel's chunks x heads, from the shapes, never from
    ``cu_seqlens``' values, so that a call the capture gate holds warm never meets a new key):
    steps of 4x: fewer than 16 units 2, 16-63 3, ..., 16-64 Ki 8, more 9 (never 1, which Triton
    would specialize). Keyed without it, every shape took the configs the process's (or the on-disk
    cache's) first shape tuned: on the H200 (2026-12-04, docs/model.md) the GDN model step ran
    0.9 ms slower on the picks the GPU tests had left at their small shapes. Keyed on B and T
    themselves, every new T would re-time every config."""
    return max(2, (min(max(units, 1), 1 << 16).bit_length() + 1) // 2)


def chunk_work(B: int, T: int, BT: int, heads: int) -> int:
    """``WORK`` of a chunk kernel (a program per chunk and head): ``work_bucket`` of its chunks x
    heads, the chunks counted from the shapes (B x ceil(T / BT)), never from ``cu_seqlens``' values
    (a packed batch's chunk count changes with its documents' lengths at one signature)."""
    return work_bucket(B * cdiv(T, BT) * heads)


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
