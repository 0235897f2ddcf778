"""Checks shared by the layer tests (fla's layers patched, on the CPU): gradients of a step, the
layer against itself on the fp64 reference op within the one-ulp noise floor, activation
checkpointing, a prefill with fla's Cache."""
import torch

from kernel_fun._common.numerics import rel_rms
from kernel_fun._common.witness import launch_counts


def grads(layer, run, h):
    """``run(h)``'s output (detached) and the gradients of its mean square w.r.t. h and the layer's
    parameters (None where unused), through ``.backward()`` (reentrant checkpointing needs it)."""
    leaves = [h] + list(layer.parameters())
    for t in leaves:
        t.grad = None
    out = run(h)
    out.float().square().mean().backward()
    return out.detach(), [None if t.grad is None else t.grad.clone() for t in leaves]


def gdn_reference_op(**kw):
    """fla's ``chunk_gated_delta_rule`` as a layer calls it, on the fp64 reference: o in q's dtype,
    the final state fp32 (what a layer swapped onto the reference calls)."""
    from kernel_fun.gdn.reference import chunk_gated_delta_rule_ref

    o, ht = chunk_gated_delta_rule_ref(**kw)
    return o.to(kw["q"].dtype), (None if ht is None else ht.float())


def launched_since(before: dict) -> dict:
    return {k: n - before.get(k, 0) for k, n in launch_counts().items() if n != before.get(k, 0)}


class swapped:
    """``module.name`` replaced by ``value`` inside the block (the layer's op by the reference)."""

    def __init__(self, module, name, value):
        self.module, self.name, self.value = module, name, value

    def __enter__(self):
        self.original = getattr(self.module, self.name)
        setattr(self.module, self.name, self.value)

    def __exit__(self, *exc):
        setattr(self.module, self.name, self.original)


def within_noise_floor(layer, run, x, out, ours, swap, required):
    """Ours (``out``, ``ours``: ``grads(layer, run, x)``) against the same layer with ``swap`` (a
    ``swapped``: the op on the fp64 reference) in place: the output within 5e-3, each gradient within
    1.5x the noise floor, the reference layer's own move for a one-ulp move of its fp16 input (fp16
    projections, conv and norm round alike in both); ``required``: parameter names that must be there."""
    with swap:
        ref_out, ref = grads(layer, run, x)
        _, moved = grads(layer, run, (x.detach().view(torch.int16) + 1).view(torch.float16).requires_grad_(True))
    assert rel_rms(out, ref_out) < 5e-3
    names = ["x"] + [n for n, _ in layer.named_parameters()]
    rows = {n: (rel_rms(a, b), rel_rms(u, b)) for n, a, b, u in zip(names, ours, ref, moved) if b is not None}
    print({n: f"{e:.2e} (floor {f:.2e})" for n, (e, f) in rows.items()})
    assert set(rows) >= set(required)
    bad = {n: r for n, r in rows.items() if not r[0] <= max(1.5 * r[1], 1e-3)}
    assert not bad, rows


def checkpointed_equals_plain(layer, x, reentrant):
    """The layer inside ``torch.utils.checkpoint``: output and gradients bit for bit those of the
    plain run; returns the launches of the checkpointed step (its forward runs twice)."""
    from torch.utils.checkpoint import checkpoint

    def run(h):
        return layer(h)[0]

    out, ref = grads(layer, run, x)
    before = launch_counts()
    ck_out, ck = grads(layer, lambda h: checkpoint(run, h, use_reentrant=reentrant), x)
    ran = launched_since(before)
    assert torch.equal(out, ck_out)
    for a, b in zip(ref, ck):
        assert (a is None and b is None) or torch.equal(a, b)
    return ran


def prefill(layer, x):
    """Generation's prefill: eval mode, no gradients, ``use_cache=True`` with fla's ``Cache``;
    (output, cached recurrent state, cached conv states, launches)."""
    from fla.models.cache_utils import Cache

    cache = Cache()
    before = launch_counts()
    with torch.no_grad():
        out = layer.eval()(x, past_key_values=cache, use_cache=True)[0]
    return out, cache[0]["recurrent_state"], cache[0]["conv_state"], launched_since(before)


def inference_mode_matches_no_grad(layer, x, mask=None):
    """The layer's forward under ``torch.inference_mode`` (evaluation, generation: tensors without
    version counters) against ``torch.no_grad``: bitwise equal; returns the families the
    inference-mode forward launched."""
    with torch.no_grad():
        ref = layer(x, attention_mask=mask)[0]
    before = launch_counts()
    with torch.inference_mode():
        out = layer(x, attention_mask=mask)[0]
    assert torch.equal(out, ref)
    return {k.split(".")[0] for k in launched_since(before)}
