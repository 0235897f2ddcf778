"""patch_fla(): which names it rebinds, idempotence, reversibility, the fallback still reaching
fla's own functions, drift, modeling code that imports fla's ops itself, and a built model whose
layers kept fla's ops (CPU)."""
import functools
import importlib
import inspect
import logging
import types

import pytest
import torch

import kernel_fun
from kernel_fun import patch
from kernel_fun._common import compat

EXPECTED = {  # name an fla layer calls through -> our drop-in
    "fla.layers.kda.chunk_kda": "kernel_fun.kda:chunk_kda",
    "fla.modules.causal_conv1d.ops.causal_conv1d": "kernel_fun.cconv:causal_conv1d",
    "fla.layers.gated_deltanet.causal_conv1d": "kernel_fun.cconv:causal_conv1d",
    "fla.modules.norm.fused_norm_gate.rms_norm_gated": "kernel_fun.gnorm:rms_norm_gated",
    "fla.layers.gated_deltanet.chunk_gated_delta_rule": "kernel_fun.gdn:chunk_gated_delta_rule",
    "fla.layers.mom.chunk_gated_delta_rule": "kernel_fun.gdn:chunk_gated_delta_rule",
}


def _get(dotted):
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _ours(spec):
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


@pytest.fixture(autouse=True)
def _unpatched(clean_state):
    kernel_fun.unpatch_fla()
    before = {k: _get(k) for k in EXPECTED}
    yield before
    kernel_fun.unpatch_fla()
    assert {k: _get(k) for k in EXPECTED} == before


def test_patch_rebinds_the_layers_names_and_unpatch_restores_them(_unpatched, caplog):
    caplog.set_level(logging.INFO, logger="kernel_fun")
    done = kernel_fun.patch_fla()
    assert set(EXPECTED) <= set(done)
    for name, spec in EXPECTED.items():
        assert _get(name) is _ours(spec), name
    assert "kernel-fun patch_fla: routed" in caplog.text
    # fla's own functions are untouched: the public entries our fallbacks call
    import fla.modules.causal_conv1d
    import fla.ops.kda

    assert fla.ops.kda.chunk_kda is _unpatched["fla.layers.kda.chunk_kda"]
    assert fla.modules.causal_conv1d.causal_conv1d is _unpatched["fla.modules.causal_conv1d.ops.causal_conv1d"]
    restored = kernel_fun.unpatch_fla()
    assert set(restored) == set(done)
    assert {k: _get(k) for k in EXPECTED} == _unpatched


def test_patch_is_idempotent():
    first = kernel_fun.patch_fla()
    assert first and kernel_fun.patch_fla() == []
    for name, spec in EXPECTED.items():
        assert _get(name) is _ours(spec)
    assert len(kernel_fun.unpatch_fla()) == len(first)


def test_context_manager_restores(_unpatched):
    with kernel_fun.patched_fla() as done:
        assert set(EXPECTED) <= set(done)
        assert _get("fla.layers.kda.chunk_kda") is _ours(EXPECTED["fla.layers.kda.chunk_kda"])
    assert {k: _get(k) for k in EXPECTED} == _unpatched
    assert not patch.is_patched()


def test_fallback_reaches_fla_not_ourselves_while_patched():
    """Every fla symbol a family calls resolves to fla's object, never to one of ours, with the
    patch on (a fallback that resolved to our drop-in would recurse forever)."""
    kernel_fun.patch_fla()
    for call in compat.FLA_CALLS:
        obj = compat.fla_symbol(call.module, call.symbol)
        assert not getattr(obj, "__module__", "").startswith("kernel_fun"), (call, obj)


def test_a_name_someone_else_rebound_is_left_alone(caplog):
    import fla.layers.kda as layer

    def theirs(*a, **k):
        return None

    saved, layer.chunk_kda = layer.chunk_kda, theirs
    try:
        caplog.set_level(logging.WARNING, logger="kernel_fun")
        done = kernel_fun.patch_fla()
        assert "fla.layers.kda.chunk_kda" not in done and layer.chunk_kda is theirs
        assert "is not fla's" in caplog.text
    finally:
        layer.chunk_kda = saved


def test_drift_in_a_target_raises_unless_fallback(monkeypatch):
    import fla.layers.kda as layer

    saved = layer.chunk_kda  # restored by hand: clean_state's monkeypatch is torn down last
    del layer.chunk_kda
    try:
        with pytest.raises(compat.FlaDriftError, match="fla.layers.kda.chunk_kda"):
            kernel_fun.patch_fla()
        assert not patch.is_patched()  # refused whole: nothing half-patched
        monkeypatch.setenv("KERNEL_FUN_FALLBACK", "1")
        done = kernel_fun.patch_fla()
        assert "fla.layers.kda.chunk_kda" not in done and "fla.layers.gated_deltanet.causal_conv1d" in done
    finally:
        layer.chunk_kda = saved


def test_modeling_code_that_imports_fla_ops_itself():
    """The pattern for a model file doing ``from fla.ops.kda import chunk_kda``: name its module."""
    from fla.modules.norm.fused_norm_gate import rms_norm_gated
    from fla.ops.kda import chunk_kda

    model_file = types.ModuleType("my_modeling_kda")
    model_file.chunk_kda = chunk_kda
    model_file.rms_norm_gated = rms_norm_gated
    model_file.unrelated = len
    done = kernel_fun.patch_fla(modules=[model_file])
    assert {"my_modeling_kda.chunk_kda", "my_modeling_kda.rms_norm_gated"} <= set(done)
    assert model_file.chunk_kda is _ours("kernel_fun.kda:chunk_kda")
    assert model_file.rms_norm_gated is _ours("kernel_fun.gnorm:rms_norm_gated")
    assert model_file.unrelated is len
    kernel_fun.unpatch_fla()
    assert model_file.chunk_kda is chunk_kda and model_file.rms_norm_gated is rms_norm_gated


class _KeepsTheOp(torch.nn.Module):
    """transformers' Qwen3-Next pattern: the layer keeps the op it imported from fla in
    ``__init__`` (``self.chunk_gated_delta_rule = chunk_gated_delta_rule``), so a module global
    rebound after the model was built no longer reaches it."""

    def __init__(self, op, recurrent):
        super().__init__()
        self.proj = torch.nn.Linear(2, 2)
        self.chunk_gated_delta_rule = op
        self.recurrent_gated_delta_rule = recurrent  # decoding: not replaced, left as it is


def test_a_built_model_that_kept_fla_ops_on_its_layers():
    """A model built before the patch: naming it rebinds its layers' attributes that hold fla's
    replaced functions (nothing else), idempotently; unpatch and the context manager put them
    back; the patch holds the model weakly."""
    import gc
    import weakref

    from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule

    ours = _ours("kernel_fun.gdn:chunk_gated_delta_rule")
    model = torch.nn.Sequential(_KeepsTheOp(chunk_gated_delta_rule, fused_recurrent_gated_delta_rule),
                                torch.nn.Sequential(_KeepsTheOp(chunk_gated_delta_rule, fused_recurrent_gated_delta_rule)))
    layers = [model[0], model[1][0]]
    done = kernel_fun.patch_fla(modules=[model])
    root = f"Sequential@{id(model):x}"
    assert {f"{root}.0.chunk_gated_delta_rule", f"{root}.1.0.chunk_gated_delta_rule"} <= set(done), done
    assert all(m.chunk_gated_delta_rule is ours for m in layers)
    assert all(m.recurrent_gated_delta_rule is fused_recurrent_gated_delta_rule for m in layers)
    assert "chunk_gated_delta_rule" not in model[0]._modules and "proj" in model[0]._modules  # an attribute, not a child
    again = kernel_fun.patch_fla(modules=[model])
    assert not any(d.startswith(root) for d in again)  # idempotent
    kernel_fun.unpatch_fla()
    assert all(m.chunk_gated_delta_rule is chunk_gated_delta_rule for m in layers)
    with kernel_fun.patched_fla(modules=[model]):
        assert all(m.chunk_gated_delta_rule is ours for m in layers)
    assert all(m.chunk_gated_delta_rule is chunk_gated_delta_rule for m in layers)
    # held weakly: a patched model that is dropped is freed, and unpatching skips it
    kernel_fun.patch_fla(modules=[model])
    gone = weakref.ref(model)
    del model, layers
    gc.collect()
    assert gone() is None
    assert not any(r.startswith(root) for r in kernel_fun.unpatch_fla())


def test_modules_rejects_what_it_cannot_patch():
    with pytest.raises(TypeError, match="torch.nn.Module"):
        kernel_fun.patch_fla(modules=[object()])
    assert not patch.is_patched()  # refused before anything was rebound


def test_an_imported_module_that_binds_fla_ops_and_was_not_named_is_warned_of(caplog, monkeypatch):
    """Modeling code imported before the patch that holds fla's op itself is not reached by the
    patch unless named: a WARNING says so, naming the module and the op; naming it silences it."""
    import sys

    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    modeling = types.ModuleType("some_modeling_qwen")
    modeling.chunk_gated_delta_rule = chunk_gated_delta_rule
    monkeypatch.setitem(sys.modules, "some_modeling_qwen", modeling)
    caplog.set_level(logging.INFO, logger="kernel_fun")
    kernel_fun.patch_fla()
    warned = [r for r in caplog.records if r.levelno == logging.WARNING and "some_modeling_qwen" in r.getMessage()]
    assert len(warned) == 1 and "chunk_gated_delta_rule" in warned[0].getMessage(), caplog.text
    assert "modules=[...]" in warned[0].getMessage()
    kernel_fun.unpatch_fla()
    caplog.clear()
    from kernel_fun._common import report

    report.reset_logged()
    kernel_fun.patch_fla(modules=[modeling])
    assert modeling.chunk_gated_delta_rule is _ours("kernel_fun.gdn:chunk_gated_delta_rule")
    assert not [r for r in caplog.records if "some_modeling_qwen" in r.getMessage() and r.levelno == logging.WARNING]


def test_an_fla_layer_module_outside_the_targets_is_warned_of_and_fla_ops_modules_are_not(caplog, monkeypatch):
    """A layer module of a newer fla that binds a replaced op at import (as ``fla.layers.mom`` did
    before it joined the targets) is not reached by the targets: a WARNING names it. fla's ops and
    modules packages, which define and re-export the ops, are not warned of."""
    import sys

    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    layer_mod = types.ModuleType("fla.layers.some_new_layer")
    layer_mod.chunk_gated_delta_rule = chunk_gated_delta_rule
    monkeypatch.setitem(sys.modules, "fla.layers.some_new_layer", layer_mod)
    caplog.set_level(logging.INFO, logger="kernel_fun")
    kernel_fun.patch_fla()
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert [m for m in warned if "fla.layers.some_new_layer" in m and "chunk_gated_delta_rule" in m], warned
    assert not [m for m in warned if "fla.ops" in m or "fla.modules" in m], warned
    assert not patch._outside_scan("fla.models.some_model") and patch._outside_scan("fla.ops.kda.chunk")


def _hub_wrapped(torch_function, implementation):
    """transformers 5's ``use_kernel_func_from_hub_with_fallback`` as its modeling files apply it
    (Qwen3.5, Qwen3-Next at its HEAD): a function named after the torch fallback that calls the
    package's op, held in its closure, with the keyword arguments that op takes."""
    applicable = tuple(inspect.signature(implementation).parameters)

    @functools.wraps(torch_function)
    def wrapped(*args, **kwargs):
        return implementation(*args, **{k: v for k, v in kwargs.items() if k in applicable})

    return wrapped


def test_an_op_that_transformers_5_wrapped_reaches_ours_through_its_closure(caplog, monkeypatch):
    """The wrapper is what the modeling module and its layers hold (fla's op only in its closure):
    left unnamed, a WARNING names the module; named (the module, or a built model), the closure
    cell is rebound, so a layer built before the patch calls ours (its launches witnessed); unpatch
    and the context manager put fla's back."""
    import sys

    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    from kernel_fun._common import report
    from kernel_fun._common.witness import launch_counts

    def torch_chunk_gated_delta_rule(query, key, value, g, beta, chunk_size=64, initial_state=None,
                                     output_final_state=False, use_qk_l2norm_in_kernel=False):
        raise AssertionError("the torch fallback ran")

    modeling = types.ModuleType("some_modeling_qwen3_5")
    modeling.torch_chunk_gated_delta_rule = _hub_wrapped(torch_chunk_gated_delta_rule, chunk_gated_delta_rule)
    monkeypatch.setitem(sys.modules, "some_modeling_qwen3_5", modeling)
    layer = _KeepsTheOp(modeling.torch_chunk_gated_delta_rule, None)  # built before the patch
    wrapper = layer.chunk_gated_delta_rule
    ours = _ours("kernel_fun.gdn:chunk_gated_delta_rule")

    def cell():
        return dict(zip(wrapper.__code__.co_freevars, (c.cell_contents for c in wrapper.__closure__)))["implementation"]

    caplog.set_level(logging.INFO, logger="kernel_fun")
    kernel_fun.patch_fla()
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "some_modeling_qwen3_5" in r.getMessage()]
    assert len(warned) == 1 and "torch_chunk_gated_delta_rule" in warned[0], caplog.text
    assert cell() is chunk_gated_delta_rule
    for named in (modeling, layer):
        kernel_fun.unpatch_fla()
        report.reset_logged()
        caplog.clear()
        done = kernel_fun.patch_fla(modules=[named])
        assert any(d.endswith("<closure implementation>") for d in done), done
        assert cell() is ours and layer.chunk_gated_delta_rule is wrapper
        assert not [r for r in caplog.records if r.levelno == logging.WARNING and "some_modeling" in r.getMessage()]
        assert not [d for d in kernel_fun.patch_fla(modules=[named]) if "closure" in d]  # idempotent
    # the layer built before the patch calls ours through the wrapper (q, k [1, 4, 1, 64] fp16, the
    # l2norm in the op: every stage ours under the interpreter)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 1, 64, generator=gen).half() for _ in range(3))
    g, beta = -torch.rand(1, 4, 1, generator=gen), torch.rand(1, 4, 1, generator=gen).half()
    before = launch_counts("gdn.")
    o, _ = layer.chunk_gated_delta_rule(q, k, v, g=g, beta=beta, initial_state=None, output_final_state=False,
                                        use_qk_l2norm_in_kernel=True)
    assert launch_counts("gdn.") != before and o.shape == v.shape
    kernel_fun.unpatch_fla()
    assert cell() is chunk_gated_delta_rule
    with kernel_fun.patched_fla(modules=[modeling]):
        assert cell() is ours
    assert cell() is chunk_gated_delta_rule


def test_an_op_the_kernels_package_made_a_module_of_reaches_ours(monkeypatch):
    """With the ``kernels`` package (a dependency of transformers 5) the wrapper becomes a
    ``torch.nn.Module`` whose class's ``forward`` calls it (kernels' ``_create_func_module``): the
    modeling module holds that module; naming it rebinds the cell two closures down, warned of when
    unnamed, put back by unpatch."""
    import sys

    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    def torch_chunk_gated_delta_rule(query, key, value, g, beta, initial_state=None, output_final_state=False,
                                     use_qk_l2norm_in_kernel=False):
        raise AssertionError("the torch fallback ran")

    def as_module(func):
        class Func(torch.nn.Module):
            def forward(self, *args, **kwargs):
                return func(*args, **kwargs)

        return Func()

    wrapper = _hub_wrapped(torch_chunk_gated_delta_rule, chunk_gated_delta_rule)
    modeling = types.ModuleType("some_modeling_with_kernels")
    modeling.torch_chunk_gated_delta_rule = as_module(wrapper)
    ours = _ours("kernel_fun.gdn:chunk_gated_delta_rule")

    def cell():
        return dict(zip(wrapper.__code__.co_freevars, (c.cell_contents for c in wrapper.__closure__)))["implementation"]

    monkeypatch.setitem(sys.modules, "some_modeling_with_kernels", modeling)
    assert ("some_modeling_with_kernels", ["torch_chunk_gated_delta_rule"]) in patch._unnamed_bindings(
        {id(chunk_gated_delta_rule): ours}, set())
    done = kernel_fun.patch_fla(modules=[modeling])
    assert "some_modeling_with_kernels.torch_chunk_gated_delta_rule.<closure implementation>" in done, done
    assert cell() is ours
    kernel_fun.unpatch_fla()
    assert cell() is chunk_gated_delta_rule


def test_the_look_at_imported_modules_is_taken_again_only_after_an_import(monkeypatch):
    """``patch_fla()`` called again with nothing imported since (``patched_fla()`` in a loop) does not
    look through every module again; an import since makes it look."""
    import sys

    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    replaced = {id(chunk_gated_delta_rule): _ours("kernel_fun.gdn:chunk_gated_delta_rule")}
    first = types.ModuleType("some_modeling_first")
    first.op = chunk_gated_delta_rule
    monkeypatch.setitem(sys.modules, "some_modeling_first", first)
    assert ("some_modeling_first", ["op"]) in patch._unnamed_bindings(replaced, frozenset())
    assert patch._unnamed_bindings(replaced, frozenset()) == []  # nothing new: not looked again
    second = types.ModuleType("some_modeling_second")
    second.op = chunk_gated_delta_rule
    monkeypatch.setitem(sys.modules, "some_modeling_second", second)
    found = patch._unnamed_bindings(replaced, frozenset())
    assert ("some_modeling_first", ["op"]) in found and ("some_modeling_second", ["op"]) in found


def test_two_wrapped_ops_under_one_name_are_each_put_back():
    """A function whose closures hold two wrappers of fla's op (each its own ``implementation``
    cell): both cells are rebound and both put back."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    def torch_op(query, key, value, g, beta):
        raise AssertionError("the torch fallback ran")

    a, b = (_hub_wrapped(torch_op, chunk_gated_delta_rule) for _ in range(2))

    def both(*args, **kwargs):
        return a(*args, **kwargs), b(*args, **kwargs)

    modeling = types.ModuleType("some_modeling_two")
    modeling.both = both
    ours = _ours("kernel_fun.gdn:chunk_gated_delta_rule")

    def impl(w):
        return dict(zip(w.__code__.co_freevars, (c.cell_contents for c in w.__closure__)))["implementation"]

    done = kernel_fun.patch_fla(modules=[modeling])
    assert len([d for d in done if d.startswith("some_modeling_two.both.<closure implementation")]) == 2, done
    assert impl(a) is ours and impl(b) is ours
    kernel_fun.unpatch_fla()
    assert impl(a) is chunk_gated_delta_rule and impl(b) is chunk_gated_delta_rule
