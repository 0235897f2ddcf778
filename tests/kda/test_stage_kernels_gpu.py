"""KDA backward stage kernels on the GPU (bf16): ours against fla's own stage function and
against the fp64 stage reference, at a T that is not a multiple of 64, with grouped values,
with packed documents, and for every autotune configuration forced once (Triton 3.4-3.7.0
miscompiles some dot patterns on Hopper per configuration, so each one is checked).

Stage inputs come from fla's forward pieces and the backward stages before these two, as
fla's chain calls them (``fla/ops/kda/chunk_bwd.py``)."""
from __future__ import annotations

import pytest
import torch

from kernel_fun._common.witness import launch_counts
from kernel_fun.kda import reference_stages as refs

pytestmark = pytest.mark.gpu

RCP_LN2 = 1.4426950408889634
BT = 64
# fla's own tolerances for the op (kda: dq/dk/dv 8e-3, dg/db 2e-2) as the ceiling; dA
# (the gradient of L) is an intermediate with the looser one.
TOL = dict(dq=8e-3, dk=8e-3, dv=8e-3, db=2e-2, dg=2e-2, dA=2e-2)


from kernel_fun._common.numerics import rel_rms as rel_err  # noqa: E402


def build_stage_inputs(B, T, H, HV, K, V, cu=None, strong=False, seed=0):
    """(wy_inputs, fla's wy outputs, intra_inputs) built with fla's own stages, bf16."""
    from fla.ops.common.chunk_delta_h import chunk_gated_delta_rule_bwd_dhu, chunk_gated_delta_rule_fwd_h
    from fla.ops.kda.chunk_bwd import chunk_kda_bwd_dAv, chunk_kda_bwd_wy_dqkg_fused
    from fla.ops.kda.chunk_intra import chunk_kda_fwd_intra
    from fla.ops.kda.wy_fast import recompute_w_u_fwd
    from fla.ops.utils import chunk_local_cumsum
    from fla.ops.utils.index import prepare_chunk_indices, prepare_chunk_offsets

    gen = torch.Generator(device="cuda").manual_seed(seed)
    dev, bf = "cuda", torch.bfloat16

    def rn(*s):
        return torch.randn(*s, device=dev, generator=gen)

    q = torch.nn.functional.normalize(rn(B, T, H, K), dim=-1).to(bf)
    k = torch.nn.functional.normalize(rn(B, T, H, K), dim=-1).to(bf)
    v = rn(B, T, HV, V).to(bf)
    if strong:  # per-token log decay spread down to -20
        g_raw = -20.0 * torch.rand(B, T, HV, K, device=dev, generator=gen) ** 2
    else:
        g_raw = torch.nn.functional.logsigmoid(rn(B, T, HV, K) + 2.0)
    beta = torch.rand(B, T, HV, device=dev, generator=gen).to(bf)
    do = rn(B, T, HV, V).to(bf)
    scale = K ** -0.5
    cu_t = None if cu is None else torch.tensor(cu, device=dev, dtype=torch.int32)
    ci = None if cu_t is None else prepare_chunk_indices(cu_t, BT)
    co = None if cu_t is None else prepare_chunk_offsets(cu_t, BT)
    gc = chunk_local_cumsum(g_raw, chunk_size=BT, scale=RCP_LN2, cu_seqlens=cu_t, chunk_indices=ci)
    _, _, _, _, Aqk, Akk = chunk_kda_fwd_intra(q=q, k=k, v=v, gk=gc, beta=beta, scale=scale, cu_seqlens=cu_t,
                                               chunk_size=BT, chunk_indices=ci)
    w, u, qg, kg = recompute_w_u_fwd(q=q, k=k, v=v, beta=beta, A=Akk, gk=gc, cu_seqlens=cu_t, chunk_indices=ci)
    h, v_new, _ = chunk_gated_delta_rule_fwd_h(k=kg, w=w, u=u, gk=gc, initial_state=None, output_final_state=False,
                                               cu_seqlens=cu_t, chunk_indices=ci, chunk_offsets=co, chunk_size=BT)
    dAqk, dv = chunk_kda_bwd_dAv(q=q, k=k, v=v_new, do=do, A=Aqk, scale=scale, cu_seqlens=cu_t, chunk_size=BT,
                                 chunk_indices=ci)
    dh, _, dv = chunk_gated_delta_rule_bwd_dhu(q=qg, k=kg, w=w, gk=gc, h0=None, dht=None, do=do, dv=dv, scale=scale,
                                               cu_seqlens=cu_t, chunk_size=BT, chunk_indices=ci, chunk_offsets=co)
    wy_in = dict(q=q, k=k, v=v, v_new=v_new, g=gc, beta=beta, A=Akk, h=h, do=do, dh=dh, dv=dv, scale=scale,
                 cu_seqlens=cu_t, chunk_size=BT, chunk_indices=ci, chunk_offsets=co)
    fla_wy = chunk_kda_bwd_wy_dqkg_fused(**wy_in)
    dq, dk, _, db, dg, dAkk = fla_wy
    intra_in = dict(q=q, k=k, g=gc, beta=beta, dAqk=dAqk, dAkk=dAkk, dq=dq, dk=dk, db=db, dg=dg, cu_seqlens=cu_t,
                    chunk_indices=ci, chunk_size=BT)
    return wy_in, fla_wy, intra_in


CASES = {
    "tail": dict(B=2, T=1000, H=4, HV=4, K=128, V=128),
    "grouped_strong": dict(B=1, T=700, H=2, HV=4, K=128, V=256, strong=True),
    "varlen": dict(B=1, T=1000, H=2, HV=4, K=128, V=128, cu=[0, 1, 100, 164, 700, 1000]),
}

_inputs_cache: dict = {}
_ref_cache: dict = {}


def _inputs(name):
    if name not in _inputs_cache:
        _inputs_cache[name] = build_stage_inputs(**CASES[name])
    return _inputs_cache[name]


def _refs(name):
    """(wy reference, intra reference, fla's intra outputs) of a case, computed once."""
    if name not in _ref_cache:
        from fla.ops.kda.chunk_intra import chunk_kda_bwd_intra

        wy_in, _, intra_in = _inputs(name)
        _ref_cache[name] = (refs.wy_dqkg_bwd_reference(**wy_in), refs.intra_bwd_reference(**intra_in),
                            chunk_kda_bwd_intra(**intra_in))
    return _ref_cache[name]


def _check(name, ours, fla_out, ref, names):
    lines = []
    for n, o, f, r in zip(names, ours, fla_out, ref):
        assert o.shape == f.shape and o.dtype == f.dtype, (n, o.shape, f.shape, o.dtype, f.dtype)
        assert torch.isfinite(o).all(), f"{name}/{n}: non-finite"
        e_ref, e_fla_ref, e_fla = rel_err(o, r), rel_err(f, r), rel_err(o, f)
        lines.append(f"{n}: ours-ref {e_ref:.2e}  fla-ref {e_fla_ref:.2e}  ours-fla {e_fla:.2e}")
        # within fla's tolerance of the fp64 reference, and not much worse than fla itself
        assert e_ref < TOL[n] and e_ref < 2 * e_fla_ref + 1e-3, f"{name}/{n}: " + lines[-1]
    print(f"[{name}] " + " | ".join(lines))


@pytest.mark.parametrize("name", list(CASES))
def test_wy_bwd_against_fla_and_reference(name):
    from kernel_fun.kda._kernels.wy_bwd import wy_dqkg_bwd

    wy_in, fla_wy, _ = _inputs(name)
    before = launch_counts("kda.")
    ours = wy_dqkg_bwd(**wy_in)
    torch.cuda.synchronize()
    assert launch_counts("kda.").get("kda.wy_bwd", 0) == before.get("kda.wy_bwd", 0) + 1
    ref = _refs(name)[0]
    _check(name, ours, fla_wy, ref, ("dq", "dk", "dv", "db", "dg", "dA"))


@pytest.mark.parametrize("name", list(CASES))
def test_intra_bwd_against_fla_and_reference(name):
    from kernel_fun.kda._kernels.intra_bwd import intra_bwd

    _, _, intra_in = _inputs(name)
    before = launch_counts("kda.")
    ours = intra_bwd(**intra_in)
    torch.cuda.synchronize()
    assert launch_counts("kda.").get("kda.intra_bwd", 0) == before.get("kda.intra_bwd", 0) + 1
    _, ref, fla_out = _refs(name)
    _check(name, ours, fla_out, ref, ("dq", "dk", "db", "dg"))


@pytest.mark.parametrize("name", list(CASES))
def test_intra_bwd_one_anchor_against_fla_and_reference(name):
    """The diagonal blocks by one anchor where the gate allows (as the chain calls it: fp32 dots),
    autotuned and at every configuration's block size, against fla and the fp64 reference;
    with gate_monotone the same bits."""
    from kernel_fun.kda._kernels.intra_bwd import CANDIDATES, CONFIGS, FAST_RANGE
    from kernel_fun.kda._kernels.intra_bwd import intra_bwd as _intra
    from kernel_fun.kda.chain import INTRA_BWD_DOTS

    def intra_bwd(**kw):
        return _intra(**kw, dot_precision=INTRA_BWD_DOTS)

    _, _, intra_in = _inputs(name)
    _, ref, fla_out = _refs(name)
    _check(f"{name}/anchor", intra_bwd(**intra_in, fast_range=FAST_RANGE), fla_out, ref, ("dq", "dk", "db", "dg"))
    g, cu = intra_in["g"], intra_in.get("cu_seqlens")
    starts = torch.zeros(g.shape[1], dtype=torch.bool, device=g.device)  # rows that begin a chunk
    for s0, e0 in (zip(cu[:-1].tolist(), cu[1:].tolist()) if cu is not None else [(0, g.shape[1])]):
        starts[s0:e0:BT] = True
    exactly_monotone = bool(((g[:, 1:] <= g[:, :-1]) | starts[1:, None, None]).all())
    for config in CONFIGS + CANDIDATES:
        anc = intra_bwd(**intra_in, fast_range=FAST_RANGE, config=config)
        _check(f"{name}/anchor/{config}", anc, fla_out, ref, ("dq", "dk", "db", "dg"))
        # the gate here is a chunk cumsum of log decays <= 0: its range from the blocks' ends;
        # the same bits where fla's cumsum came out exactly non-increasing (else within TOL)
        mono = intra_bwd(**intra_in, fast_range=FAST_RANGE, gate_monotone=True, config=config)
        _check(f"{name}/anchor+monotone/{config}", mono, fla_out, ref, ("dq", "dk", "db", "dg"))
        if exactly_monotone:
            assert all(torch.equal(a, b) for a, b in zip(anc, mono)), config


def _intra_configs():
    from kernel_fun.kda._kernels.intra_bwd import CANDIDATES, CONFIGS

    return CONFIGS + CANDIDATES


def _wy_configs():
    from kernel_fun.kda._kernels.wy_bwd import CANDIDATES, CONFIGS

    return CONFIGS + CANDIDATES


def _ids(cfgs):
    return [f"{i}:" + ",".join(f"{k}={v}" for k, v in c.kwargs.items()) + f",w{c.num_warps},s{c.num_stages}"
            + (f",r{c.maxnreg}" if getattr(c, "maxnreg", None) else "") for i, c in enumerate(cfgs)]


@pytest.mark.parametrize("config", _intra_configs(), ids=_ids(_intra_configs()))
@pytest.mark.parametrize("name", ["tail", "varlen"])
def test_intra_bwd_every_config(name, config):
    """Every configuration in the chain's dot precision (fp32; the default tf32 is autotuned above)."""
    from kernel_fun.kda._kernels.intra_bwd import intra_bwd
    from kernel_fun.kda.chain import INTRA_BWD_DOTS

    _, _, intra_in = _inputs(name)
    ours = intra_bwd(**intra_in, config=config, dot_precision=INTRA_BWD_DOTS)
    _, ref, fla_out = _refs(name)
    _check(f"{name}/{config}", ours, fla_out, ref, ("dq", "dk", "db", "dg"))


@pytest.mark.parametrize("config", _wy_configs(), ids=_ids(_wy_configs()))
@pytest.mark.parametrize("name", ["tail", "varlen"])
def test_wy_bwd_every_config(name, config):
    from kernel_fun.kda._kernels.wy_bwd import wy_dqkg_bwd

    from triton.runtime.errors import OutOfResources

    wy_in, fla_wy, _ = _inputs(name)
    try:
        ours = wy_dqkg_bwd(**wy_in, config=config)
    except OutOfResources as e:  # the autotuner skips such a configuration too
        pytest.skip(f"does not fit on this GPU: {e}")
    ref = _refs(name)[0]
    _check(f"{name}/{config}", ours, fla_wy, ref, ("dq", "dk", "dv", "db", "dg", "dA"))


def test_stages_deterministic_and_no_aliasing():
    from kernel_fun.kda._kernels.intra_bwd import intra_bwd
    from kernel_fun.kda._kernels.wy_bwd import wy_dqkg_bwd

    wy_in, _, intra_in = _inputs("varlen")
    a = wy_dqkg_bwd(**wy_in)
    b = wy_dqkg_bwd(**wy_in)
    for x, y in zip(a, b):
        assert torch.equal(x, y) and x.data_ptr() != y.data_ptr()
    snapshot = [intra_in[n].clone() for n in ("dq", "dk", "db", "dg")]
    c = intra_bwd(**intra_in)
    d = intra_bwd(**intra_in)
    for x, y in zip(c, d):
        assert torch.equal(x, y) and x.data_ptr() != y.data_ptr()
    for n, s in zip(("dq", "dk", "db", "dg"), snapshot):
        assert torch.equal(intra_in[n], s), f"intra_bwd modified its input {n}"


@pytest.mark.parametrize("varlen", [False, True], ids=["fixed", "varlen"])
def test_gate_bwd_against_fla_every_config(varlen):
    """kda/_kernels/gate_bwd.py (the chain's gate pass): dg's
    chunk-local reverse cumsum and the gate's backward in one pass, against fla's
    chunk_local_cumsum(reverse=True) + kda_gate_bwd on the same inputs and against the fp64
    reference, autotuned and at every configuration; deterministic."""
    from fla.ops.kda.gate import kda_gate_bwd
    from fla.ops.utils import chunk_local_cumsum
    from fla.ops.utils.index import prepare_chunk_indices

    from kernel_fun.kda._kernels.gate_bwd import CANDIDATES, CONFIGS, dg_cumsum_gate_bwd

    gen = torch.Generator(device="cuda").manual_seed(5)
    B, T, HV, K = (1, 1000, 4, 128) if varlen else (2, 700, 4, 128)
    cu = torch.tensor([0, 1, 300, 365, 1000], device="cuda", dtype=torch.int32) if varlen else None
    ci = prepare_chunk_indices(cu, BT) if varlen else None
    dg = torch.randn(B, T, HV, K, device="cuda", generator=gen)
    g = (torch.randn(B, T, HV, K, device="cuda", generator=gen) * 8).to(torch.bfloat16)
    A_log = torch.randn(HV, device="cuda", generator=gen)
    dt_bias = torch.randn(HV * K, device="cuda", generator=gen)
    dyg = chunk_local_cumsum(dg, chunk_size=BT, reverse=True, cu_seqlens=cu, chunk_indices=ci)
    fla = kda_gate_bwd(g=g, A_log=A_log, dt_bias=dt_bias, dyg=dyg)
    ref = refs.dg_cumsum_gate_bwd_reference(dg, g, A_log, dt_bias, cu_seqlens=cu, chunk_size=BT)
    for config in [None] + CONFIGS + CANDIDATES:
        ours = dg_cumsum_gate_bwd(dg, g, A_log, dt_bias, cu_seqlens=cu, chunk_size=BT, chunk_indices=ci, config=config)
        for n, o, f, r in zip(("dg", "dA_log", "ddt_bias"), ours, fla, ref):
            assert o.dtype == f.dtype and o.shape == f.shape, (n, o.dtype, f.dtype)
            assert torch.isfinite(o).all(), (config, n)
            tol = 8e-3 if n == "dg" else 1e-3  # dg in bf16; the sums in fp32, reduced in another order
            assert rel_err(o, f) < tol and rel_err(o, r) < tol, (config, n, rel_err(o, f), rel_err(o, r))
        cs, _, _ = dg_cumsum_gate_bwd(dg, cu_seqlens=cu, chunk_size=BT, chunk_indices=ci, config=config)
        assert rel_err(cs, dyg) < 1e-5, (config, rel_err(cs, dyg))
    a, b = (dg_cumsum_gate_bwd(dg, g, A_log, dt_bias, cu_seqlens=cu, chunk_size=BT, chunk_indices=ci)
            for _ in range(2))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
