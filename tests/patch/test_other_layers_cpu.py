"""``patch_fla()`` reaches fla's other layers too: every layer of fla 0.6.0 that builds a
``ShortConvolution`` or a ``FusedRMSNormGated`` (GLA, DeltaNet, Comba, HGRN, RetNet, MesaNet, ...;
20 of them) calls our conv and norm through the two names the patch rebinds. Here each is trained
one step on the CPU, fp32, and checked: every conv and norm module it calls ran our kernels (the
launch witness against forward hooks counting the calls), and its output and every gradient equal
those of the same layer whose conv and norm are the plain-torch fp64 references of fla's functions.

fla's kernels do not run on the CPU, so the layer's own recurrence (``chunk_gla``, ``chunk_delta_rule``,
...) is replaced by a small differentiable stand-in in both arms, and so are fla's other Triton
helpers a layer calls (``RMSNorm``, rotary embeddings, ``l2_norm``, ``swish``, ``swiglu``, the norm +
linear fusions, the KDA gate). What is compared is the conv and the norm, in the exact calls each
layer makes. KimiDeltaAttention, GatedDeltaNet and MomAttention, whose recurrences are ours too, have
their own tests (test_layers_cpu.py, test_gdn_layer_cpu.py, test_mom_layer_cpu.py).
"""
import functools
import re
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import kernel_fun
from kernel_fun._common.numerics import rel_rms
from kernel_fun._common.witness import launch_counts

sys.path.insert(0, str(Path(__file__).parent))
import layer_checks as L  # noqa: E402

HIDDEN, T = 64, 40  # small: the interpreter's time is CI's (the ops' own tests cross their tiles)
# Ours against the fp64 references, per gradient: within FLOOR_FACTOR of the plain fp32 torch layer's
# distance from them, or 1e-5. At T = 40 every gradient is within 6.7e-6; at T = 70 (2026-12-05) a few sat
# far from fp64 in any fp32 arithmetic: PrecondGatedDeltaNet's A_log and dt_bias 1.2e-5 ours, 2.8e-6 fp32
# torch; with a padded batch its A_log_atk (2.8e-6 of norm, summed with cancellation) 1.7e-4 ours, 4.8e-5
# fp32 torch, each of our two ops alone level with its fp32 torch form there (conv 3.5e-5 / 3.5e-5, norm
# 1.1e-4 / 1.0e-4).
FLOOR_FACTOR = 8.0
# The layers' own tests (their recurrences are ours as well)
OWN_TESTS = {"KimiDeltaAttention", "GatedDeltaNet", "MomAttention"}
# Constructor arguments (every one also takes layer_idx): small heads; the short conv turned on where
# the layer has the switch (several default it off).
BUILD = {
    "ABCAttention": dict(num_heads=2, use_short_conv=True),
    "Comba": dict(num_heads=2, head_dim=32, use_short_conv=True),
    "CyclicFlowAttention": dict(num_heads=2, head_dim=32, use_short_conv=True),
    "DeltaNet": dict(num_heads=2, use_short_conv=True),
    "GatedDeltaNet2": dict(num_heads=2, head_dim=32, use_short_conv=True),
    "GatedDeltaProduct": dict(num_heads=2, head_dim=32, use_short_conv=True),
    "GatedLinearAttention": dict(num_heads=2, use_short_conv=True, use_output_gate=True),
    "GatedSlotAttention": dict(num_heads=2, use_short_conv=True),
    "HGRNAttention": dict(use_short_conv=True),
    "LightNetAttention": dict(num_heads=2, use_short_conv=True),
    "MesaNet": dict(num_heads=2, head_dim=32, use_short_conv=True),
    "MomentumDeltaNet": dict(num_heads=2, head_dim=32, use_short_conv=True),
    "MultiScaleRetention": dict(num_heads=2, use_short_conv=True),
    "PaTHAttention": dict(num_heads=2),
    "PrecondGatedDeltaNet": dict(num_heads=2, head_dim=32, use_short_conv=True),
    "PrecondKDA": dict(num_heads=2, head_dim=32, use_short_conv=True),
    "RodimusAttention": dict(use_short_conv=True),
    "YOCOGatedRetention": dict(num_heads=2),
}
# A recurrence's name in its layer's module; what the stand-in returns besides o, where not one state
CORE = re.compile(r"^(chunk_|fused_chunk_|fused_recurrent_|parallel_|naive_recurrent_)")
EXTRA = {"chunk_mesa_net": 2, "chunk_precond_gated_delta_rule": 2, "chunk_precond_kda": 2}


@pytest.fixture(autouse=True)
def _cpu_tier(layer_cpu_tier):
    yield


def _recurrence(name):
    """A stand-in for a layer's recurrence: o of v's shape, v shifted per token by a function of q, k
    and every other tensor the call passes (so that each conv output in the call gets a gradient; a
    per-token scale would not do: the layers' output norms take it out)."""
    def standin(*args, **kw):
        ts = [a for a in args if isinstance(a, torch.Tensor)]
        q = kw.get("q", ts[0] if ts else kw.get("x"))
        v = kw.get("v", ts[2] if len(ts) > 2 else q)
        T = q.shape[1]
        c = 0
        for t in ts + [t for t in kw.values() if isinstance(t, torch.Tensor)]:
            if t.is_floating_point() and t.dim() >= 3 and t.shape[0] == q.shape[0] and t.shape[1] % T == 0:
                t = t.unflatten(1, (T, -1))[:, :, 0]  # GatedDeltaProduct: num_householder keys a token
                c = c + torch.tanh(t.float().flatten(2).mean(-1))
        if v.shape[1] != T:
            v = v.unflatten(1, (T, -1))[:, :, 0]
        while c.dim() < v.dim():
            c = c.unsqueeze(-1)
        o = (v.float() + c).to(v.dtype)
        if name.endswith("lightnet"):
            return o, (None, None)
        return (o,) + (None,) * EXTRA.get(name, 1)
    return standin


def _kda_gate(g, A_log=None, dt_bias=None, lower_bound=None, output_dtype=torch.float32):
    """fla's ``fused_kda_gate`` in torch (its docstring's two forms)."""
    x = g.float() + (0 if dt_bias is None else dt_bias.float().view(g.shape[-2:]))
    a = A_log.float().exp().unsqueeze(-1)
    out = lower_bound * torch.sigmoid(a * x) if lower_bound is not None else -a * F.softplus(x)
    return out.to(output_dtype)


def _rms(x, weight=None, eps=1e-6):
    y = x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps).to(x.dtype)
    return y if weight is None else y * weight


# fla's Triton helpers, by the name a layer module binds: torch stand-ins (both arms)
HELPERS = {
    "swish": F.silu,
    "swiglu": lambda x, y: F.silu(x) * y,
    "l2_norm": lambda x, *a, **k: F.normalize(x, dim=-1),
    "rotary_embedding": lambda x, *a, **k: x,
    "rms_norm_linear": lambda x, norm_weight, norm_bias, linear_weight, linear_bias=None, *a, **k: F.linear(
        _rms(x, norm_weight), linear_weight, linear_bias),
    "rms_norm_swish_gate_linear": lambda x, o, norm_weight, norm_bias, linear_weight, linear_bias=None, *a, **k:
        F.linear(_rms(x, norm_weight) * F.silu(o), linear_weight, linear_bias),
    "fused_kda_gate": _kda_gate,
}


def _standins(monkeypatch, layer_module):
    """The layer's recurrences and fla's Triton helpers replaced by torch stand-ins (in both arms)."""
    import fla.modules.feature_map
    from fla.modules import RMSNorm, RotaryEmbedding

    for name, fn in list(vars(layer_module).items()):
        if callable(fn) and str(getattr(fn, "__module__", "")).startswith("fla.ops") and CORE.match(name):
            monkeypatch.setattr(layer_module, name, _recurrence(name))
    for module in (layer_module, fla.modules.feature_map):  # GatedSlotAttention's feature map calls swish
        for name in set(vars(module)) & set(HELPERS):
            monkeypatch.setattr(module, name, HELPERS[name])
    monkeypatch.setattr(RMSNorm, "forward", lambda self, x, *a, **k: _rms(x, self.weight, self.eps))
    monkeypatch.setattr(RotaryEmbedding, "forward", lambda self, q, k, *a, **kw: (q, k))


def _conv_ref(x, weight=None, bias=None, residual=None, initial_state=None, output_final_state=False,
              activation=None, backend=None, cu_seqlens=None, chunk_indices=None, dtype=torch.float64, **kw):
    """fla's ``causal_conv1d`` on the reference (fp64; ``dtype`` float32 for the floor arm), for the calls
    these layers make in training."""
    from kernel_fun.cconv.reference import conv_ref

    assert residual is None and initial_state is None and not output_final_state and not kw
    y = conv_ref(x, weight, bias, silu=activation in ("silu", "swish"), cu_seqlens=cu_seqlens, dtype=dtype)
    return y.to(x.dtype), None


def _norm_ref(x, g, weight=None, bias=None, activation="swish", residual=None, prenorm=False,
              residual_in_fp32=False, eps=1e-6, dtype=torch.float64):
    """fla's ``rms_norm_gated`` on the reference (fp64; ``dtype`` float32 for the floor arm; no residual
    in these layers' calls)."""
    from kernel_fun.gnorm.reference import rms_norm_gated_ref

    assert residual is None and not prenorm
    return rms_norm_gated_ref(x, g, weight, bias, activation, None, False, eps, dtype=dtype).to(x.dtype)


def _build(name, seed=0):
    import fla.layers

    torch.manual_seed(seed)
    return getattr(fla.layers, name)(hidden_size=HIDDEN, **BUILD[name], layer_idx=0).float()


def _calls(layer):
    """Forward hooks counting the calls of the layer's conv and norm modules."""
    from fla.modules import FusedRMSNormGated, ShortConvolution

    counts = {"cconv": 0, "gnorm": 0}
    handles = []
    for m in layer.modules():
        fam = "cconv" if isinstance(m, ShortConvolution) else "gnorm" if isinstance(m, FusedRMSNormGated) else None
        if fam:
            handles.append(m.register_forward_hook(lambda *a, fam=fam: counts.__setitem__(fam, counts[fam] + 1)))
    return counts, handles


# The padded batch on a few layers (every layer unpads through fla's one helper; the interpreter's
# time is the CI's: about 1.5 s a dense layer, 3 s a padded one, 46 s the file)
PADDED = ("Comba", "DeltaNet", "GatedLinearAttention", "HGRNAttention")


@pytest.mark.parametrize("name,padded", [(n, False) for n in sorted(BUILD)] + [(n, True) for n in PADDED])
def test_layer_runs_our_conv_and_norm(monkeypatch, name, padded):
    """``padded``: a batch of two, the second left-padded by 23 tokens (``attention_mask``): the layer
    unpacks it into documents, and the conv runs over ``cu_seqlens``."""
    import fla.layers

    layer = _build(name)
    _standins(monkeypatch, sys.modules[type(layer).__module__])
    x = torch.randn(2 if padded else 1, T, HIDDEN, requires_grad=True)
    mask = None
    if padded:
        mask = torch.ones(2, T, dtype=torch.long)
        mask[1, :23] = 0

    def run(h):
        out = layer(h, attention_mask=mask)[0]
        return out if mask is None else out * mask[..., None]  # padding rows are not compared

    kernel_fun.patch_fla()
    counts, handles = _calls(layer)
    before = launch_counts()
    out, ours = L.grads(layer, run, x)
    ran = L.launched_since(before)
    for h in handles:
        h.remove()
    kernel_fun.unpatch_fla()
    assert counts["cconv"] + counts["gnorm"] > 0, f"{name} called neither its conv nor its norm"
    # every call ran our forward and backward (one launch each a call)
    for fam in ("cconv", "gnorm"):
        assert ran.get(f"{fam}.fwd", 0) == counts[fam], (fam, counts, ran)
        assert ran.get(f"{fam}.bwd", 0) == counts[fam], (fam, counts, ran)

    import fla.modules.causal_conv1d.ops as conv_ops
    import fla.modules.norm.fused_norm_gate as norm_ops

    with L.swapped(conv_ops, "causal_conv1d", _conv_ref), L.swapped(norm_ops, "rms_norm_gated", _norm_ref):
        ref_out, ref = L.grads(layer, run, x)
    # the floor: the same layer with its conv and norm written in plain fp32 torch, against the fp64 one
    with L.swapped(conv_ops, "causal_conv1d", functools.partial(_conv_ref, dtype=torch.float32)), \
            L.swapped(norm_ops, "rms_norm_gated", functools.partial(_norm_ref, dtype=torch.float32)):
        _, fp32 = L.grads(layer, run, x)
    assert rel_rms(out, ref_out) < 1e-5
    names = ["x"] + [n for n, _ in layer.named_parameters()]
    assert all((a is None) == (b is None) for a, b in zip(ours, ref))
    rows = {n: (rel_rms(a, b), rel_rms(f, b)) for n, a, b, f in zip(names, ours, ref, fp32) if b is not None}
    print(name, counts, {n: f"{e:.1e} ({f:.1e})" for n, (e, f) in rows.items()})
    bad = {n: r for n, r in rows.items() if not r[0] <= max(FLOOR_FACTOR * r[1], 1e-5)}
    assert not bad, bad
    assert isinstance(layer, getattr(fla.layers, name))


def test_the_list_holds_every_fla_layer_with_a_conv_or_norm():
    """A layer of a newer fla that builds either module fails here until it is listed above."""
    import fla.layers
    from fla.modules import FusedRMSNormGated, ShortConvolution

    found = set()
    for name in (n for n in dir(fla.layers) if n[0].isupper() and n not in OWN_TESTS):
        cls = getattr(fla.layers, name)
        try:
            layer = cls(hidden_size=HIDDEN, **BUILD.get(name, dict(num_heads=2)), layer_idx=0)
        except Exception:  # needs a package this machine lacks (flash-attn), or other arguments
            continue
        if any(isinstance(m, (ShortConvolution, FusedRMSNormGated)) for m in layer.modules()):
            found.add(name)
    assert found == set(BUILD), (sorted(found - set(BUILD)), sorted(set(BUILD) - found))
