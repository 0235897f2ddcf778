"""The fused WY + intra backward kernel (kda/_kernels/wy_intra_bwd.py) on the CPU, through
Triton's interpreter: the same outputs as the two stage kernels run one after the other with
the matching tile sizes (bit for bit: the same operations in the same order), with each intra
epilogue flag, and against the fp64 stage references at every configuration."""
from __future__ import annotations

import pytest
import torch

from kernel_fun._common.numerics import rel_rms as rel_err
from kernel_fun._common.witness import launch_counts
from kernel_fun.kda import reference_stages as refs
from kernel_fun.kda._kernels import intra_bwd as intra_mod
from kernel_fun.kda._kernels import wy_bwd as wy_mod
from kernel_fun.kda._kernels import wy_intra_bwd as fused_mod

from .test_stage_kernels import BT, CASES, _l2norm, build_chain, stage_inputs


@pytest.fixture(autouse=True)
def poison(poison_outputs):
    poison_outputs(intra_mod, wy_mod)


def _inputs(case, seed=21):
    B, T, H, HV, K, V, cu, decay = case
    cu_t = torch.tensor(cu) if cu is not None else None
    ch = build_chain(B, T, H, HV, K, V, cu=cu_t, decay=decay, seed=seed, beta_max=1.5, h0=True)
    wy_in, _ = stage_inputs(ch, torch.float32, cu_t)
    return wy_in, ch["dAqk"].float(), cu_t


def _halves(config):
    """The stage kernels' configurations that match the fused one's halves."""
    wy = next(c for c in wy_mod.bench_configs() if (c.kwargs["BK"], c.kwargs["BV"], c.kwargs["EARLY_EPI"])
              == (config.kwargs["WBK"], config.kwargs["WBV"], config.kwargs["EARLY_EPI"]))
    intra = next(c for c in intra_mod.configs() if c.kwargs["BK"] == config.kwargs["IBK"]
                 and c.kwargs["HOIST_S"] == config.kwargs["HOIST_S"] and not getattr(c, "maxnreg", None))
    return wy, intra


def _sequential(wy_in, dAqk, wy_cfg, intra_cfg, **extra):
    dq, dk, dv, db, dg, dAkk = wy_mod.wy_dqkg_bwd(**wy_in, config=wy_cfg)
    out = intra_mod.intra_bwd(q=wy_in["q"], k=wy_in["k"], g=wy_in["g"], beta=wy_in["beta"], dAqk=dAqk, dAkk=dAkk,
                              dq=dq, dk=dk, db=db, dg=dg, cu_seqlens=wy_in["cu_seqlens"], chunk_size=BT,
                              config=intra_cfg, **extra)
    return (out[0], out[1], dv, *out[2:])


@pytest.mark.parametrize("case", CASES, ids=["fixed", "grouped-strong", "varlen-strong"])
def test_fused_equals_the_two_stage_kernels(case):
    wy_in, dAqk, _ = _inputs(case)
    config = fused_mod.configs()[0]
    want = _sequential(wy_in, dAqk, *_halves(config))
    before = launch_counts("kda.")
    got = fused_mod.wy_intra_bwd(**wy_in, dAqk=dAqk, config=config)
    after = launch_counts("kda.")
    assert after.get("kda.wy_intra_bwd", 0) == before.get("kda.wy_intra_bwd", 0) + 1
    assert sum(after.values()) == sum(before.values()) + 1  # one launch, no stage kernel
    assert len(got) == 5
    for name, o, w in zip(("dq", "dk", "dv", "db", "dg"), got, want):
        assert o.shape == w.shape and o.dtype == w.dtype, name
        assert torch.isfinite(o).all(), name
        assert torch.equal(o, w), (name, rel_err(o, w))


def test_fused_with_the_intra_epilogues():
    """The l2norm backward (H == HV, whole-K intra block), and the dg reverse cumsum with the
    gate backward: as the two stage kernels give them."""
    case = (1, 150, 2, 2, 64, 16, [0, 40, 41, 150], "strong")
    wy_in, dAqk, _ = _inputs(case, seed=23)
    B, T, H, HV, K = 1, 150, 2, 2, 64
    gen = torch.Generator().manual_seed(5)
    (yq, rq), (yk, rk) = (_l2norm(torch.randn(B, T, H, K, generator=gen, dtype=torch.float64) * 3)
                          for _ in range(2))
    wy_in["q"], wy_in["k"] = yq.float(), yk.float()
    g_raw = (torch.randn(B, T, HV, K, generator=gen) * 4).to(torch.float16)
    A_log = torch.randn(HV, generator=gen)
    dt_bias = torch.randn(HV * K, generator=gen)
    config = fused_mod.configs()[0]
    for extra in (dict(l2norm_rstd=(rq.float(), rk.float()), out_dtype=torch.float16),
                  dict(l2norm_rstd=(rq.float(), rk.float()), out_dtype=torch.float16, dg_reverse_cumsum=True,
                       gate_bwd=(g_raw, A_log, dt_bias))):
        want = _sequential(wy_in, dAqk, *_halves(config), **extra)
        got = fused_mod.wy_intra_bwd(**wy_in, dAqk=dAqk, config=config, **extra)
        assert len(got) == len(want)
        for i, (o, w) in enumerate(zip(got, want)):
            assert o.dtype == w.dtype and torch.isfinite(o).all(), i
            assert torch.equal(o, w), (i, rel_err(o, w))


def test_fused_epilogue_needs_whole_k_intra_block():
    case = (1, 100, 1, 1, 128, 16, None, "normal")
    wy_in, dAqk, _ = _inputs(case)
    small = next(c for c in fused_mod.configs() if c.kwargs["IBK"] < 128)
    with pytest.raises(ValueError, match="covering K"):
        fused_mod.wy_intra_bwd(**wy_in, dAqk=dAqk, config=small, dg_reverse_cumsum=True)


def _ids(cfgs):
    return [f"{i}:" + ",".join(f"{k}={v}" for k, v in c.kwargs.items()) for i, c in enumerate(cfgs)]


@pytest.mark.parametrize("config", fused_mod.configs(), ids=_ids(fused_mod.configs()))
def test_fused_every_config_against_references(config):
    case = (1, 150, 1, 2, 64, 32, [0, 30, 150], "strong")
    wy_in, dAqk, cu_t = _inputs(case, seed=12)
    got = fused_mod.wy_intra_bwd(**wy_in, dAqk=dAqk, config=config)
    r = refs.wy_dqkg_bwd_reference(**wy_in)
    rq, rk, rb, rg = refs.intra_bwd_reference(wy_in["q"], wy_in["k"], wy_in["g"], wy_in["beta"], dAqk, r[5], r[0],
                                              r[1], r[3], r[4], cu_seqlens=cu_t, chunk_size=BT)
    for name, o, ref in zip(("dq", "dk", "dv", "db", "dg"), got, (rq, rk, r[2], rb, rg)):
        assert torch.isfinite(o).all(), name
        assert rel_err(o, ref) < 1e-5, (name, rel_err(o, ref))
