"""The whole GDN chain on the CPU: our kernels (the ``_delta`` state scans, gdn's scores and
fused backward) through Triton's interpreter, fla's stages as plain-torch stand-ins, end to end
through ``gdn.chunk_gated_delta_rule`` and autograd against the fp64 recurrence
(``gdn.reference``). Checks the wiring (layouts, grouped heads, packed documents with a
1-token document, the initial state in both layouts, the in-op gate, the beta sigmoid with
negative eigenvalues, the precomputed gate) and that ours ran, fla's replaced stages did not."""
import model_calls
import pytest
import torch

import gdn_fla_standins as fla_standins  # noqa: E402  (registered by tests/gdn/conftest.py)
from gdn_chain_cases import make_inputs, run as _run  # noqa: E402
from kernel_fun import gdn
from kernel_fun._common import capture
from kernel_fun._common.numerics import rel_rms as _rel
from kernel_fun._common.witness import launch_counts
from kernel_fun.gdn import chain
from kernel_fun.gdn.reference import chunk_gated_delta_rule_ref

# fp16 operands, fp32 accumulation, fp64 stand-ins. Largest measured over these cases (CPU,
# interpreter, triton 3.6): o 5.0e-4, ht 3.6e-4, dq 5.4e-4, dk 5.2e-4, dv 4.6e-4, dh0 1.8e-4,
# dg 9.2e-4, dbeta 1.6e-3 (precomputed_gate), dA_log 9.1e-4, ddt_bias 9.1e-4; bounds about 4x.
TOL = dict(o=2e-3, ht=2e-3, dq=2e-3, dk=2e-3, dv=2e-3, dh0=1e-3, dg=4e-3, dbeta=6e-3, dA_log=4e-3,
           ddt_bias=4e-3)

CASES = {  # the box's smallest heads (the interpreter's cost grows with them)
    "tail_grouped": dict(B=2, T=100, H=1, HV=2, K=64, V=64),
    "one_token": dict(B=3, T=1, H=1, HV=2, K=64, V=64, h0=True),  # a decode-sized call in chunk mode
    "initial_state_vfirst": dict(B=1, T=130, H=2, HV=2, K=64, V=64, h0=True),
    "initial_state_kfirst": dict(B=1, T=70, H=1, HV=1, K=64, V=128, h0=True, state_v_first=False),
    "beta_sigmoid_negeig": dict(B=1, T=80, H=1, HV=2, K=64, V=64, neg=True, strong_decay=True),
    "precomputed_gate": dict(B=1, T=70, H=2, HV=2, K=64, V=64, gate_in_kernel=False, beta_logits=False),
    "cu_seqlens": dict(B=1, T=150, H=1, HV=2, K=64, V=64, h0=True, N=5, cu=[0, 0, 37, 37, 38, 150]),  # empty docs, a 1-token doc
    # fla's default GatedDeltaNet heads (head_dim 256, expand_v 2): the split forward, the scans above K = 128
    "fla_default_heads": dict(B=1, T=70, H=1, HV=2, K=256, V=512, h0=True),
    "fla_default_heads_packed": dict(B=1, T=150, H=1, HV=2, K=256, V=512, h0=True, N=3, cu=[0, 37, 38, 150]),
}
OURS = ("gdn.wy_inverse", "delta.state_scan_fwd", "delta.state_scan_bwd", "gdn.gated_scores", "gdn.wy_dv_bwd",
        "gdn.wy_dqk_bwd")
# fla stage functions the chain may call (and nothing else of fla's, index helpers aside)
FLA_STAGES = {("fla.ops.gated_delta_rule.gate", "gdn_gate_chunk_cumsum"),
              ("fla.ops.gated_delta_rule.gate", "gdn_gate_bwd"),
              ("fla.ops.utils.cumsum", "chunk_local_cumsum"),
              ("fla.modules.norm.l2norm", "l2norm_fwd"), ("fla.modules.norm.l2norm", "l2norm_bwd"),
              ("fla.ops.common.gate", "fused_beta_sigmoid_fwd"), ("fla.ops.common.gate", "fused_beta_sigmoid_bwd"),
              ("fla.ops.utils.index", "prepare_chunk_indices"), ("fla.ops.utils.index", "prepare_chunk_offsets")}


@pytest.fixture(autouse=True)
def _standins(monkeypatch, clean_state, poison_outputs):
    if torch.cuda.is_available():
        pytest.skip("the CPU tier (interpreter + stand-ins); the GPU tier runs fla's stages")
    return fla_standins.install(monkeypatch)


# fla's stages that ours replace (gdn/_kernels/inputs_{fwd,bwd}.py) when the op normalizes q and k
INPUT_STAGES = {("fla.modules.norm.l2norm", "l2norm_fwd"), ("fla.modules.norm.l2norm", "l2norm_bwd"),
                ("fla.ops.common.gate", "fused_beta_sigmoid_fwd"), ("fla.ops.common.gate", "fused_beta_sigmoid_bwd"),
                ("fla.ops.gated_delta_rule.gate", "gdn_gate_chunk_cumsum"),
                ("fla.ops.gated_delta_rule.gate", "gdn_gate_bwd"), ("fla.ops.utils.cumsum", "chunk_local_cumsum")}


# Both input paths for every case but the packed default heads (23 s a path in the interpreter), where
# the layer's path alone runs: the other path differs only in the input stages, which the K = 64
# packed case runs both ways.
@pytest.mark.parametrize("name, l2norm", [pytest.param(n, l2, id=f"{n}-{'l2norm_in_op' if l2 else 'no_l2norm'}")
                                          for n in CASES for l2 in (True, False)
                                          if l2 or n != "fla_default_heads_packed"])
def test_chain_against_fp64_recurrence(name, l2norm, _standins):
    """Both input paths: with the l2norm in the op (the layer's call), the inputs' stages are ours in
    one launch each way; without it, fla's beta sigmoid and gate stages (q, k given unit rows)."""
    c = dict(CASES[name])
    cu, neg = c.pop("cu", None), c.pop("neg", False)
    v_first = c.get("state_v_first", True)
    t = make_inputs(**c, device="cpu", dtype=torch.float16)
    if not l2norm:
        for n in ("q", "k"):
            t[n] = torch.nn.functional.normalize(t[n].detach().float(), dim=-1).half().requires_grad_()
    B, T, HV, V, K = c["B"], c["T"], c["HV"], c["V"], c["K"]
    gen = torch.Generator().manual_seed(1)
    do = torch.randn(B, T, HV, V, generator=gen).half()
    N = len(cu) - 1 if cu else B
    dht = torch.randn(N, HV, *((V, K) if v_first else (K, V)), generator=gen)
    flags = dict(use_qk_l2norm_in_kernel=l2norm, use_beta_sigmoid_in_kernel=c.get("beta_logits", True),
                 allow_neg_eigval=neg, output_final_state=True, state_v_first=v_first,
                 cu_seqlens=None if cu is None else torch.tensor(cu, dtype=torch.long))
    assert gdn.is_supported(t["q"], t["k"], t["v"], t["g"], t["beta"], **flags,
                            **{n: t[n] for n in ("A_log", "dt_bias", "initial_state") if n in t},
                            **({"use_gate_in_kernel": True} if "A_log" in t else {})) == (True, "")
    before = launch_counts()
    _standins.clear()
    ours = _run(gdn.chunk_gated_delta_rule, t, do, dht, **flags)
    after = launch_counts()
    for stage in OURS + (("gdn.inputs_fwd", "gdn.inputs_bwd") if l2norm else ()):
        assert after.get(stage, 0) > before.get(stage, 0), stage
    for stage in ("gdn.inputs_fwd", "gdn.inputs_bwd"):
        assert l2norm or after.get(stage, 0) == before.get(stage, 0), stage
    # the split forward (above K = 128) makes o in chunk_output; the fused scan makes it below
    split = after.get("gdn.chunk_output", 0) - before.get("gdn.chunk_output", 0)
    assert split == (1 if c["K"] > chain.SPLIT_ABOVE_K else 0), split
    assert set(_standins) <= FLA_STAGES, set(_standins) - FLA_STAGES
    if l2norm:
        assert not set(_standins) & INPUT_STAGES, set(_standins) & INPUT_STAGES
    else:
        assert not {s for s in _standins if s[0] == "fla.modules.norm.l2norm"}, set(_standins)
    ref = _run(chunk_gated_delta_rule_ref, t, do.double(), dht.double(), **flags)
    errs = {n: _rel(ours[n], ref[n]) for n in ref if ref[n] is not None}
    print(name, {n: f"{e:.1e}" for n, e in errs.items()})
    bad = {n: e for n, e in errs.items() if not e <= TOL[n]}
    assert not bad, bad


def test_column_slices_of_the_fused_qkv_buffer(_standins):
    """GatedDeltaNet's fused q/k/v conv returns one [B, T, 2*H*K + HV*V] buffer that the layer
    splits: q, k, v arrive as strided views (fla's l2norm would fail on them; the fused inputs
    kernel reads q, k through their strides); results equal those of contiguous copies, bit for
    bit, with a backward."""
    B, T, H, HV, K, V = 1, 70, 1, 2, 64, 64
    t = make_inputs(B=B, T=T, H=H, HV=HV, K=K, V=V, device="cpu", dtype=torch.float16)
    buf = torch.cat([t["q"].detach().flatten(2), t["k"].detach().flatten(2), t["v"].detach().flatten(2)], -1)
    q, k, v = (x.view(B, T, -1, d) for x, d in zip(buf.split([H * K, H * K, HV * V], -1), (K, K, V)))
    assert not q.is_contiguous()
    flags = dict(use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True, use_gate_in_kernel=True,
                 A_log=t["A_log"].detach(), dt_bias=t["dt_bias"].detach(), state_v_first=True)
    o_strided, _ = gdn.chunk_gated_delta_rule(q, k, v, t["g"].detach(), t["beta"].detach(), **flags)
    o_dense, _ = gdn.chunk_gated_delta_rule(q.contiguous(), k.contiguous(), v.contiguous(), t["g"].detach(),
                                            t["beta"].detach(), **flags)
    assert torch.equal(o_strided, o_dense)
    # and through the backward: the gradient of the buffer
    do = torch.randn_like(o_dense)
    views = buf.clone().requires_grad_()
    qs, ks, vs = (x.view(B, T, -1, d) for x, d in zip(views.split([H * K, H * K, HV * V], -1), (K, K, V)))
    g_strided, = torch.autograd.grad(gdn.chunk_gated_delta_rule(qs, ks, vs, t["g"].detach(), t["beta"].detach(),
                                                                **flags)[0], views, do)
    dense = [x.contiguous().requires_grad_() for x in (q, k, v)]
    g_dense = torch.autograd.grad(gdn.chunk_gated_delta_rule(*dense, t["g"].detach(), t["beta"].detach(),
                                                             **flags)[0], dense, do)
    assert torch.equal(g_strided, torch.cat([x.flatten(2) for x in g_dense], -1))


class _CountOps(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the aten ops run under it (by name)."""

    def __init__(self):
        super().__init__()
        self.seen = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        self.seen[name] = self.seen.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("extra", [0, 16], ids=["exact", "extra_columns"])
def test_fused_qkv_gradient_written_whole(extra, _standins, monkeypatch):
    """Where q, k, v are the three column slices of one tensor (the layer's split of its fused
    conv output), the backward writes the tensor's gradient whole (dq, dk, dv into its three
    parts, every element written: outputs start as NaN here) and autograd's split backward (a
    cat of three gradients) never runs; bit for bit the gradients of three separate tensors. A
    tensor with columns beyond q, k, v (``extra``) takes the three-gradient path, also exact. The
    eager calls make both layouts warm for CUDA graph capture (the gate asks for the signature the
    forward recorded; ``clean_state`` starts the warm set empty)."""
    B, T, H, HV, K, V = 2, 70, 1, 2, 64, 64
    t = make_inputs(B=B, T=T, H=H, HV=HV, K=K, V=V, device="cpu", dtype=torch.float16)
    parts = [t["q"].detach().flatten(2), t["k"].detach().flatten(2), t["v"].detach().flatten(2)]
    base = torch.cat(parts + [torch.randn(B, T, extra).half()], -1).requires_grad_()
    q, k, v, _ = (x.view(B, T, -1, d) for x, d in zip(base.split([H * K, H * K, HV * V, extra], -1), (K, K, V, 1)))
    flags = dict(use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True, use_gate_in_kernel=True,
                 A_log=t["A_log"].detach(), dt_bias=t["dt_bias"].detach(), state_v_first=True)
    from kernel_fun.gdn.ops import _fused_qkv

    assert (_fused_qkv(q, k, v, True) is base) == (extra == 0)
    with torch.no_grad():  # views made without grad tracking pass no gradient to the base: not fused
        k_nograd = base[..., H * K:2 * H * K].unflatten(-1, (H, K))
    assert _fused_qkv(q, k_nograd, v, True) is None and _fused_qkv(q, k.detach(), v, True) is None
    o, _ = gdn.chunk_gated_delta_rule(q, k, v, t["g"].detach(), t["beta"].detach(), **flags)
    do = torch.randn_like(o)
    with _CountOps() as ops:
        d_base, = torch.autograd.grad(o, base, do)
    assert ("aten.cat" in ops.seen) == (extra > 0), ops.seen
    dense = [x.detach().contiguous().requires_grad_() for x in (q, k, v)]
    d_dense = torch.autograd.grad(gdn.chunk_gated_delta_rule(*dense, t["g"].detach(), t["beta"].detach(),
                                                             **flags)[0], dense, do)
    want = torch.cat([x.flatten(2) for x in d_dense] + [torch.zeros(B, T, extra).half()], -1)
    assert torch.equal(d_base, want)
    monkeypatch.setattr(capture, "_capturing", lambda: True)
    for args in ((q, k, v), dense):
        assert gdn.is_supported(*args, t["g"].detach(), t["beta"].detach(), **flags) == (True, "")


def test_transformers_qwen3_next_call(_standins):
    """The call transformers' ``Qwen3NextGatedDeltaNet`` makes: q, k repeated to the value heads,
    the gate precomputed in fp32 (``-exp(A_log) softplus(a + dt_bias)``), beta activated, the
    l2norm in the op, no state. Every stage ours (no fla stand-in called), dg in g's fp32, each
    output against the fp64 recurrence (5.2e-4 and under measured, 2026-12-05)."""
    B, T, HK, HV, K, V = 2, 100, 1, 2, 64, 64
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(B, T, HK, K, generator=gen).half().repeat_interleave(HV // HK, dim=2) for _ in range(2))
    v = torch.randn(B, T, HV, V, generator=gen).half()
    a, A_log, dt_bias = torch.randn(B, T, HV, generator=gen).half(), torch.rand(HV, generator=gen) * 2, torch.randn(HV)
    g = -A_log.float().exp() * torch.nn.functional.softplus(a.float() + dt_bias)
    beta = torch.randn(B, T, HV, generator=gen).half().sigmoid()
    do = torch.randn(B, T, HV, V, generator=gen).half()

    ours = model_calls.check(gdn.chunk_gated_delta_rule, chunk_gated_delta_rule_ref, q, k, v, g, beta, do,
                             ("gdn.inputs_fwd", "gdn.wy_inverse", "delta.state_scan_fwd", "gdn.inputs_bwd", "gdn.wy_dqk_bwd"))
    assert not _standins, _standins
    assert ours["dg"].dtype == torch.float32  # in g's dtype
