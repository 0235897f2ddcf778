"""fla's own ``GatedDeltaNet`` layer, patched, forward and backward on the CPU: our conv (the
layer's fused q/k/v call), gdn and gnorm kernels through the interpreter (fla's remaining gdn
stage, the kkt + solve kernel, as the plain-torch stand-in of tests/gdn), each family's launch
witnessed; the layer's output and gradients against the same layer whose chunk_gated_delta_rule
is the fp64 reference (the exact call the layer makes: state_v_first, the gate in the op, beta
sigmoid, the l2norm); and the layer under activation checkpointing."""
import importlib.util
from pathlib import Path

import pytest
import torch

import kernel_fun
from kernel_fun._common.numerics import rel_rms
from kernel_fun._common.witness import launch_counts


def _standins():
    # tests/gdn's stand-ins, under the name tests/gdn/conftest.py gives them (tests/kda has a
    # module of the same file name)
    import sys

    if "gdn_fla_standins" not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            "gdn_fla_standins", Path(__file__).parents[1] / "gdn" / "fla_standins.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["gdn_fla_standins"] = mod
        spec.loader.exec_module(mod)
    return sys.modules["gdn_fla_standins"]


# K = V = 64 (the box's smallest heads), grouped values (HV = 2 H) as Qwen3-Next's layers
CFG = dict(hidden_size=128, num_heads=2, num_v_heads=4, head_dim=64, expand_v=1)
B, T = 1, 40


@pytest.fixture(autouse=True)
def _cpu_tier(monkeypatch, layer_cpu_tier):
    _standins().install(monkeypatch)


def _layer(seed=0):
    from fla.layers import GatedDeltaNet

    torch.manual_seed(seed)
    return GatedDeltaNet(**CFG, layer_idx=0).to(torch.float16)


def _grads(layer, run, x):
    leaves = [x] + list(layer.parameters())
    for t in leaves:
        t.grad = None
    out = run(x)
    out.float().square().mean().backward()
    return out.detach(), [None if t.grad is None else t.grad.clone() for t in leaves]


def _input(seed=1, batch=B):
    torch.manual_seed(seed)
    return (torch.randn(batch, T, CFG["hidden_size"]) * 0.5).to(torch.float16).requires_grad_(True)


@pytest.mark.parametrize("padded", [False, True], ids=["dense", "padding_mask"])
def test_gdn_layer_engages_every_family_and_matches_the_reference(padded):
    """Ours against the layer on the fp64 reference op, each gradient held to the noise floor: the
    reference layer's own move when its input moves by one fp16 ulp (fp16 projections and the conv
    and norm around the op round alike in both; x's gradient is about 1e-2 there, the others up to 8e-3).
    With a padding mask the layer unpads to packed documents: three convs and the op with cu_seqlens."""
    import fla.layers.gated_deltanet as gdn_layer

    from kernel_fun.gdn.reference import chunk_gated_delta_rule_ref

    x = _input(batch=2 if padded else B)
    mask = None
    if padded:  # the second sequence is 23 tokens long, left-aligned
        mask = torch.ones(2, T, dtype=torch.long)
        mask[1, 23:] = 0
    kernel_fun.patch_fla()
    layer = _layer()

    def run(h):
        o = layer(h, attention_mask=mask)[0]
        return o if mask is None else o * mask[..., None]  # padded rows carry no loss

    before = launch_counts()
    out, grads = _grads(layer, run, x)
    ran = {k: n - before.get(k, 0) for k, n in launch_counts().items() if n != before.get(k, 0)}
    assert {"cconv", "gdn", "delta", "gnorm"} <= {k.split(".")[0] for k in ran}, ran
    # the fused q/k/v conv (one call) without packed documents; one conv each with them
    assert ran.get("cconv.fwd", 0) + ran.get("cconv.fwd_tma", 0) == (3 if padded else 1), ran

    def reference(**kw):
        o, ht = chunk_gated_delta_rule_ref(**kw)
        return o.to(kw["q"].dtype), ht

    ours = gdn_layer.chunk_gated_delta_rule
    gdn_layer.chunk_gated_delta_rule = reference  # conv and norm stay ours
    try:
        ref_out, ref_grads = _grads(layer, run, x)
        x_ulp = (x.detach().view(torch.int16) + 1).view(torch.float16).requires_grad_(True)
        _, ulp_grads = _grads(layer, run, x_ulp)
    finally:
        gdn_layer.chunk_gated_delta_rule = ours
    assert rel_rms(out, ref_out) < 5e-3
    names = ["x"] + [n for n, _ in layer.named_parameters()]
    rows = {n: (rel_rms(a, b), rel_rms(u, b)) for n, a, b, u in zip(names, grads, ref_grads, ulp_grads) if b is not None}
    print({n: f"{e:.2e} (floor {f:.2e})" for n, (e, f) in rows.items()})
    assert set(rows) >= {"x", "A_log", "dt_bias", "q_proj.weight", "v_conv1d.weight", "o_norm.weight"}
    bad = {n: r for n, r in rows.items() if not r[0] <= max(1.5 * r[1], 1e-3)}
    assert not bad, rows


@pytest.mark.parametrize("reentrant", [False, True])
def test_gdn_layer_under_activation_checkpointing(reentrant):
    """Inside ``torch.utils.checkpoint`` the forward runs again in the backward (torch, non-reentrant,
    checks that it saves the same tensors): the gradients equal those without checkpointing bit for
    bit, and the forward's kernels ran twice, the backward's once."""
    from torch.utils.checkpoint import checkpoint

    x = _input()
    kernel_fun.patch_fla()
    layer = _layer()
    out, ref = _grads(layer, lambda h: layer(h)[0], x)
    before = launch_counts()
    ck_out, ck = _grads(layer, lambda h: checkpoint(lambda u: layer(u)[0], h, use_reentrant=reentrant), x)
    ran = {k: n - before.get(k, 0) for k, n in launch_counts().items() if n != before.get(k, 0)}
    assert ran.get("gdn.inputs_fwd", 0) == 2 and ran.get("gdn.inputs_bwd", 0) == 1, ran
    assert torch.equal(out, ck_out)
    for a, b in zip(ref, ck):
        assert (a is None and b is None) or torch.equal(a, b)


def test_gdn_layer_prefill_with_a_cache():
    """Generation's prefill: the layer in eval mode without gradients, ``use_cache=True`` with fla's
    ``Cache`` (the op's final state in the layer's ``state_v_first`` layout, the convs' final
    states): our convs and op run; the output and the cached recurrent state against the same layer
    on the fp64 reference op (issue 17's o / final-state ceiling, 5e-3); the conv states are the
    ones the reference run caches, bit for bit (the convs are ours in both)."""
    import fla.layers.gated_deltanet as gdn_layer
    from fla.models.cache_utils import Cache

    from kernel_fun.gdn.reference import chunk_gated_delta_rule_ref

    kernel_fun.patch_fla()
    layer = _layer().eval()
    T_prefill = 80  # above 64: the layer's chunk mode (shorter prompts take fla's fused_recurrent)
    torch.manual_seed(2)
    x = (torch.randn(1, T_prefill, CFG["hidden_size"]) * 0.5).to(torch.float16)

    def prefill():
        cache = Cache()
        with torch.no_grad():
            out = layer(x, past_key_values=cache, use_cache=True)[0]
        return out, cache[0]["recurrent_state"], cache[0]["conv_state"]

    before = launch_counts()
    out, state, conv = prefill()
    ran = {k: n - before.get(k, 0) for k, n in launch_counts().items() if n != before.get(k, 0)}
    assert ran.get("gdn.inputs_fwd", 0) == 1 and ran.get("cconv.fwd", 0) + ran.get("cconv.fwd_tma", 0) == 3, ran

    def reference(**kw):
        o, ht = chunk_gated_delta_rule_ref(**kw)
        return o.to(kw["q"].dtype), ht.float()

    ours = gdn_layer.chunk_gated_delta_rule
    gdn_layer.chunk_gated_delta_rule = reference
    try:
        ref_out, ref_state, ref_conv = prefill()
    finally:
        gdn_layer.chunk_gated_delta_rule = ours
    assert state.shape == ref_state.shape == (1, CFG["num_v_heads"], CFG["head_dim"], CFG["head_dim"])
    assert rel_rms(out, ref_out) < 5e-3
    assert rel_rms(state, ref_state) < 5e-3
    assert all(torch.equal(a, b) for a, b in zip(conv, ref_conv))
