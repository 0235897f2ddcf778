"""KDA's score gradient (_delta/_kernels/score_grad.py) through Triton's interpreter against the
fp64 reference of fla's chunk_kda_bwd_dAv (its dA half). Outputs NaN-poisoned: every row of
every sequence must be written, zeros above the diagonal included."""
from __future__ import annotations

import pytest
import torch

from kernel_fun._common.numerics import rel_rms
from kernel_fun._common.witness import launch_counts
from kernel_fun._delta._kernels.score_grad import CANDIDATES, CONFIGS, score_grad_bwd
from kernel_fun.kda.reference_stages import dAv_reference

BT = 64
SCALE = 0.3


@pytest.fixture(autouse=True)
def poison(poison_outputs):
    pass


def _inputs(B, T, HV, V, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    v = torch.randn(B, T, HV, V, generator=gen).to(dtype)
    do = torch.randn(B, T, HV, V, generator=gen).to(dtype)
    return v, do


CASES = {
    "tail": dict(B=2, T=130, HV=2, V=64),
    "varlen": dict(B=1, T=170, HV=2, V=96, cu=[0, 1, 37, 100, 170]),  # a 1-token document; V = 96: a masked V block
}


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("name", list(CASES))
def test_score_grad_matches_reference(name, dtype):
    c = dict(CASES[name])
    cu = c.pop("cu", None)
    cu_t = None if cu is None else torch.tensor(cu)
    v, do = _inputs(**c, dtype=dtype)
    before = launch_counts("delta.").get("delta.score_grad", 0)
    dA = score_grad_bwd(v, do, SCALE, cu_seqlens=cu_t, chunk_size=BT)
    assert launch_counts("delta.").get("delta.score_grad", 0) == before + 1
    want, _ = dAv_reference(v, do, torch.zeros(*v.shape[:3], BT), SCALE, cu_seqlens=cu_t, chunk_size=BT)
    assert dA.dtype == torch.float32 and dA.shape == want.shape
    assert torch.isfinite(dA).all(), "unwritten (NaN-poisoned) elements"
    err = rel_rms(dA, want)
    assert err < (1e-6 if dtype == torch.float32 else 2e-3), err
    # zero above the diagonal (and past a partial chunk's rows), exactly
    assert torch.equal(dA[want == 0], torch.zeros_like(dA[want == 0]))


@pytest.mark.parametrize("config", CONFIGS + CANDIDATES, ids=lambda c: f"BV{c.kwargs['BV']}-w{c.num_warps}-s{c.num_stages}")
def test_score_grad_every_config(config):
    c = dict(CASES["varlen"])
    cu_t = torch.tensor(c.pop("cu"))
    v, do = _inputs(**c, dtype=torch.float32)
    dA = score_grad_bwd(v, do, SCALE, cu_seqlens=cu_t, chunk_size=BT, config=config)
    want, _ = dAv_reference(v, do, torch.zeros(*v.shape[:3], BT), SCALE, cu_seqlens=cu_t, chunk_size=BT)
    assert rel_rms(dA, want) < 1e-6


def test_reference_dA_is_the_gradient_of_the_intra_output():
    """dAqk is d loss / d Aqk for o_intra = tril(Aqk) v_new and loss = <do, o_intra>; dv is
    d loss / d v_new: autograd in fp64 on one chunk."""
    gen = torch.Generator().manual_seed(1)
    B, T, HV, V = 1, 50, 2, 8
    v = torch.randn(B, T, HV, V, generator=gen, dtype=torch.float64, requires_grad=True)
    do = torch.randn(B, T, HV, V, generator=gen, dtype=torch.float64)
    A = torch.randn(B, T, HV, BT, generator=gen, dtype=torch.float64, requires_grad=True)
    tri = torch.tril(torch.ones(T, T, dtype=torch.float64))
    o = torch.einsum("bihj,ij,bjhv->bihv", A[..., :T], tri, v)
    gA, gv = torch.autograd.grad(o, (A, v), do)
    dA, dv = dAv_reference(v.detach(), do, A.detach(), 1.0, chunk_size=BT)
    assert torch.allclose(dA, gA) and torch.allclose(dv, gv)


def test_argument_errors():
    v, do = _inputs(1, 10, 1, 16, torch.float32)
    with pytest.raises(ValueError, match="shape"):
        score_grad_bwd(v, do[..., :8], SCALE)
    with pytest.raises(ValueError, match="chunk_size"):
        score_grad_bwd(v, do, SCALE, chunk_size=128)
    with pytest.raises(ValueError, match="B == 1"):
        score_grad_bwd(torch.cat([v, v]), torch.cat([do, do]), SCALE, cu_seqlens=torch.tensor([0, 10]))
