"""``patch_fla()``: route fla's layers through kernel-fun, reversibly.

fla's layers call their ops through names their modules bound at import
(``fla.layers.kda`` did ``from fla.ops.kda import chunk_kda``; ``ShortConvolution.forward``
reads its module's ``causal_conv1d``; ``FusedRMSNormGated.forward`` its module's
``rms_norm_gated``). The patch rebinds exactly those names to kernel-fun's drop-ins. The names
are read when a layer runs, not when it is built, so a model built before the patch gets it as
well as one built after. fla's functions themselves are not touched: each drop-in's fallback
calls the original, which ``compat.fla_symbol`` returns even where a name was rebound here.

Modeling code that imports fla's ops itself (``from fla.ops.kda import chunk_kda`` in a model
file) is patched by naming its module: ``patch_fla(modules=[my_model_module])`` rebinds every
global of that module that *is* one of fla's replaced functions. Such code may also keep the op
on each layer it builds (transformers' Qwen3-Next: ``self.chunk_gated_delta_rule =
chunk_gated_delta_rule`` in ``__init__``), where a module's global no longer reaches a model built
before the patch: a built model (a ``torch.nn.Module``) named in ``modules`` has every attribute
of its submodules that *is* one of fla's replaced functions rebound, and put back by
``unpatch_fla()``. transformers 5 goes one step further: its modeling files wrap the op
(``use_kernel_func_from_hub_with_fallback``: a function that calls fla's, held in its closure), and
the layers keep or call the wrapper (a function, or, with the ``kernels`` package transformers 5
installs, a ``torch.nn.Module`` whose ``forward`` calls it); so in what ``modules`` names, a function
(or such a module's ``forward``) whose closure holds one of fla's replaced functions has that closure
cell rebound (every holder of the wrapper sees it, models
built before the patch included; ``unpatch_fla()`` puts it back). Any other imported module (outside
fla and kernel-fun) that holds one of fla's replaced functions, itself or in such a closure, is
named in a WARNING at ``patch_fla()``: its calls stay fla's unless named (fla's own layer and model
modules too, where one is not among ``TARGETS``: a layer of a newer fla).
"""
from __future__ import annotations

import contextlib
import importlib
import logging
import weakref
from dataclasses import dataclass
from types import CellType, FunctionType, ModuleType

logger = logging.getLogger("kernel_fun")


@dataclass(frozen=True)
class Target:
    """``module.name`` (a name an fla layer calls through) becomes ``ours`` (``pkg:attr``)."""

    module: str
    name: str
    ours: str


TARGETS: tuple = (
    Target("fla.layers.kda", "chunk_kda", "kernel_fun.kda:chunk_kda"),
    # ShortConvolution.forward (every q/k/v conv of KimiDeltaAttention and GatedDeltaNet)
    Target("fla.modules.causal_conv1d.ops", "causal_conv1d", "kernel_fun.cconv:causal_conv1d"),
    # GatedDeltaNet's fused q/k/v conv: one call over the three concatenated projections
    Target("fla.layers.gated_deltanet", "causal_conv1d", "kernel_fun.cconv:causal_conv1d"),
    # FusedRMSNormGated.forward (the layers' output norm)
    Target("fla.modules.norm.fused_norm_gate", "rms_norm_gated", "kernel_fun.gnorm:rms_norm_gated"),
    Target("fla.layers.gated_deltanet", "chunk_gated_delta_rule", "kernel_fun.gdn:chunk_gated_delta_rule"),
    # MomAttention (Mixture-of-Memories): the same op over its memories' packed tokens
    Target("fla.layers.mom", "chunk_gated_delta_rule", "kernel_fun.gdn:chunk_gated_delta_rule"),
)

# (module name, attribute) -> (the module, fla's object), for every name rebound now
_originals: dict = {}


def _resolve(spec: str):
    mod, _, attr = spec.partition(":")
    return getattr(importlib.import_module(mod), attr)


def _family_available(target: Target):
    """Our drop-in, or None when that family is not in this build of kernel-fun."""
    try:
        return _resolve(target.ours)
    except (ImportError, AttributeError):
        return None


def original(module: str, name: str, current):
    """fla's object behind ``module.name`` (``current`` unless this patch rebound it)."""
    entry = _originals.get((module, name))
    return current if entry is None else entry[1]


def is_patched() -> bool:
    return bool(_originals)


def _is_fla(obj) -> bool:
    return (getattr(obj, "__module__", None) or "").split(".")[0] == "fla"


def _owners(m):
    """What ``modules`` names, as (object whose attributes are rebound, label): a module (object or
    dotted name), or every submodule of a built ``torch.nn.Module`` (its attributes are the
    instance's own: ``vars`` of the submodule), labelled ``Class@id.path``."""
    if isinstance(m, str):
        return [(importlib.import_module(m), m)]
    if isinstance(m, ModuleType):
        return [(m, m.__name__)]
    import torch

    if isinstance(m, torch.nn.Module):
        root = f"{type(m).__name__}@{id(m):x}"
        return [(sub, f"{root}.{path}" if path else root) for path, sub in m.named_modules()]
    raise TypeError(f"patch_fla(modules=...): a module, a dotted module name or a torch.nn.Module, got {m!r}")


def _owner(entry):
    """The object an ``_originals`` entry rebound a name on, or None once it is gone (a built
    model is held weakly: the patch does not keep a model alive)."""
    ref = entry[0]
    return ref() if isinstance(ref, weakref.ref) else ref


def _fla_cells(fn, replaced: dict, depth: int = 3):
    """(cell, variable name) of every closure cell of ``fn`` (and of the functions its cells hold,
    ``depth`` levels down) whose contents is one of fla's replaced functions."""
    found, seen, todo = [], set(), [(fn, depth)]
    while todo:
        f, d = todo.pop()
        if id(f) in seen or d <= 0:
            continue
        seen.add(id(f))
        if type(f) is not FunctionType or not f.__closure__:
            continue
        for var, cell in zip(f.__code__.co_freevars, f.__closure__):
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if id(value) in replaced:
                found.append((cell, var))
            elif type(value) is FunctionType:
                todo.append((value, d - 1))
    return found


def _closure_roots(value) -> list:
    """The functions of ``value`` whose closures may hold fla's op: ``value`` itself where it is a
    function, the class's own ``forward`` where it is a ``torch.nn.Module`` (transformers 5 with the
    ``kernels`` package turns the wrapper into a module whose ``forward`` calls it). Read off
    ``type(value)`` only: no attribute of someone else's object is touched."""
    import torch

    cls = type(value)
    if cls is FunctionType:
        return [value] if value.__closure__ else []
    forward = cls.__dict__.get("forward")
    if type(forward) is FunctionType and forward.__closure__ and issubclass(cls, torch.nn.Module):
        return [forward]
    return []


def _rebind_cells(fn, label: str, replaced: dict) -> list[str]:
    """Rebind ``fn``'s closure cells that hold fla's replaced functions; the names rebound."""
    done = []
    for i, (cell, var) in enumerate(_fla_cells(fn, replaced)):
        name = f"<closure {var}>" if (label, f"<closure {var}>") not in _originals else f"<closure {var} {i}>"
        _originals[(label, name)] = (cell, cell.cell_contents)  # a cell is held strongly: it keeps no model alive
        cell.cell_contents = replaced[id(cell.cell_contents)]
        done.append(f"{label}.{name}")
    return done


def _restore(name: str, entry) -> bool:
    """Put one ``_originals`` entry back; False where its model is gone."""
    owner = _owner(entry)
    if owner is None:
        return False
    if isinstance(owner, CellType):
        owner.cell_contents = entry[1]
    else:
        setattr(owner, name, entry[1])
    return True


def _rebind(mod, name: str, ours, label: str | None = None) -> bool:
    key = (label or mod.__name__, name)
    entry = _originals.get(key)
    if entry is not None and _owner(entry) is mod:
        return False  # already ours: patch_fla() is idempotent
    _originals.pop(key, None)  # a model that is gone, whose id a new one took
    current = getattr(mod, name)
    if not _is_fla(current):
        # someone else rebound it (another patcher, a user's wrapper): do not stack on it
        logger.warning("kernel-fun patch: %s.%s is not fla's (it is %r); left as it is", key[0], name, current)
        return False
    _originals[key] = (mod if isinstance(mod, ModuleType) else weakref.ref(mod), current)
    setattr(mod, name, ours)
    return True


def patch_fla(modules=()) -> list[str]:
    """Route fla's layers (``KimiDeltaAttention``, ``GatedDeltaNet``, ``ShortConvolution``,
    ``FusedRMSNormGated``) through kernel-fun. Idempotent; undone by ``unpatch_fla()``.

    ``modules``: further modules (objects or dotted names) whose globals bind fla's replaced
    functions directly (modeling code that imports fla's ops): those globals are rebound too; and
    built models (``torch.nn.Module``), whose submodules' attributes that hold one of fla's
    replaced functions (a layer that kept the op in ``__init__``) are rebound.
    Returns the names rebound by this call; logs them once at INFO.
    A target fla no longer has raises ``FlaDriftError`` (a warning under
    ``KERNEL_FUN_FALLBACK=1``): a patch that silently did nothing would read as 1.00x.
    """
    from ._common import compat, report, switches

    owners = [o for m in modules for o in _owners(m)]  # a bad entry raises before anything is rebound
    done, missing, found = [], [], []
    for t in TARGETS:
        ours = _family_available(t)
        if ours is None:
            continue  # the family is not built yet: its layers keep fla's op
        try:
            mod = importlib.import_module(t.module)
        except ImportError as exc:
            missing.append(f"{t.module}.{t.name} ({type(exc).__name__}: {exc})")
            continue
        if not hasattr(mod, t.name):
            missing.append(f"{t.module}.{t.name} (no such name)")
            continue
        found.append((mod, t, ours))
    if missing:  # before anything is rebound: a refused patch leaves fla as it was
        msg = "kernel-fun patch: fla drift: " + "; ".join(missing)
        if not switches.fallback_on_drift():
            raise compat.FlaDriftError(msg + " (set KERNEL_FUN_FALLBACK=1 to go on with fla's op there)")
        logger.warning("%s; KERNEL_FUN_FALLBACK=1: those layers keep fla's op", msg)
    replaced = {}  # id(fla's function behind a target) -> our drop-in
    for mod, t, ours in found:
        replaced[id(original(t.module, t.name, getattr(mod, t.name)))] = ours
        if _rebind(mod, t.name, ours):
            done.append(f"{t.module}.{t.name}")
    for owner, label in owners:
        for name, value in list(vars(owner).items()):
            ours = replaced.get(id(value))
            if ours is not None:
                if _rebind(owner, name, ours, label):
                    done.append(f"{label}.{name}")
            else:
                for fn in _closure_roots(value):
                    done += _rebind_cells(fn, f"{label}.{name}", replaced)
    if done:
        report.log_once(("patch", tuple(done)), "kernel-fun patch_fla: routed " + ", ".join(done))
    for label, names in _unnamed_bindings(replaced, frozenset(id(o) for o, _ in owners)):
        report.log_once(("patch-unnamed", label), (
            f"kernel-fun patch_fla: {label} holds fla's op itself ({', '.join(names)}) and was not named: its calls "
            f"(and those of layers built from it that kept the op) stay fla's; pass the module, or the built "
            f"model, in patch_fla(modules=[...])"), logging.WARNING)
    return done


_last_scan = None  # (modules imported, fla's replaced functions, modules named) at the last look


def _outside_scan(mod_name: str) -> bool:
    """Modules the look for unnamed holders skips: kernel-fun, and fla's except its layers and
    models (``fla.ops`` and ``fla.modules`` define and re-export the ops; a layer module of an fla
    release newer than ``TARGETS`` knows, as ``fla.layers.mom`` was, is named like anyone's)."""
    top, _, rest = mod_name.partition(".")
    if top == "kernel_fun":
        return True
    return top == "fla" and not rest.startswith(("layers.", "models."))


def reset_scan() -> None:
    """Forget the last look (tests: a module a test added and removed can leave its id to the next)."""
    global _last_scan
    _last_scan = None


def _unnamed_bindings(replaced: dict, named: frozenset):
    """(module name, [global names]) of every imported module outside kernel-fun and fla's ops and
    modules (``_outside_scan``), not named
    in ``modules``, whose globals hold one of fla's replaced functions (modeling code that imported
    fla's op itself, which a rebound fla name does not reach). Reads each module's ``__dict__`` as it
    is (a lazy module is not made to import anything). Looks again only when a module was imported
    since the last look or the call differs (its warnings are logged once anyway)."""
    import sys

    global _last_scan
    scan = (frozenset((n, id(m)) for n, m in list(sys.modules.items())), frozenset(replaced), named)
    if scan == _last_scan:  # nothing imported since the last look (patched_fla() in a loop): 42 ms saved
        return []
    _last_scan = scan
    found = []
    for mod_name, mod in list(sys.modules.items()):
        if _outside_scan(mod_name) or id(mod) in named or not isinstance(mod, ModuleType):
            continue
        try:
            names = sorted(n for n, v in list(mod.__dict__.items()) if not n.startswith("__") and (
                id(v) in replaced or any(_fla_cells(f, replaced) for f in _closure_roots(v))))
        except Exception:  # noqa: BLE001  (a look at someone else's module never fails the patch)
            continue
        if names:
            found.append((mod_name, names))
    return found


def unpatch_fla() -> list[str]:
    """Put back every name ``patch_fla()`` rebound; returns them."""
    undone = []
    for (module, name), entry in list(_originals.items()):
        del _originals[(module, name)]
        if _restore(name, entry):
            undone.append(f"{module}.{name}")
    if undone:
        logger.info("kernel-fun unpatch_fla: restored %s", ", ".join(undone))
    return undone


@contextlib.contextmanager
def patched_fla(modules=()):
    """``with patched_fla(): ...``: patched inside, restored after (only what this call rebound)."""
    done = patch_fla(modules)
    try:
        yield done
    finally:
        for key in done:
            module, _, name = key.rpartition(".")
            entry = _originals.pop((module, name), None)
            if entry is not None:
                _restore(name, entry)
