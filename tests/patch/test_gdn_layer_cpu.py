"""fla's own ``GatedDeltaNet`` layer, patched, forward and backward on the CPU: our conv (the
layer's fused q/k/v call), gdn and gnorm kernels through the interpreter, each family's launch
witnessed; the layer's output and gradients against the same layer whose chunk_gated_delta_rule
is the fp64 reference (the exact call the layer makes: state_v_first, the gate in the op, beta
sigmoid, the l2norm), dense and with a padding mask; under activation checkpointing; a prefill
with fla's Cache."""
import sys
from pathlib import Path

import family_modules
import pytest
import torch

import kernel_fun
from kernel_fun._common.numerics import rel_rms

sys.path.insert(0, str(Path(__file__).parent))
import layer_checks as L  # noqa: E402


# K = V = 64 (the box's smallest heads), grouped values (HV = 2 H) as Qwen3-Next's layers
CFG = dict(hidden_size=128, num_heads=2, num_v_heads=4, head_dim=64, expand_v=1)
B, T = 1, 40


@pytest.fixture(autouse=True)
def _cpu_tier(monkeypatch, layer_cpu_tier):
    family_modules.load("gdn", "fla_standins").install(monkeypatch)


def _layer(seed=0):
    from fla.layers import GatedDeltaNet

    torch.manual_seed(seed)
    return GatedDeltaNet(**CFG, layer_idx=0).to(torch.float16)


def _input(seed=1, batch=B, tokens=T):
    torch.manual_seed(seed)
    return (torch.randn(batch, tokens, CFG["hidden_size"]) * 0.5).to(torch.float16).requires_grad_(True)


def _swap():
    import fla.layers.gated_deltanet as gdn_layer

    return L.swapped(gdn_layer, "chunk_gated_delta_rule", L.gdn_reference_op)


@pytest.mark.parametrize("padded", [False, True], ids=["dense", "padding_mask"])
def test_gdn_layer_engages_every_family_and_matches_the_reference(padded):
    """Every family engages; the output and each gradient against the layer on the fp64 reference op
    within the one-ulp noise floor (x's gradient is about 1e-2 there, the others up to 8e-3). With a
    padding mask the layer unpads to packed documents: three convs and the op with cu_seqlens."""
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

    before = L.launch_counts()
    out, ours = L.grads(layer, run, x)
    ran = L.launched_since(before)
    assert {"cconv", "gdn", "delta", "gnorm"} <= {k.split(".")[0] for k in ran}, ran
    # the fused q/k/v conv (one call) without packed documents; one conv each with them
    assert ran.get("cconv.fwd", 0) + ran.get("cconv.fwd_tma", 0) == (3 if padded else 1), ran
    L.within_noise_floor(layer, run, x, out, ours, _swap(),
                         {"x", "A_log", "dt_bias", "q_proj.weight", "v_conv1d.weight", "o_norm.weight"})


@pytest.mark.parametrize("reentrant", [False, True])
def test_gdn_layer_under_activation_checkpointing(reentrant):
    """Inside ``torch.utils.checkpoint`` the forward runs again in the backward (torch, non-reentrant,
    checks that it saves the same tensors): the gradients equal those without checkpointing bit for
    bit, and the forward's kernels ran twice, the backward's once."""
    kernel_fun.patch_fla()
    ran = L.checkpointed_equals_plain(_layer(), _input(), reentrant)
    assert ran.get("gdn.inputs_fwd", 0) == 2 and ran.get("gdn.inputs_bwd", 0) == 1, ran


def test_gdn_layer_prefill_with_a_cache():
    """Generation's prefill (``use_cache=True``, fla's ``Cache``; above 64 tokens, the layer's chunk
    mode): our convs (each returning the state fla's module caches) and op run; the output and the
    cached recurrent state (``state_v_first``) against the same layer on the fp64 reference op
    (issue 17's o / final-state ceiling, 5e-3); the conv states are the reference run's, bit for bit
    (the convs are ours in both)."""
    kernel_fun.patch_fla()
    layer = _layer()
    x = _input(seed=2, tokens=80).detach()
    out, state, conv, ran = L.prefill(layer, x)
    assert ran.get("gdn.inputs_fwd", 0) == 1 and ran.get("cconv.fwd", 0) + ran.get("cconv.fwd_tma", 0) == 3, ran
    with _swap():
        ref_out, ref_state, ref_conv, _ = L.prefill(layer, x)
    assert state.shape == ref_state.shape == (1, CFG["num_v_heads"], CFG["head_dim"], CFG["head_dim"])
    assert rel_rms(out, ref_out) < 5e-3
    assert rel_rms(state, ref_state) < 5e-3
    assert all(torch.equal(a, b) for a, b in zip(conv, ref_conv))


def test_gdn_layer_under_inference_mode():
    """Evaluation and generation run under ``torch.inference_mode``: dense and left-padded (packed
    documents, cu_seqlens made there), bitwise the output of ``torch.no_grad``, every family ours."""
    kernel_fun.patch_fla()
    layer = _layer()
    x = _input(batch=2).detach()
    mask = torch.ones(2, T, dtype=torch.long)
    mask[1, :15] = 0
    for m in (None, mask):
        assert {"cconv", "gdn", "delta", "gnorm"} <= L.inference_mode_matches_no_grad(layer, x, m)


def test_gdn_layer_at_fla_default_heads_engages():
    """fla's default GatedDeltaNet heads (head_dim 256, expand_v 2: K = 256, V = 512, what
    ``GatedDeltaNetConfig`` builds): our gdn runs, the output and gradients within the noise floor of
    the same layer on the fp64 reference op."""
    kernel_fun.patch_fla()
    torch.manual_seed(0)
    from fla.layers import GatedDeltaNet

    layer = GatedDeltaNet(hidden_size=128, num_heads=1, head_dim=256, expand_v=2, layer_idx=0).to(torch.float16)
    x = _input()

    def run(h):
        return layer(h)[0]

    before = L.launch_counts()
    out, ours = L.grads(layer, run, x)
    ran = L.launched_since(before)
    assert ran.get("gdn.inputs_fwd", 0) == 1 and ran.get("delta.state_scan_bwd", 0) == 1, ran
    L.within_noise_floor(layer, run, x, out, ours, _swap(), {"x", "A_log", "dt_bias", "q_proj.weight"})
