"""The op calls transformers' linear-attention layers make (Qwen3-Next's GDN, Kimi-Linear's KDA):
the gate and beta computed outside the op, the l2norm in it, no state. ``check(op, ref_op, q, k, v,
g, beta, do, stages)`` runs the call through ours and through the fp64 reference, forward and
backward, and returns ours' outputs after checking that the given launch-witness ``stages`` ran
and that each output is within 2e-3 of the reference's."""
import torch

from kernel_fun._common.numerics import rel_rms
from kernel_fun._common.witness import launch_counts

NAMES = ("o", "dq", "dk", "dv", "dg", "dbeta")


def _run(fn, xs, do):
    xs = [x.detach().requires_grad_() for x in xs]
    o, ht = fn(*xs[:3], g=xs[3], beta=xs[4], initial_state=None, output_final_state=False,
               use_qk_l2norm_in_kernel=True)
    assert ht is None
    return (o, *torch.autograd.grad(o, xs, do.to(o.dtype)))


def check(op, ref_op, q, k, v, g, beta, do, stages):
    before = launch_counts()
    ours = _run(op, (q, k, v, g, beta), do)
    ran = {n for n, c in launch_counts().items() if c != before.get(n, 0)}
    assert set(stages) <= ran, ran
    ref = _run(ref_op, [x.double() for x in (q, k, v, g, beta)], do)
    errs = {n: rel_rms(o, r) for n, o, r in zip(NAMES, ours, ref)}
    assert max(errs.values()) < 2e-3, errs
    return dict(zip(NAMES, ours))
