"""The KDA intra-chunk forward kernel (Aqk and Akk = (I + L)^-1 in one pass) through Triton's
interpreter against the fp64 intra stage reference (``_delta/reference.intra_ref``), whose
chunked stages are checked against the token-by-token recurrence in tests/delta.
Outputs are NaN-poisoned: every row of a sequence must be written, all 64 columns."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernel_fun._common.numerics import rel_rms
from kernel_fun._common.witness import launch_counts
from kernel_fun._delta import reference as ref
from kernel_fun.kda._kernels import intra_fwd as mod

BT = 64
SCALE = 0.3


@pytest.fixture(autouse=True)
def poison(poison_outputs):
    poison_outputs(mod)


def _case(B, T, H, HV, K, cu=None, decay=1.0, beta_max=1.0, seed=0):
    gen = torch.Generator().manual_seed(seed)
    f64 = torch.float64
    q = F.normalize(torch.randn(B, T, H, K, generator=gen, dtype=f64), dim=-1)
    k = F.normalize(torch.randn(B, T, H, K, generator=gen, dtype=f64), dim=-1)
    beta = beta_max * torch.rand(B, T, HV, generator=gen, dtype=f64)
    graw = decay * F.logsigmoid(torch.randn(B, T, HV, K, generator=gen, dtype=f64) + 1.0)
    cu_t = None if cu is None else torch.tensor(cu)
    gk = ref.chunk_local_cumsum_ref(graw, BT, cu_t, dtype=torch.float32)
    v = torch.zeros(B, T, HV, 1, dtype=f64)
    want = ref.intra_ref(q, k, v, beta, gk=gk, scale=SCALE, chunk_size=BT, cu_seqlens=cu_t)
    return q, k, gk, beta, cu_t, want


CASES = {
    "fixed_grouped": dict(B=2, T=130, H=1, HV=2, K=32),
    "k128_tail": dict(B=1, T=100, H=2, HV=2, K=128),
    "varlen_k64": dict(B=1, T=200, H=1, HV=2, K=64, cu=[0, 1, 64, 80, 150, 200]),
    "strong_decay_beta2": dict(B=1, T=128, H=1, HV=1, K=64, decay=12.0, beta_max=2.0),
    # gate spreads (log2) past FAST_RANGE (60) over 64 rows but within it over 32 (decay 1.5)
    # or over 16 rows only (decay 3): block anchors of 32 / 16 rows, bit levels above them
    "blocks32_decay1p5": dict(B=1, T=150, H=1, HV=2, K=64, decay=1.5, beta_max=1.5),
    "blocks16_decay3": dict(B=1, T=150, H=1, HV=2, K=64, decay=3.0, beta_max=1.5),
    # a tail chunk of 5 rows under strong decay: the sub-chunks past the end must not meet
    # the exponent of a gate difference across the chunk (inf * 0 -> NaN in the solve)
    "strong_decay_tail": dict(B=1, T=69, H=1, HV=1, K=64, decay=40.0),
}


@pytest.mark.parametrize("path", ["auto", "levels"])
@pytest.mark.parametrize("solve", ["ieee", "tf32x3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("name", list(CASES))
def test_intra_fwd_matches_reference(name, dtype, solve, path):
    """Every case, both input dtypes; the inverse's products on the FMA units (ieee, the
    default) or on the tensor cores (tf32x3; fp32 inputs run ieee whatever is asked); the
    scores by the path each chunk picks (one anchor where its gate spread allows) or by the
    bit levels for every chunk."""
    c = dict(CASES[name])
    q, k, gk, beta, cu_t, want = _case(**c)
    before = launch_counts("kda.").get("kda.intra_fwd", 0)
    Aqk, Akk = mod.intra_fwd(q.to(dtype), k.to(dtype), gk, beta.to(dtype), SCALE, cu_seqlens=cu_t,
                             solve_precision=solve, fast_range=None if path == "auto" else -1.0)
    assert launch_counts("kda.").get("kda.intra_fwd", 0) == before + 1
    assert Aqk.dtype == dtype and Akk.dtype == dtype
    rows = slice(None) if cu_t is None else slice(0, int(cu_t[-1]))
    tol = 1e-5 if dtype == torch.float32 else 3e-3
    for n, got, exp in (("Aqk", Aqk, want["Aqk"]), ("Akk", Akk, want["Akk"])):
        got, exp = got[:, rows], exp[:, rows]
        assert torch.isfinite(got).all(), f"{n}: unwritten (NaN) or non-finite"
        err = rel_rms(got, exp)
        assert err < tol, f"{n}: rel rms {err:.2e}"


@pytest.mark.parametrize("name,fast", [("fixed_grouped", True), ("varlen_k64", True), ("blocks32_decay1p5", True),
                                       ("blocks16_decay3", True), ("strong_decay_beta2", False),
                                       ("strong_decay_tail", False)])
def test_the_block_anchors_are_taken_where_the_gate_spread_allows(name, fast):
    """Where a chunk's gate stays within FAST_RANGE of its block anchors (normal decay: the
    whole chunk; decay 1.5: 32-row blocks; decay 3: 16-row blocks) the blocks' pairs take one
    anchored product (other arithmetic, so not bit-equal to the bit levels for every pair); at
    decay 12 and 40 not even a 16-row block does, and every pair takes the bit levels."""
    q, k, gk, beta, cu_t, _ = _case(**CASES[name])
    args = (q.float(), k.float(), gk, beta.float(), SCALE)
    auto = mod.intra_fwd(*args, cu_seqlens=cu_t)
    levels = mod.intra_fwd(*args, cu_seqlens=cu_t, fast_range=-1.0)
    rows = slice(None) if cu_t is None else slice(0, int(cu_t[-1]))
    same = all(torch.equal(a[:, rows], b[:, rows]) for a, b in zip(auto, levels))
    assert same != fast


@pytest.mark.parametrize("config", mod.configs(), ids=lambda c: f"w{c.num_warps}s{c.num_stages}")
def test_intra_fwd_every_config(config):
    q, k, gk, beta, cu_t, want = _case(**CASES["varlen_k64"])
    Aqk, Akk = mod.intra_fwd(q.float(), k.float(), gk, beta.float(), SCALE, cu_seqlens=cu_t, config=config)
    rows = slice(0, int(cu_t[-1]))
    assert rel_rms(Aqk[:, rows], want["Aqk"][:, rows]) < 1e-5
    assert rel_rms(Akk[:, rows], want["Akk"][:, rows]) < 1e-5


def _case_v(name, V, seed=0):
    """A CASES entry with real values (V channels) for the whole-stage kernel."""
    c = dict(CASES[name])
    q, k, gk, beta, cu_t, _ = _case(**c, seed=seed)
    gen = torch.Generator().manual_seed(seed + 7)
    v = torch.randn(*q.shape[:2], beta.shape[2], V, generator=gen, dtype=torch.float64)
    want = ref.intra_ref(q, k, v, beta, gk=gk, scale=SCALE, chunk_size=BT, cu_seqlens=cu_t)
    HV = beta.shape[2]
    want["qg"] = q.repeat_interleave(HV // q.shape[2], dim=2) * torch.exp2(gk.double())
    return q, k, v, gk, beta, cu_t, want


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("name,V", [("fixed_grouped", 96), ("k128_tail", 64), ("varlen_k64", 32),
                                    ("strong_decay_tail", 64)])
@pytest.mark.parametrize("with_qg", [True, False])
def test_chunk_fwd_intra_whole_stage(name, V, dtype, with_qg):
    """The drop-in for fla's chunk_kda_fwd_intra: w, u, qg, kg, Aqk, Akk against the fp64 intra
    reference (V = 96: two V blocks, the second masked)."""
    q, k, v, gk, beta, cu_t, want = _case_v(name, V)
    before = launch_counts("kda.").get("kda.intra_fwd", 0)
    w, u, qg, kg, Aqk, Akk = mod.chunk_fwd_intra(q.to(dtype), k.to(dtype), v.to(dtype), gk, beta.to(dtype), SCALE,
                                                 cu_seqlens=cu_t, disable_recompute=with_qg)
    assert launch_counts("kda.").get("kda.intra_fwd", 0) == before + 1
    assert (qg is not None) == with_qg
    rows = slice(None) if cu_t is None else slice(0, int(cu_t[-1]))
    tol = 1e-5 if dtype == torch.float32 else 3e-3
    outs = dict(w=w, u=u, kg=kg, Aqk=Aqk, Akk=Akk, **({"qg": qg} if with_qg else {}))
    for n, got in outs.items():
        assert got.dtype == dtype, n
        got, exp = got[:, rows], want[n][:, rows]
        assert torch.isfinite(got).all(), f"{n}: unwritten (NaN) or non-finite"
        err = rel_rms(got, exp)
        assert err < tol, f"{n}: rel rms {err:.2e}"


def test_chunk_fwd_intra_refuses_fla_only_schemes():
    q, k, v, gk, beta, cu_t, _ = _case_v("k128_tail", 64)
    with pytest.raises(NotImplementedError, match="safe_gate"):
        mod.chunk_fwd_intra(q.float(), k.float(), v.float(), gk, beta.float(), SCALE, safe_gate=True)


def test_intra_fwd_shape_errors():
    q, k, gk, beta, cu_t, _ = _case(**CASES["k128_tail"])
    with pytest.raises(ValueError, match="disagree"):
        mod.intra_fwd(q[:, :, :1].float(), k.float(), gk, beta.float(), SCALE)
    with pytest.raises(ValueError, match="disagree"):
        mod.intra_fwd(q.float(), k.float(), gk[..., :64], beta.float(), SCALE)
