"""gnorm test helpers shared by the CPU and GPU files: inputs drawn fresh (never zeros) and
the comparison of a run against the fp64 reference."""
import torch

from kernel_fun._common.numerics import rel_rms
from kernel_fun.gnorm.reference import rms_norm_gated_ref, rms_norm_gated_ref_grads

NAMES = ("x", "g", "weight", "bias", "residual")


def make_inputs(shape, dtype=torch.float32, weight=True, bias=False, residual=None, wdtype=torch.float32,
                device="cpu", seed=0):
    """Leaves x, g (dtype), weight, bias (wdtype), residual (dtype `residual` or None), each
    requiring grad; g spread over +-4 so both sides of the gate are exercised."""
    gen = torch.Generator().manual_seed(seed)
    V = shape[-1]

    def rnd(*s, scale=1.0):
        return (torch.randn(*s, generator=gen) * scale).to(device)

    t = {
        "x": rnd(*shape).to(dtype),
        "g": rnd(*shape, scale=2.0).to(dtype),
        "weight": (1 + 0.5 * rnd(V)).to(wdtype) if weight else None,
        "bias": (0.5 * rnd(V)).to(wdtype) if bias else None,
        "residual": rnd(*shape).to(residual) if residual is not None else None,
    }
    return {k: (v.requires_grad_() if v is not None else None) for k, v in t.items()}


def compare(fn, inp, activation, prenorm=False, residual_in_fp32=False, eps=1e-5, tol=1e-5, seed=1,
            use_h_grad=None):
    """Run ``fn`` (our rms_norm_gated or fla's) fwd + bwd on ``inp``; return {name: rel error}
    against the fp64 reference, for the output(s) and the gradient of every present leaf.
    ``use_h_grad``: feed a gradient into the prenorm output too (default: with prenorm)."""
    gen = torch.Generator().manual_seed(seed)
    out = fn(inp["x"], inp["g"], inp["weight"], inp["bias"], activation=activation, residual=inp["residual"],
             prenorm=prenorm, residual_in_fp32=residual_in_fp32, eps=eps)
    y, h = out if prenorm else (out, None)
    dev = inp["x"].device
    dy = torch.randn(y.shape, generator=gen).to(dev).to(y.dtype)
    use_h = prenorm if use_h_grad is None else use_h_grad
    dh = torch.randn(h.shape, generator=gen).to(dev).to(h.dtype) if use_h else None
    leaves = [(k, inp[k]) for k in NAMES if inp[k] is not None]
    outs, gouts = ([y, h], [dy, dh]) if use_h else ([y], [dy])
    grads = torch.autograd.grad(outs, [t for _, t in leaves], gouts)
    det = {k: (v.detach() if v is not None else None) for k, v in inp.items()}
    ref, href = rms_norm_gated_ref(det["x"], det["g"], det["weight"], det["bias"], activation, det["residual"],
                                   True, eps)
    rg = rms_norm_gated_ref_grads(inp["x"], inp["g"], inp["weight"], inp["bias"], dy, activation,
                                  inp["residual"], dh, eps)
    errs = {"y": rel_rms(y, ref)}
    if prenorm:
        errs["h"] = rel_rms(h, href)
    for (k, _), gr in zip(leaves, grads):
        errs["d" + k] = rel_rms(gr, rg[k])
    return errs, (y, h, dict(zip([k for k, _ in leaves], grads)))


def check_errs(errs, tol):
    bad = {k: v for k, v in errs.items() if not v <= tol}
    assert not bad, f"errors over {tol:.0e}: {bad} (all: {errs})"
