"""transformers' Qwen3-Next linear-attention layer (``Qwen3NextGatedDeltaNet``, the most deployed
GDN), built before the patch. transformers 4 imports fla's ``chunk_gated_delta_rule`` into the
modeling file and keeps it on each layer in ``__init__``; transformers 5 wraps it
(``use_kernel_func_from_hub_with_fallback``: a function calling fla's op from its closure, made a
``torch.nn.Module`` by the ``kernels`` package it installs) and the layer calls the module's wrapper.
Either way ``patch_fla(modules=[modeling, layer])`` routes the layer's op through ours; its output
norm is ours too where it is fla's ``FusedRMSNormGated`` (transformers 4). Against the same layer on
transformers' own fp32 torch implementation of the op: the output and every gradient. Skipped where
transformers has no Qwen3-Next (the GPU image carries transformers; CI's CPU venv does not, and on
CPU tensors transformers 5 never calls the package's op).

The same check ran on the CPU with transformers 5.25 (kernels 0.19.1) on 2026-12-05, the wrapper's
device gate opened to CPU tensors by hand (this test, at K=V=64, T=70): our gdn kernels ran
(interpreted); the layer's output within 6.7e-4 of the torch op's, its gradients within 1.3e-2 (A_log;
the others 2.0e-3 and under), fp16."""
import pytest
import torch

import kernel_fun
from kernel_fun._common.numerics import rel_rms
from kernel_fun._common.witness import launch_counts

pytestmark = pytest.mark.gpu


def _layer():
    modeling = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    from transformers.models.qwen3_next.configuration_qwen3_next import Qwen3NextConfig

    if getattr(modeling, "chunk_gated_delta_rule", "absent") is None:
        pytest.skip("transformers did not find fla")
    # two key heads, four value heads (the layer repeats q, k to the value heads before the op), heads
    # of 128 as Qwen3-Next's; silu, the gated norm's activation there
    cfg = Qwen3NextConfig(hidden_size=256, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=128,
                          linear_value_head_dim=128, linear_conv_kernel_dim=4, hidden_act="silu", rms_norm_eps=1e-6)
    torch.manual_seed(0)
    layer = modeling.Qwen3NextGatedDeltaNet(cfg, layer_idx=0).to("cuda", torch.float16)
    return modeling, layer


def _torch_op(op):
    """transformers' fp32 torch op behind ``op``: ``op`` itself (transformers 4), or the
    ``torch_function`` in the closures of transformers 5's wrapper (a function, or a module whose
    ``forward`` calls it)."""
    todo = [op, type(op).__dict__.get("forward")]
    while todo:
        f = todo.pop()
        cells = dict(zip(f.__code__.co_freevars, (c.cell_contents for c in f.__closure__ or ()))) if hasattr(
            f, "__code__") else {}
        if "torch_function" in cells:
            return cells["torch_function"]
        todo += [v for v in cells.values() if hasattr(v, "__code__")]
    return op


def _grads(layer, x):
    x = x.detach().requires_grad_(True)
    out = layer(x)
    out = out[0] if isinstance(out, tuple) else out
    params = [p for p in layer.parameters() if p.requires_grad]
    grads = torch.autograd.grad(out.float().square().mean(), [x] + params)
    return out.detach(), dict(zip(["x"] + [n for n, p in layer.named_parameters() if p.requires_grad], grads))


def test_qwen3_next_layer_built_before_the_patch():
    modeling, layer = _layer()
    wrapper = modeling.torch_chunk_gated_delta_rule
    oracle = _torch_op(wrapper)
    x = torch.randn(2, 300, 256, device="cuda", dtype=torch.float16)
    kernel_fun.unpatch_fla()
    try:
        done = kernel_fun.patch_fla(modules=[modeling, layer])
        assert any("chunk_gated_delta_rule" in d for d in done), done
        before = launch_counts()
        out, ours = _grads(layer, x)
        ran = {k for k, n in launch_counts().items() if n != before.get(k, 0)}
        assert {"gdn.inputs_fwd", "gdn.wy_inverse", "gdn.wy_dqk_bwd", "gdn.inputs_bwd"} <= ran, ran
        if type(layer.norm).__module__.startswith("fla."):  # transformers 4: fla's FusedRMSNormGated
            assert {"gnorm.fwd", "gnorm.bwd"} <= ran, ran
        # the oracle where each transformers calls the op from: the module (5), the layer (4)
        modeling.torch_chunk_gated_delta_rule = oracle
        kept = layer.__dict__.get("chunk_gated_delta_rule")
        if kept is not None:
            layer.chunk_gated_delta_rule = oracle
        try:
            before = launch_counts("gdn.")
            ref_out, ref = _grads(layer, x)
            assert launch_counts("gdn.") == before  # the oracle ran, not ours
        finally:
            modeling.torch_chunk_gated_delta_rule = wrapper
            if kept is not None:
                layer.chunk_gated_delta_rule = kept
    finally:
        kernel_fun.unpatch_fla()
    # An fp16 layer either way (its projections, the op's inputs and output; fp16 rather than bf16 so
    # that rounding stays well under the bound): bounds that tell wiring from rounding (a wrong wiring
    # is O(1) off), not fla's ceilings; the CPU run measured 1.3e-2 at most (A_log). The run prints them.
    errs = {"out": rel_rms(out, ref_out), **{n: rel_rms(g, ref[n]) for n, g in ours.items()}}
    print({n: f"{e:.1e}" for n, e in errs.items()})
    assert errs["out"] < 2e-2 and max(errs.values()) < 5e-2, errs
