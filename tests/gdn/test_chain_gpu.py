"""The GDN chain on the GPU (``-m gpu``): end to end against the fp64 recurrence with issue 17's
tolerances (fla's), under stress; every autotune configuration of our kernels forced and held
to its stage reference (Triton 3.6's Hopper miscompile is configuration-dependent); the launch
witness through torch.profiler (ours ran; fla's chunk_bwd_kernel_dqkwg and the other replaced
kernels did not); CUDA graph replay bit-identical to eager; determinism; no memory growth."""
import math

import pytest
import torch

from gdn_chain_cases import make_inputs, run as _run  # noqa: E402  (tests/gdn/conftest.py)
from kernel_fun import gdn
from kernel_fun._common.numerics import rel_rms as _rel
from kernel_fun._common.tuning import config_name
from kernel_fun.gdn import reference_stages as R
from kernel_fun.gdn._kernels import output as out_mod
from kernel_fun.gdn._kernels import scores as scores_mod
from kernel_fun.gdn._kernels import wy_dqk_bwd as dqk_mod
from kernel_fun.gdn._kernels import wy_dqkwg_bwd as bwd_mod
from kernel_fun.gdn._kernels import wy_dv_bwd as dv_mod
from kernel_fun.gdn._kernels import wy_inverse as inv_mod
from kernel_fun.gdn.reference import chunk_gated_delta_rule_ref

pytestmark = pytest.mark.gpu

# issue 17 (fla's tolerances): o and final state 5e-3; dq, dk, dv, dh0 8e-3; dg, dbeta, dA_log, ddt_bias 2e-2
TOL = dict(o=5e-3, ht=5e-3, dq=8e-3, dk=8e-3, dv=8e-3, dh0=8e-3, dg=2e-2, dbeta=2e-2, dA_log=2e-2, ddt_bias=2e-2)
LAYER = dict(use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True, output_final_state=True)

CASES = {
    "layer_grouped": dict(B=2, T=1000, H=2, HV=4, K=128, V=128, h0=True),
    "strong_decay_negeig": dict(B=1, T=2048, H=2, HV=2, K=128, V=128, strong_decay=True, neg=True),
    "long_T": dict(B=1, T=8192, H=1, HV=2, K=128, V=128),
    "k64_v256_kfirst": dict(B=2, T=300, H=2, HV=2, K=64, V=256, h0=True, state_v_first=False),
    "precomputed_gate": dict(B=2, T=333, H=2, HV=2, K=128, V=64, gate_in_kernel=False, beta_logits=False),
    "varlen_1tok": dict(B=1, T=3000, H=2, HV=4, K=128, V=128, h0=True, N=5, cu=[0, 1, 700, 700, 701, 3000]),  # an empty doc too
    "fla_default_heads": dict(B=2, T=1000, H=2, HV=2, K=256, V=512, h0=True),  # head_dim 256, expand_v 2
    "fla_default_heads_packed": dict(B=1, T=1500, H=2, HV=2, K=256, V=512, h0=True, N=4, cu=[0, 1, 600, 600, 1500]),
}


def _case(name, dtype=torch.bfloat16):
    c = dict(CASES[name])
    cu, neg = c.pop("cu", None), c.pop("neg", False)
    v_first = c.get("state_v_first", True)
    t = make_inputs(**c, device="cuda", dtype=dtype)
    gen = torch.Generator(device="cuda").manual_seed(1)
    B, T, HV, V, K = c["B"], c["T"], c["HV"], c["V"], c["K"]
    do = torch.randn(B, T, HV, V, device="cuda", generator=gen).to(dtype)
    N = len(cu) - 1 if cu else B
    dht = torch.randn(N, HV, *((V, K) if v_first else (K, V)), device="cuda", generator=gen)
    flags = dict(LAYER, allow_neg_eigval=neg, state_v_first=v_first,
                 use_beta_sigmoid_in_kernel=c.get("beta_logits", True),
                 cu_seqlens=None if cu is None else torch.tensor(cu, device="cuda"))
    return t, do, dht, flags


# Cases whose per-head scalars (dA_log, ddt_bias: [HV] sums over every token) are ill-conditioned:
# with strong decay almost every term cancels, and moving each bf16 input by one ulp moves the
# fp64 reference's dA_log by 1.2e-2 to 4.7e-2 (CPU, T=2048, two draws, 2026-12-01). There the
# ceiling for those two is the larger of fla's tolerance and that noise floor, measured in the
# test as the largest move over three draws (one draw on the H200 stayed under 2e-2 while ours
# was 2.92e-2: a single draw is not the floor).
# k64_v256_kfirst (K=64, V=256, T=300) is another: on the CPU (2026-12-02, tools/gdn_noise_floor.py,
# the same one-ulp draws, fp64 reference) dA_log moved by 1.68e-2, 1.71e-2 and 3.05e-2
# (ddt_bias 1.56e-2 to 3.18e-2) on one input draw, 0.73e-2 to 2.00e-2 on another; on the H200 ours
# was 1.2e-2 with the three-accumulator wy_dv_bwd and 2.27e-2 with MERGE_D (git e867389), every
# other output <= 4.4e-3.
ILL_CONDITIONED = {"strong_decay_negeig": ("dA_log", "ddt_bias"), "k64_v256_kfirst": ("dA_log", "ddt_bias")}
NOISE_DRAWS = 3


def _one_ulp(t, seed):
    """The inputs with every bf16 element moved one ulp up or down (random sign); fp32 ones kept."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    out = {}
    for n, x in t.items():
        y = x.detach().clone()
        if y.dtype == torch.bfloat16:
            f = y.float()
            ulp = torch.where(f == 0, torch.zeros_like(f), torch.exp2(torch.floor(torch.log2(f.abs())) - 7))
            sign = torch.randint(0, 2, y.shape, device="cuda", generator=gen).float() * 2 - 1
            y = (f + sign * ulp).to(torch.bfloat16)
        out[n] = y.requires_grad_(True)
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_against_fp64_naive_recurrence(name):
    _against_fp64(name)


def _against_fp64(name, l2norm=True):
    t, do, dht, flags = _case(name)
    if not l2norm:  # q, k handed over as unit rows (what a caller normalizing them itself passes)
        flags["use_qk_l2norm_in_kernel"] = False
        for n in ("q", "k"):
            t[n] = torch.nn.functional.normalize(t[n].detach().float(), dim=-1).bfloat16().requires_grad_()
    ours = _run(gdn.chunk_gated_delta_rule, t, do, dht, **flags)
    ref = _run(chunk_gated_delta_rule_ref, t, do.double(), dht.double(), **flags)
    errs = {n: _rel(ours[n], ref[n]) for n in ref if ref[n] is not None}
    tol = dict(TOL)
    if name in ILL_CONDITIONED:
        for seed in range(NOISE_DRAWS):
            moved = _run(chunk_gated_delta_rule_ref, _one_ulp(t, 7 + seed), do.double(), dht.double(), **flags)
            for n in ILL_CONDITIONED[name]:
                tol[n] = max(tol[n], _rel(moved[n], ref[n]))
    print(name, {n: f"{e:.2e}" for n, e in errs.items()}, "ceilings", {n: f"{tol[n]:.2e}" for n in errs})
    bad = {n: e for n, e in errs.items() if not e <= tol[n]}
    assert not bad, bad


def _stage_inputs(B=2, T=300, H=2, HV=4, K=128, V=128, dtype=torch.bfloat16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    a = -torch.rand(B, T, HV, generator=gen).double() * 2.0
    g = torch.cat([c.cumsum(1) for c in a.split(64, dim=1)], 1).float() / math.log(2.0)
    q = torch.nn.functional.normalize(r(B, T, H, K), dim=-1)
    k = torch.nn.functional.normalize(r(B, T, H, K), dim=-1)
    beta = torch.rand(B, T, HV, generator=gen) * 2.0
    NT = -(-T // 64)
    t = dict(q=q, k=k, v=r(B, T, HV, V), v_new=r(B, T, HV, V), g=g, beta=beta,
             h=r(B, NT, HV, K, V) * 0.5, dh=r(B, NT, HV, K, V) * 0.5, do=r(B, T, HV, V), dv2=r(B, T, HV, V))
    t = {n: (x.to(dtype) if n not in ("g", "beta") else x) for n, x in t.items()}
    ref = R.wy_dqkwg_bwd_ref(**{n: x.double() for n, x in t.items()}, scale=K ** -0.5)
    A = R.wy_inverse_ref(t["k"], g, beta).to(dtype)
    return {n: x.cuda() for n, x in t.items()}, A.cuda(), ref


# bf16 inputs against fp64: 1e-2 for the [T, K] / [T, V] gradients; dbeta and dg (row sums, and
# dg a reverse cumsum of differences) at issue 17's 2e-2 (fla's): every configuration gave dg
# 1.097e-2 on the H200 (2026-12-01), the same in all of them, so rounding, not a miscompile.
STAGE_TOL = dict(dq=1e-2, dk=1e-2, dv=1e-2, dbeta=2e-2, dg=2e-2)

# every configuration of each half, the other half at its first (so each config is held to the
# reference on its own; a miscompile in one half shows under that half's id)
BWD_PAIRS = ([("dv", c, dqk_mod.CONFIGS[0]) for c in dv_mod.CONFIGS]
             + [("dqk", dv_mod.CONFIGS[0], c) for c in dqk_mod.CONFIGS[1:]])


@pytest.mark.parametrize("half,dv_config,dqk_config", BWD_PAIRS,
                         ids=[f"{h}-{config_name(a if h == 'dv' else b)}" for h, a, b in BWD_PAIRS])
def test_every_backward_config_against_its_reference(half, dv_config, dqk_config):
    t, A, ref = _stage_inputs()
    for run in range(2):  # and deterministic
        out = bwd_mod.wy_dqkwg_bwd(**t, A=A, scale=128 ** -0.5, out_dtype=torch.float32, dv_config=dv_config,
                                   dqk_config=dqk_config)
        for n, o, r_ in zip(("dq", "dk", "dv", "dbeta", "dg"), out, ref):
            assert _rel(o.cpu(), r_) < STAGE_TOL[n], (n, _rel(o.cpu(), r_))
        if run:
            for a, b in zip(out, first):
                assert torch.equal(a, b)
        first = out


@pytest.mark.parametrize("half,dv_config,dqk_config", BWD_PAIRS,
                         ids=[f"{h}-{config_name(a if h == 'dv' else b)}" for h, a, b in BWD_PAIRS])
def test_every_backward_config_at_fla_default_gdn_heads(half, dv_config, dqk_config):
    """fla's default GatedDeltaNet heads (head_dim 256, expand_v 2: K = 256, V = 512): each
    configuration of the two halves against the fp64 reference (Triton 3.4-3.7.0's Hopper miscompiles
    are per configuration), and the gated scores (autotuned) there."""
    t, A, ref = _stage_inputs(B=1, T=200, H=1, HV=2, K=256, V=512)
    out = bwd_mod.wy_dqkwg_bwd(**t, A=A, scale=256 ** -0.5, out_dtype=torch.float32, dv_config=dv_config,
                               dqk_config=dqk_config)
    for n, o, r_ in zip(("dq", "dk", "dv", "dbeta", "dg"), out, ref):
        assert _rel(o.cpu(), r_) < STAGE_TOL[n], (n, _rel(o.cpu(), r_))
    S = scores_mod.gated_scores(t["q"], t["k"], t["g"], 0.3)
    assert _rel(S.cpu(), R.gated_scores_ref(t["q"].cpu(), t["k"].cpu(), t["g"].cpu(), 0.3)) < 1e-2


@pytest.mark.parametrize("dqk_config", [None] + dqk_mod.CONFIGS, ids=lambda c: "autotuned" if c is None else config_name(c))
def test_every_dqk_config_per_value_head_against_its_reference(dqk_config):
    """A program per value head (``per_head``, the autograd's form at HV > H with the inputs'
    backward ours): the value heads' shares of dq, dk, summed over their group, against the fp64
    reference in every config of the second half; in q's dtype (bf16) as the chain writes them, and
    deterministic."""
    t, A, ref = _stage_inputs()
    B, T, H, K = t["q"].shape
    G = t["v"].shape[2] // H
    first = None
    for run in range(2):
        out = bwd_mod.wy_dqkwg_bwd(**t, A=A, scale=128 ** -0.5, per_head=True, dqk_config=dqk_config)
        assert out[0].shape == (B, T, H * G, K) and out[0].dtype == torch.bfloat16
        got = [o.view(B, T, H, G, K).float().sum(3) for o in out[:2]] + [o.float() for o in out[2:]]
        for n, o, r_ in zip(("dq", "dk", "dv", "dbeta", "dg"), got, ref):
            assert _rel(o.cpu(), r_) < STAGE_TOL[n], (n, _rel(o.cpu(), r_))
        if first is not None:
            for a, b in zip(out, first):
                assert torch.equal(a, b)
        first = out


@pytest.mark.parametrize("keys", ["random", "correlated"])
@pytest.mark.parametrize("config", inv_mod.CONFIGS, ids=config_name)
def test_every_wy_inverse_config_against_its_reference_and_fla(config, keys):
    """Our WY inverse in every configuration (bf16 k, beta up to 2, strong decay; and keys nearly
    parallel with weak decay, where the inverse's entries grow) against the fp64 solve, and beside
    fla's fused kkt + solve kernel (which it replaces) on the same inputs: ours no further from
    fp64 than fla's plus one bf16 rounding."""
    from fla.ops.gated_delta_rule.chunk_fwd import chunk_gated_delta_rule_fwd_kkt_solve_kernel as fla_kkt

    t, _, _ = _stage_inputs(T=1000)
    k, g, beta = t["k"], t["g"], t["beta"]
    if keys == "correlated":
        gen = torch.Generator().manual_seed(1)
        kf = torch.randn(128, generator=gen) + 0.15 * torch.randn(*k.shape, generator=gen)
        k = torch.nn.functional.normalize(kf, dim=-1).to(k.dtype).cuda()
        g = g * 0.02
    B, T, H, K = k.shape
    ref = R.wy_inverse_ref(k.cpu(), g.cpu(), beta.cpu()).float()
    A = inv_mod.wy_inverse(k, g, beta, config=config)
    assert torch.equal(A, R.lower_blocks(A, B, T))  # the blocks above the diagonal written as zeros (read unmasked)
    again = inv_mod.wy_inverse(k, g, beta, config=config)
    assert torch.equal(A, again)  # deterministic
    HV = g.shape[2]
    A_fla = torch.zeros_like(A)  # fla's kernel leaves the blocks above the diagonal as they were
    fla_kkt[(-(-T // 64), B * HV)](k=k, g=g, beta=beta, A=A_fla, cu_seqlens=None, chunk_indices=None, T=T, H=H,
                                   HV=HV, K=K, BT=64, BC=16)
    ours, fla = _rel(A.float().cpu(), ref), _rel(A_fla.float().cpu(), ref)
    print(config_name(config), keys, f"ours {ours:.2e} fla {fla:.2e}")
    assert ours < 1e-2 and ours <= fla + 4e-3


@pytest.mark.parametrize("config", scores_mod.CONFIGS, ids=config_name)
def test_every_scores_config_against_its_reference(config):
    t, _, _ = _stage_inputs()
    S = scores_mod.gated_scores(t["q"], t["k"], t["g"], 0.3, config=config)
    assert _rel(S.cpu(), R.gated_scores_ref(t["q"].cpu(), t["k"].cpu(), t["g"].cpu(), 0.3)) < 1e-2


@pytest.mark.parametrize("shape", ["grouped", "fla_default_heads"])
@pytest.mark.parametrize("config", out_mod.CONFIGS, ids=config_name)
def test_every_chunk_output_config_against_its_reference(config, shape):
    """The split forward's output (above K = 128: fla's default heads, K = 256 V = 512; and the
    grouped K = 128 case) in every configuration, bf16, against the fp64 stage reference."""
    B, T, H, HV, K, V = (1, 200, 1, 2, 256, 512) if shape == "fla_default_heads" else (2, 300, 2, 4, 128, 128)
    gen = torch.Generator().manual_seed(0)
    a = -torch.rand(B, T, HV, generator=gen).double() * 2.0
    g = torch.cat([c.cumsum(1) for c in a.split(64, dim=1)], 1).float() / math.log(2.0)
    q = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1).bfloat16()
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1).bfloat16()
    h = (torch.randn(B, -(-T // 64), HV, K, V, generator=gen) * 0.5).bfloat16()
    vn = torch.randn(B, T, HV, V, generator=gen).bfloat16()
    Aqk = scores_mod.gated_scores(q.cuda(), k.cuda(), g.cuda(), 0.3)
    o = out_mod.chunk_output(q.cuda(), h.cuda(), vn.cuda(), Aqk, g.cuda(), 0.3, config=config)
    ref = R.chunk_output_ref(q, h, vn, Aqk.cpu(), g, 0.3)
    assert _rel(o.float().cpu(), ref) < 1e-2, _rel(o.float().cpu(), ref)


def test_launch_witness_replaced_fla_kernels_did_not_run():
    t, do, dht, flags = _case("layer_grouped")
    _run(gdn.chunk_gated_delta_rule, t, do, dht, **flags)  # compile and autotune outside the profile
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        _run(gdn.chunk_gated_delta_rule, t, do, dht, **flags)
        torch.cuda.synchronize()
    names = {e.key for e in prof.key_averages()}
    for ours in ("wy_inverse_kernel", "state_scan_fwd_kernel", "state_scan_bwd_kernel", "gated_scores_kernel", "wy_dv_bwd_kernel",
                 "wy_dqk_bwd_kernel", "inputs_fwd_kernel", "inputs_bwd_kernel"):
        assert any(ours in n for n in names), (ours, sorted(names))
    for fla_kernel in ("chunk_bwd_kernel_dqkwg", "prepare_wy_repr_bwd_kernel", "chunk_bwd_kernel_dv_local",
                       "chunk_gated_delta_rule_bwd_kernel_dhu", "chunk_gated_delta_rule_fwd_kernel_h",
                       "chunk_fwd_kernel_o", "l2norm_fwd_kernel", "l2norm_bwd_kernel", "fused_beta_sigmoid",
                       "gdn_gate_chunk_cumsum", "gdn_gate_bwd_kernel", "chunk_local_cumsum",
                       "chunk_gated_delta_rule_fwd_kkt_solve_kernel"):
        assert not any(fla_kernel in n for n in names), (fla_kernel, sorted(names))


def _step(t, do, flags):
    """One fwd+bwd, outputs detached (a kept output keeps its graph, and the legacy stream's
    AccumulateGrad nodes, alive into a capture)."""
    return {k: (v.detach() if v is not None else None)
            for k, v in _run(gdn.chunk_gated_delta_rule, t, do, None, **flags).items()}


def test_graph_capture_memory_aliasing_stream_determinism(runtime_contract):
    t, do, _, flags = _case("layer_grouped")
    runtime_contract(lambda: _step(t, do, dict(flags, output_final_state=False)))


def test_against_fla_forward_at_production_heads():
    """fla's forward as a second oracle (its backward is refused on Hopper with Triton < 3.7.1)."""
    from kernel_fun._common.compat import fla_symbol

    c = dict(B=2, T=2048, H=16, HV=32, K=128, V=128)
    t = make_inputs(**c, device="cuda")
    kw = dict(use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True, state_v_first=True,
              use_gate_in_kernel=True, A_log=t["A_log"], dt_bias=t["dt_bias"])
    with torch.no_grad():
        o, _ = gdn.chunk_gated_delta_rule(t["q"], t["k"], t["v"], t["g"], t["beta"], **kw)
        o_fla, _ = fla_symbol("fla.ops.gated_delta_rule", "chunk_gated_delta_rule")(
            t["q"], t["k"], t["v"], t["g"], t["beta"], **kw)
    assert _rel(o, o_fla) < 5e-3


# With the l2norm in the op (every case above) the inputs' stages are ours, one launch each way;
# without it, fla's beta sigmoid and gate stages run around the chain: end to end against fp64 with
# the same ceilings, with the gate in the op and with the precomputed gate, and ours did not launch.
@pytest.mark.parametrize("name", ["layer_grouped", "precomputed_gate"])
def test_without_l2norm_against_fp64_naive_recurrence(name):
    from kernel_fun._common.witness import launch_counts

    before = {n: launch_counts().get(n, 0) for n in ("gdn.inputs_fwd", "gdn.inputs_bwd")}
    _against_fp64(name, l2norm=False)
    assert {n: launch_counts().get(n, 0) for n in before} == before


def _inputs_config_pairs():
    """(forward, backward) configurations: the autotuned pair, then every configuration of each kernel
    (CONFIGS and CANDIDATES) paired by position, the shorter list's missing ones autotuned."""
    import itertools

    from kernel_fun.gdn._kernels import inputs_bwd as ib
    from kernel_fun.gdn._kernels import inputs_fwd as i_f

    return [(None, None)] + list(itertools.zip_longest(i_f.CONFIGS + i_f.CANDIDATES, ib.CONFIGS + ib.CANDIDATES))


@pytest.mark.parametrize("config,bwd_config", _inputs_config_pairs(),
                         ids=lambda c: "autotuned" if c is None else config_name(c))
def test_fused_inputs_every_config_against_fla_stages(config, bwd_config):
    """Forward and backward kernels (every configuration of each, paired by position) against fla's
    l2norm, beta sigmoid and gate stages on the layer's bf16 call: column-slice q, k, grouped values."""
    from kernel_fun._common.compat import fla_symbol
    from kernel_fun.gdn import chain
    from kernel_fun.gdn._kernels import inputs_bwd as ib
    from kernel_fun.gdn._kernels.inputs_fwd import inputs_fwd

    B, T, H, HV, K = 2, 1000, 2, 4, 128
    gen = torch.Generator(device="cuda").manual_seed(0)
    r = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    buf = r(B, T, 2 * H * K + HV * K).bfloat16()
    q, k = (buf[..., i * H * K:(i + 1) * H * K].view(B, T, H, K) for i in (0, 1))
    v = buf[..., 2 * H * K:].view(B, T, HV, K)
    g, beta = r(B, T, HV).bfloat16(), r(B, T, HV).bfloat16()
    A_log, dt = torch.rand(HV, device="cuda", generator=gen), r(HV)
    ours = list(inputs_fwd(q, k, v, g, beta, A_log, dt, True, True, 2.0, chain.RCP_LN2, config=config))
    v_out = ours.pop(4)  # ours: (q, q_rstd, k, k_rstd, gc, beta)
    assert v_out.is_contiguous() and torch.equal(v_out, v)
    l2 = fla_symbol("fla.modules.norm.l2norm", "l2norm_fwd")
    (qf, qr), (kf, kr) = l2(q.contiguous()), l2(k.contiguous())
    gf = fla_symbol("fla.ops.gated_delta_rule.gate", "gdn_gate_chunk_cumsum")(
        g=g, A_log=A_log, chunk_size=64, scale=chain.RCP_LN2, dt_bias=dt)
    bf = fla_symbol("fla.ops.common.gate", "fused_beta_sigmoid_fwd")(beta, scale=2.0)
    for n, a, b in zip(("q", "q_rstd", "k", "k_rstd", "gc", "beta"), ours, (qf, qr, kf, kr, gf, bf)):
        assert _rel(a.float(), b.float()) < (2e-3 if n in ("q", "k") else 1e-4), (n, _rel(a.float(), b.float()))
    dq, dk, db, dg = r(B, T, H, K).bfloat16(), r(B, T, H, K).bfloat16(), r(B, T, HV), r(B, T, HV)
    got = ib.inputs_bwd(qf, qr, dq, kf, kr, dk, beta, db, True, 2.0, g, A_log, dt, dg, True, config=bwd_config)
    l2b = fla_symbol("fla.modules.norm.l2norm", "l2norm_bwd")
    want = (l2b(qf, qr, dq), l2b(kf, kr, dk), fla_symbol("fla.ops.common.gate", "fused_beta_sigmoid_bwd")(beta, db, scale=2.0),
            *fla_symbol("fla.ops.gated_delta_rule.gate", "gdn_gate_bwd")(g=g, A_log=A_log, dt_bias=dt, dyg=dg))
    for n, a, b in zip(("dq", "dk", "dbeta", "dg", "dA_log", "ddt_bias"), got, want):
        assert _rel(a.float(), b.float()) < 2e-3, (n, _rel(a.float(), b.float()))


def test_fused_qkv_gradient_written_whole_at_the_layers_heads(graph_replay):
    """The layer's q, k, v (three column slices of its fused conv output) at the layer's heads in
    bf16: the backward writes the fused tensor's gradient whole, bit for bit the three separate
    gradients concatenated, with no concatenation kernel in the step (autograd's split backward did
    not run), and a CUDA graph of the step replays it bit for bit."""
    B, T, H, HV, K, V = 2, 2048, 16, 32, 128, 128
    t = make_inputs(B=B, T=T, H=H, HV=HV, K=K, V=V, device="cuda")
    flags = dict(use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True, state_v_first=True,
                 use_gate_in_kernel=True, A_log=t["A_log"].detach(), dt_bias=t["dt_bias"].detach())
    g, beta = t["g"].detach(), t["beta"].detach()
    base = torch.cat([t[n].detach().flatten(2) for n in ("q", "k", "v")], -1).requires_grad_()
    do = torch.randn(B, T, HV, V, device="cuda").bfloat16()

    def step():
        q, k, v = (x.unflatten(-1, (-1, d)) for x, d in zip(base.split([H * K, H * K, HV * V], -1), (K, K, V)))
        o, _ = gdn.chunk_gated_delta_rule(q, k, v, g, beta, **flags)
        return torch.autograd.grad(o, base, do)[0]

    dense = [t[n].detach().contiguous().requires_grad_() for n in ("q", "k", "v")]
    want = torch.cat([x.flatten(2) for x in torch.autograd.grad(
        gdn.chunk_gated_delta_rule(*dense, g, beta, **flags)[0], dense, do)], -1)
    eager = step()
    assert torch.equal(eager, want)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    names = {e.key for e in prof.key_averages()}
    assert not any("CatArray" in n for n in names), sorted(names)
    static, _ = graph_replay(step)
    assert torch.equal(static, eager)


def test_torch_compile_no_more_breaks_than_fla_and_no_recompile_on_T(compile_counts):
    """The layer's call inside a compiled function, three values of T. Forward only, without
    gradients: fla refuses the backward on Hopper with Triton < 3.7.1. Both ops are kept out of
    traced graphs (``torch.compiler.disable``), so neither may cost more than the other."""
    from kernel_fun._common.compat import fla_symbol

    kw = dict(use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True, state_v_first=True,
              use_gate_in_kernel=True)
    inputs = []
    for T in (256, 384, 1000):
        t = {k: x.detach() for k, x in make_inputs(B=1, T=T, H=2, HV=4, K=128, V=128, device="cuda").items()}
        inputs.append((t["q"], t["k"], t["v"], t["g"], t["beta"], t["A_log"], t["dt_bias"]))

    def layer(op):
        return lambda q, k, v, g, beta, A_log, dt_bias: op(
            q * 1.0, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, **kw)[0] * 2.0

    ours = compile_counts(layer(gdn.chunk_gated_delta_rule), inputs, backward=False)
    fla = compile_counts(layer(fla_symbol("fla.ops.gated_delta_rule", "chunk_gated_delta_rule")), inputs,
                         backward=False)
    print(f"graph breaks / unique graphs: ours {ours}, fla {fla}")
    assert ours[0] <= fla[0]
    assert ours[1] <= fla[1]
