"""fla's own ``KimiDeltaAttention`` layer, patched, forward and backward on the CPU: our conv,
kda and gnorm kernels through the interpreter (fla's remaining kda stages as the plain-torch
stand-ins of tests/kda), each family's launch witnessed, built before and after the patch; and
the layer's output and gradients with our chunk_kda against the same layer whose chunk_kda is
the fp64 reference (the exact call the layer makes: state_v_first, the gate, beta sigmoid), dense
and with a padding mask; under activation checkpointing; a prefill with fla's Cache."""
import sys
from pathlib import Path

import pytest
import torch

import kernel_fun
from kernel_fun._common.witness import launch_counts

sys.path.insert(0, str(Path(__file__).parents[1] / "kda"))
sys.path.insert(0, str(Path(__file__).parent))
import fla_standins  # noqa: E402
import layer_checks as L  # noqa: E402

CFG = dict(hidden_size=128, num_heads=2, head_dim=64)  # K = V = 64: the box's smallest heads
B, T = 1, 40


@pytest.fixture(autouse=True)
def _cpu_tier(monkeypatch, layer_cpu_tier):
    fla_standins.install(monkeypatch)


def _layer(seed=0):
    from fla.layers import KimiDeltaAttention

    torch.manual_seed(seed)
    return KimiDeltaAttention(**CFG, layer_idx=0).to(torch.float16)


def _step(layer, x):
    out = layer(x)[0]
    grads = torch.autograd.grad(out.float().square().mean(), [x] + list(layer.parameters()), allow_unused=True)
    return out, grads


@pytest.mark.parametrize("order", ["built_before_patch", "built_after_patch"])
def test_kda_layer_engages_every_family(order):
    x = (torch.randn(B, T, CFG["hidden_size"]) * 0.5).to(torch.float16).requires_grad_(True)
    if order == "built_before_patch":
        layer = _layer()
        kernel_fun.patch_fla()
    else:
        kernel_fun.patch_fla()
        layer = _layer()
    before = launch_counts()
    out, grads = _step(layer, x)
    ran = {k: n - before.get(k, 0) for k, n in launch_counts().items() if n != before.get(k, 0)}
    fams = {k.split(".")[0] for k in ran}
    assert {"cconv", "kda", "delta", "gnorm"} <= fams, ran
    assert torch.isfinite(out).all() and all(g is None or torch.isfinite(g).all() for g in grads)


def _reference_chunk_kda(q, k, v, g, beta, A_log=None, dt_bias=None, initial_state=None,
                         output_final_state=False, use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                         use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, safe_gate=False,
                         lower_bound=None, state_v_first=False, cu_seqlens=None, **kw):
    from kernel_fun.kda.reference import chunk_kda_ref

    assert not kw and not safe_gate and lower_bound is None and initial_state is None
    o, ht = chunk_kda_ref(q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, output_final_state=output_final_state,
                          use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, use_gate_in_kernel=use_gate_in_kernel,
                          use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval,
                          cu_seqlens=cu_seqlens)
    return o.to(q.dtype), (None if ht is None else ht.transpose(-1, -2) if state_v_first else ht)


def test_kda_layer_matches_the_layer_on_the_reference():
    import fla.layers.kda as kda_layer

    from kernel_fun._common.numerics import rel_rms

    x = (torch.randn(B, T, CFG["hidden_size"]) * 0.5).to(torch.float16).requires_grad_(True)
    kernel_fun.patch_fla()
    layer = _layer()
    out, grads = _step(layer, x)
    ours = kda_layer.chunk_kda
    kda_layer.chunk_kda = _reference_chunk_kda  # conv and norm stay ours (by hand: see _cpu_tier)
    try:
        ref_out, ref_grads = _step(layer, x)
    finally:
        kda_layer.chunk_kda = ours
    assert rel_rms(out, ref_out) < 5e-3
    names = ["x"] + [n for n, _ in layer.named_parameters()]
    errs = {n: rel_rms(a, b) for n, a, b in zip(names, grads, ref_grads) if b is not None}
    assert set(errs) >= {"x", "A_log", "dt_bias", "q_proj.weight", "q_conv1d.weight", "o_norm.weight"}
    bad = {n: e for n, e in errs.items() if not e < 1e-2}
    assert not bad, errs


def _swap():
    import fla.layers.kda as kda_layer

    return L.swapped(kda_layer, "chunk_kda", _reference_chunk_kda)


def test_kda_layer_with_a_padding_mask_matches_the_reference():
    """With a padding mask the layer packs the batch into documents (cu_seqlens through the convs
    and the op): ours against the layer on the fp64 reference op, each gradient held to the one-ulp
    noise floor."""
    torch.manual_seed(1)
    x = (torch.randn(2, T, CFG["hidden_size"]) * 0.5).to(torch.float16).requires_grad_(True)
    mask = torch.ones(2, T, dtype=torch.long)
    mask[1, 23:] = 0
    kernel_fun.patch_fla()
    layer = _layer()

    def run(h):
        return layer(h, attention_mask=mask)[0] * mask[..., None]  # padded rows carry no loss

    before = launch_counts()
    out, ours = L.grads(layer, run, x)
    assert L.launched_since(before).get("kda.wy_bwd", 0) == 1
    L.within_noise_floor(layer, run, x, out, ours, _swap(),
                         {"x", "A_log", "dt_bias", "q_proj.weight", "q_conv1d.weight", "o_norm.weight"})


@pytest.mark.parametrize("reentrant", [False, True])
def test_kda_layer_under_activation_checkpointing(reentrant):
    """The patched layer inside ``torch.utils.checkpoint`` (what gradient checkpointing in training
    code does): the forward runs again in the backward, and torch (non-reentrant) checks that it
    saves the same tensors; the gradients equal those without checkpointing bit for bit (same
    kernels, same inputs), the forward's kernels ran twice, the backward's once."""
    x = (torch.randn(B, T, CFG["hidden_size"]) * 0.5).to(torch.float16).requires_grad_(True)
    kernel_fun.patch_fla()
    ran = L.checkpointed_equals_plain(_layer(), x, reentrant)
    assert ran.get("kda.wy_bwd", 0) == 1 and ran.get("gnorm.fwd", 0) == 2, ran


def test_kda_layer_prefill_with_a_cache():
    """Generation's prefill (``use_cache=True``, fla's ``Cache``; above 64 tokens, the layer's chunk
    mode): our convs (each returning the state fla's module caches) and our kda run; the output and
    the cached recurrent state (``state_v_first``) against the same layer on the fp64 reference op."""
    from kernel_fun._common.numerics import rel_rms

    kernel_fun.patch_fla()
    layer = _layer()
    torch.manual_seed(2)
    x = (torch.randn(1, 80, CFG["hidden_size"]) * 0.5).to(torch.float16)
    out, state, conv, ran = L.prefill(layer, x)
    # kda's forward: fla's intra stage (a stand-in here), then our state scan, which makes o
    assert ran.get("cconv.fwd", 0) + ran.get("cconv.fwd_tma", 0) == 3 and ran.get("delta.state_scan_fwd", 0) == 1, ran
    with _swap():
        ref_out, ref_state, ref_conv, _ = L.prefill(layer, x)
    assert rel_rms(out, ref_out) < 5e-3
    assert state.shape == ref_state.shape and rel_rms(state, ref_state.float()) < 5e-3
    assert all(c is not None and torch.equal(a, c) for a, c in zip(conv, ref_conv))


def test_kda_layer_under_inference_mode():
    """Evaluation and generation run under ``torch.inference_mode``: dense and left-padded (packed
    documents, cu_seqlens made there), bitwise the output of ``torch.no_grad``, every family ours."""
    kernel_fun.patch_fla()
    layer = _layer()
    x = (torch.randn(2, T, CFG["hidden_size"]) * 0.5).to(torch.float16)
    mask = torch.ones(2, T, dtype=torch.long)
    mask[1, :15] = 0
    for m in (None, mask):
        assert {"cconv", "delta", "gnorm"} <= L.inference_mode_matches_no_grad(layer, x, m)
