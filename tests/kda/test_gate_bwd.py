"""KDA's gate backward pass (kda/_kernels/gate_bwd.py: the chunk-local reverse cumsum of dg and
the gate function's backward in one pass) through Triton's interpreter against the fp64
reference of fla's chunk_local_cumsum(reverse=True) + kda_gate_bwd. Outputs NaN-poisoned:
every valid row must be written, and the sums must not read an unwritten partial."""
from __future__ import annotations

import pytest
import torch

from kernel_fun._common.numerics import rel_rms
from kernel_fun._common.witness import launch_counts
from kernel_fun.kda._kernels.gate_bwd import CANDIDATES, CONFIGS, dg_cumsum_gate_bwd
from kernel_fun.kda.reference_stages import dg_cumsum_gate_bwd_reference

BT = 64


@pytest.fixture(autouse=True)
def poison(poison_outputs):
    pass


# Small grids (8 and 16 programs): the interpreter runs each row of each program op by op.
CASES = {
    "tail": dict(B=2, T=70, HV=1, K=64),  # a full chunk and a 6-row tail; K = 64 over BK = 32: two K blocks
    # a 1-token document, one across a chunk boundary ending mid-chunk, a masked K block
    "varlen": dict(B=1, T=100, HV=2, K=48, cu=[0, 1, 80, 100]),
}


def _inputs(B, T, HV, K, dtype, seed=0, bias=True):
    gen = torch.Generator().manual_seed(seed)
    dg = torch.randn(B, T, HV, K, generator=gen)
    g = (torch.randn(B, T, HV, K, generator=gen) * 8).to(dtype)  # some past softplus' 20
    A_log = torch.randn(HV, generator=gen)
    dt_bias = torch.randn(HV * K, generator=gen) if bias else None
    return dg, g, A_log, dt_bias


@pytest.mark.parametrize("name", list(CASES))
def test_reverse_cumsum_alone(name):
    """Without the gate: fla's chunk_local_cumsum(dg, reverse=True), fp32, chunks counted from
    each sequence start."""
    c = dict(CASES[name])
    cu = c.pop("cu", None)
    cu_t = None if cu is None else torch.tensor(cu)
    dg, *_ = _inputs(**c, dtype=torch.float32)
    before = launch_counts("kda.").get("kda.gate_bwd", 0)
    out, dA_log, ddt_bias = dg_cumsum_gate_bwd(dg, cu_seqlens=cu_t, chunk_size=BT)
    assert launch_counts("kda.").get("kda.gate_bwd", 0) == before + 1
    want, _, _ = dg_cumsum_gate_bwd_reference(dg, cu_seqlens=cu_t, chunk_size=BT)
    assert out.dtype == torch.float32 and dA_log is None and ddt_bias is None
    assert torch.isfinite(out).all()
    assert rel_rms(out, want) < 1e-6, rel_rms(out, want)


# every dtype with and without dt_bias on the packed documents; the tail case once each way
GATE_CASES = [("varlen", dt, bias) for dt in (torch.float16, torch.bfloat16, torch.float32) for bias in (True, False)]
GATE_CASES += [("tail", torch.float32, True), ("tail", torch.bfloat16, False)]


@pytest.mark.parametrize("name,dtype,bias", GATE_CASES, ids=[
    f"{n}-{str(dt).removeprefix('torch.')}-{'dt_bias' if b else 'no_dt_bias'}" for n, dt, b in GATE_CASES])
def test_with_the_gate(name, dtype, bias):
    """With the raw gate: dg_raw in g's dtype, dA_log in A_log's, ddt_bias in dt_bias's, against
    autograd through -exp(A_log) softplus(g + dt_bias) in fp64 fed the reverse cumsum."""
    c = dict(CASES[name])
    cu = c.pop("cu", None)
    cu_t = None if cu is None else torch.tensor(cu)
    dg, g, A_log, dt_bias = _inputs(**c, dtype=dtype, bias=bias)
    out, dA_log, ddt_bias = dg_cumsum_gate_bwd(dg, g, A_log, dt_bias, cu_seqlens=cu_t, chunk_size=BT)
    want = dg_cumsum_gate_bwd_reference(dg, g, A_log, dt_bias, cu_seqlens=cu_t, chunk_size=BT)
    assert out.dtype == dtype and dA_log.dtype == A_log.dtype and dA_log.shape == A_log.shape
    assert torch.isfinite(out).all() and torch.isfinite(dA_log).all()
    tol = {torch.float16: 1e-3, torch.bfloat16: 8e-3, torch.float32: 1e-6}[dtype]  # dg_raw's own rounding
    assert rel_rms(out, want[0]) < tol, rel_rms(out, want[0])
    assert rel_rms(dA_log, want[1]) < 1e-5, rel_rms(dA_log, want[1])
    if bias:
        assert ddt_bias.dtype == dt_bias.dtype and ddt_bias.shape == dt_bias.shape
        assert rel_rms(ddt_bias, want[2]) < 1e-5, rel_rms(ddt_bias, want[2])
    else:
        assert ddt_bias is None


@pytest.mark.parametrize("config", CONFIGS + CANDIDATES, ids=lambda c: f"BK{c.kwargs['BK']}w{c.num_warps}")
def test_every_configuration(config):
    """Each configuration the autotuner may pick (K blocks larger than K included), forced."""
    c = dict(CASES["varlen"])
    cu_t = torch.tensor(c.pop("cu"))
    dg, g, A_log, dt_bias = _inputs(**c, dtype=torch.float16)
    out = dg_cumsum_gate_bwd(dg, g, A_log, dt_bias, cu_seqlens=cu_t, chunk_size=BT, config=config)
    want = dg_cumsum_gate_bwd_reference(dg, g, A_log, dt_bias, cu_seqlens=cu_t, chunk_size=BT)
    assert rel_rms(out[0], want[0]) < 1e-3
    assert rel_rms(out[1], want[1]) < 1e-5 and rel_rms(out[2], want[2]) < 1e-5


def test_deterministic():
    dg, g, A_log, dt_bias = _inputs(**CASES["tail"], dtype=torch.float16)
    a = dg_cumsum_gate_bwd(dg, g, A_log, dt_bias, chunk_size=BT)
    b = dg_cumsum_gate_bwd(dg, g, A_log, dt_bias, chunk_size=BT)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_argument_errors():
    dg, g, A_log, dt_bias = _inputs(1, 10, 2, 16, torch.float16)
    with pytest.raises(ValueError, match="dg must be"):
        dg_cumsum_gate_bwd(dg[0])
    with pytest.raises(ValueError, match="chunk_size"):
        dg_cumsum_gate_bwd(dg, chunk_size=128)
    with pytest.raises(ValueError, match="A_log"):
        dg_cumsum_gate_bwd(dg, g, None)
    with pytest.raises(ValueError, match="dt_bias"):
        dg_cumsum_gate_bwd(dg, g, A_log, dt_bias[:-1])
    with pytest.raises(ValueError, match="B == 1"):
        dg_cumsum_gate_bwd(torch.cat([dg, dg]), cu_seqlens=torch.tensor([0, 10]))
