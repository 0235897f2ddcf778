"""fla's own ``KimiDeltaAttention`` layer, patched, forward and backward on the CPU: our conv,
kda and gnorm kernels through the interpreter (fla's remaining kda stages as the plain-torch
stand-ins of tests/kda), each family's launch witnessed, built before and after the patch; and
the layer's output and gradients with our chunk_kda against the same layer whose chunk_kda is
the fp64 reference (the exact call the layer makes: state_v_first, the gate, beta sigmoid)."""
import sys
from pathlib import Path

import pytest
import torch

import kernel_fun
from kernel_fun._common.witness import launch_counts

sys.path.insert(0, str(Path(__file__).parents[1] / "kda"))
import fla_standins  # noqa: E402

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


def test_kda_layer_with_a_padding_mask_matches_the_reference():
    """With a padding mask the layer packs the batch into documents (cu_seqlens through the convs
    and the op): ours against the layer on the fp64 reference op, each gradient held to the noise
    floor, the reference layer's own move for a one-ulp move of its fp16 input."""
    import fla.layers.kda as kda_layer

    from kernel_fun._common.numerics import rel_rms

    torch.manual_seed(1)
    x = (torch.randn(2, T, CFG["hidden_size"]) * 0.5).to(torch.float16).requires_grad_(True)
    mask = torch.ones(2, T, dtype=torch.long)
    mask[1, 23:] = 0
    kernel_fun.patch_fla()
    layer = _layer()

    def grads(h):
        leaves = [h] + list(layer.parameters())
        for t in leaves:
            t.grad = None
        out = layer(h, attention_mask=mask)[0] * mask[..., None]  # padded rows carry no loss
        out.float().square().mean().backward()
        return out.detach(), [None if t.grad is None else t.grad.clone() for t in leaves]

    before = launch_counts()
    out, ours_g = grads(x)
    assert launch_counts().get("kda.wy_bwd", 0) > before.get("kda.wy_bwd", 0)
    ours = kda_layer.chunk_kda
    kda_layer.chunk_kda = _reference_chunk_kda
    try:
        ref_out, ref_g = grads(x)
        _, ulp_g = grads((x.detach().view(torch.int16) + 1).view(torch.float16).requires_grad_(True))
    finally:
        kda_layer.chunk_kda = ours
    assert rel_rms(out, ref_out) < 5e-3
    names = ["x"] + [n for n, _ in layer.named_parameters()]
    rows = {n: (rel_rms(a, b), rel_rms(u, b)) for n, a, b, u in zip(names, ours_g, ref_g, ulp_g) if b is not None}
    print({n: f"{e:.2e} (floor {f:.2e})" for n, (e, f) in rows.items()})
    assert set(rows) >= {"x", "A_log", "dt_bias", "q_proj.weight", "q_conv1d.weight", "o_norm.weight"}
    bad = {n: r for n, r in rows.items() if not r[0] <= max(1.5 * r[1], 1e-3)}
    assert not bad, rows


@pytest.mark.parametrize("reentrant", [False, True])
def test_kda_layer_under_activation_checkpointing(reentrant):
    """The patched layer inside ``torch.utils.checkpoint`` (what gradient checkpointing in training
    code does): the forward runs again in the backward, and torch (non-reentrant) checks that it
    saves the same tensors; the gradients equal those without checkpointing bit for bit (same
    kernels, same inputs), and every family ran in the recompute too."""
    from torch.utils.checkpoint import checkpoint

    x = (torch.randn(B, T, CFG["hidden_size"]) * 0.5).to(torch.float16).requires_grad_(True)
    kernel_fun.patch_fla()
    layer = _layer()
    leaves = [x] + list(layer.parameters())

    def grads(run):
        for t in leaves:
            t.grad = None
        out = run(x)
        out.float().square().mean().backward()
        return out.detach(), [None if t.grad is None else t.grad.clone() for t in leaves]

    out, ref = grads(lambda h: layer(h)[0])
    before = launch_counts()
    ck_out, ck = grads(lambda h: checkpoint(lambda u: layer(u)[0], h, use_reentrant=reentrant))
    ran = {k: n - before.get(k, 0) for k, n in launch_counts().items() if n != before.get(k, 0)}
    # the forward twice (the checkpointed pass, then the recompute in the backward), one backward
    assert ran.get("kda.wy_bwd", 0) == 1 and ran.get("gnorm.fwd", 0) == 2, ran
    assert torch.equal(out, ck_out)
    for a, b in zip(ref, ck):
        assert (a is None and b is None) or torch.equal(a, b)


def test_kda_layer_prefill_with_a_cache():
    """Generation's prefill: eval mode without gradients, ``use_cache=True`` with fla's ``Cache``:
    our convs (each returning the state fla's module caches) and our kda run; the output and the
    cached recurrent state (``state_v_first``) against the same layer on the fp64 reference op."""
    import fla.layers.kda as kda_layer
    from fla.models.cache_utils import Cache

    from kernel_fun._common.numerics import rel_rms

    kernel_fun.patch_fla()
    layer = _layer().eval()
    torch.manual_seed(2)
    x = (torch.randn(1, 80, CFG["hidden_size"]) * 0.5).to(torch.float16)  # > 64 tokens: chunk mode

    def prefill():
        cache = Cache()
        with torch.no_grad():
            out = layer(x, past_key_values=cache, use_cache=True)[0]
        return out, cache[0]["recurrent_state"], cache[0]["conv_state"]

    before = launch_counts()
    out, state, conv = prefill()
    ran = {k: n - before.get(k, 0) for k, n in launch_counts().items() if n != before.get(k, 0)}
    assert ran.get("cconv.fwd", 0) + ran.get("cconv.fwd_tma", 0) == 3 and any(k.startswith("kda.") or k.startswith("delta.") for k in ran), ran
    ours = kda_layer.chunk_kda
    kda_layer.chunk_kda = _reference_chunk_kda
    try:
        ref_out, ref_state, ref_conv = prefill()
    finally:
        kda_layer.chunk_kda = ours
    assert rel_rms(out, ref_out) < 5e-3
    assert state.shape == ref_state.shape and rel_rms(state, ref_state.float()) < 5e-3
    assert all(c is not None and torch.equal(a, c) for a, c in zip(conv, ref_conv))
