"""fla's ``MomAttention`` (Mixture-of-Memories: a gated delta rule per memory over the tokens its
router sends there, packed as documents), patched, forward and backward on the CPU. Its module
binds fla's ``chunk_gated_delta_rule`` at import, as ``fla.layers.gated_deltanet`` does, and calls it
with the gate precomputed, beta activated, the l2norm in the op, ``state_v_first`` and ``cu_seqlens``:
in our box at head_dim 64 or 128 (its default, 256, is routed to fla with the reason logged). Our
conv, gdn and gnorm kernels run through the interpreter; the output and gradients against the same
layer whose op is the fp64 reference."""
import sys
from pathlib import Path

import family_modules
import pytest
import torch

import kernel_fun

sys.path.insert(0, str(Path(__file__).parent))
import layer_checks as L  # noqa: E402

CFG = dict(hidden_size=128, head_dim=64, num_heads=2, expand_v=1, num_memories=4, topk=2)


@pytest.fixture(autouse=True)
def _cpu_tier(monkeypatch, layer_cpu_tier):
    family_modules.load("gdn", "fla_standins").install(monkeypatch)


def _layer():
    import fla.layers.mom as mom

    torch.manual_seed(0)
    layer = mom.MomAttention(**CFG, layer_idx=0)
    with torch.no_grad():  # the layer's own init (gain 2^-2.5) leaves fp16 gradients below its range here
        for p in layer.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.15)
    return layer.to(torch.float16)


def test_mom_layer_is_patched_engages_every_family_and_matches_the_reference():
    import fla.layers.mom as mom

    done = kernel_fun.patch_fla()
    assert "fla.layers.mom.chunk_gated_delta_rule" in done
    layer = _layer().train()
    torch.manual_seed(1)
    x = (torch.randn(2, 40, CFG["hidden_size"]) * 0.5).to(torch.float16).requires_grad_(True)

    def run(h):
        return layer(h)[0]

    before = L.launch_counts()
    out, ours = L.grads(layer, run, x)
    ran = L.launched_since(before)
    assert {"cconv", "gdn", "delta", "gnorm"} <= {k.split(".")[0] for k in ran}, ran
    assert ran.get("gdn.inputs_fwd", 0) == 1 and ran.get("gdn.inputs_bwd", 0) == 1, ran
    L.within_noise_floor(layer, run, x, out, ours, L.swapped(mom, "chunk_gated_delta_rule", L.gdn_reference_op),
                         {"x", "A_log", "dt_bias", "q_proj.weight", "o_norm.weight"})
    kernel_fun.unpatch_fla()
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    assert mom.chunk_gated_delta_rule is chunk_gated_delta_rule


def test_mom_layer_prefill_with_a_cache():
    """Generation's prefill (``use_cache=True``, fla's ``Cache``, above 64 tokens: chunk mode): our op
    returns each memory's final state (``output_final_state`` over the memories' packed tokens); the
    output and the cached states against the same layer on the fp64 reference op (issue 17's o /
    final-state ceiling, 5e-3)."""
    import fla.layers.mom as mom

    from kernel_fun._common.numerics import rel_rms

    kernel_fun.patch_fla()
    layer = _layer()
    torch.manual_seed(2)
    x = (torch.randn(1, 80, CFG["hidden_size"]) * 0.5).to(torch.float16)
    out, states, _, ran = L.prefill(layer, x)
    assert ran.get("gdn.inputs_fwd", 0) == 1 and ran.get("delta.state_scan_fwd", 0) == 1, ran
    with L.swapped(mom, "chunk_gated_delta_rule", L.gdn_reference_op):
        ref_out, ref_states, _, _ = L.prefill(layer, x)
    assert states[0].shape == ref_states[0].shape == (CFG["num_memories"], CFG["num_heads"], 64, 64)
    assert rel_rms(out, ref_out) < 5e-3
    assert rel_rms(states[0], ref_states[0]) < 5e-3
