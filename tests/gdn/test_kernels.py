"""gdn's own stage kernels through the interpreter against their plain-torch fp64 stage
references (``kernel_fun.gdn.reference_stages``): the gated scores and the fused
dqkwg + WY backward, outputs poisoned with NaN, launches witnessed."""
import math

import pytest
import torch

from kernel_fun._common.numerics import rel_rms
from kernel_fun._common.tuning import config_name
from kernel_fun._common.witness import launch_counts
from kernel_fun.gdn import reference_stages as R
from kernel_fun.gdn._kernels import scores as scores_mod
from kernel_fun.gdn._kernels import wy_dqk_bwd as dqk_mod
from kernel_fun.gdn._kernels import wy_dqkwg_bwd as bwd_mod
from kernel_fun.gdn._kernels import wy_dv_bwd as dv_mod
from kernel_fun.gdn._kernels import output as out_mod
from kernel_fun.gdn._kernels import wy_inverse as inv_mod

CASES = {  # (B, T, H, HV, K, V, cu_seqlens)
    "tail": (1, 100, 1, 1, 64, 64, None),
    "grouped": (2, 70, 1, 2, 64, 64, None),
    "varlen_1tok": (1, 150, 1, 2, 64, 64, [0, 37, 38, 150]),
    "k128": (1, 64, 1, 1, 128, 32, None),
}


def _gate(B, T, HV, cu, strong=False):
    """chunk-local cumulative log2 gate of negative per-token decays."""
    a = -torch.rand(B, T, HV).double() * (4.0 if strong else 0.5)
    out = torch.zeros(B, T, HV, dtype=torch.float64)
    for b, s, e, _ in R.chunks(B, T, None if cu is None else torch.tensor(cu)):
        out[b, s:e] = a[b, s:e].cumsum(0) / math.log(2.0)
    return out.float()


def _inputs(B, T, H, HV, K, V, cu, dtype, strong=False, seed=0):
    torch.manual_seed(seed)
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.long)
    NT = len(R.chunks(B, T, cu_t)) // (B if cu is None else 1)
    r = lambda *s: torch.randn(*s).to(dtype)  # noqa: E731
    q = torch.nn.functional.normalize(torch.randn(B, T, H, K), dim=-1).to(dtype)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K), dim=-1).to(dtype)
    g = _gate(B, T, HV, cu, strong)
    beta = (torch.rand(B, T, HV) * 2.0).float()  # up to 2 (allow_neg_eigval)
    A = R.wy_inverse_ref(k, g, beta, cu_t).to(dtype)
    t = dict(q=q, k=k, v=r(B, T, HV, V), v_new=r(B, T, HV, V), g=g, beta=beta, A=A,
             h=(0.5 * torch.randn(B, NT, HV, K, V)).to(dtype), dh=(0.5 * torch.randn(B, NT, HV, K, V)).to(dtype),
             do=r(B, T, HV, V), dv2=r(B, T, HV, V))
    return t, cu_t


@pytest.fixture(autouse=True)
def _poison(poison_outputs):
    """Outputs start as NaN (the root conftest's poison_outputs)."""

@pytest.mark.parametrize("name", list(CASES))
def test_gated_scores(name):
    B, T, H, HV, K, V, cu = CASES[name]
    t, cu_t = _inputs(B, T, H, HV, K, V, cu, torch.float32)
    idx = None
    if cu_t is not None:
        from fla.ops.utils.index import prepare_chunk_indices
        idx = prepare_chunk_indices(cu_t, 64)
    before = launch_counts("gdn.").get("gdn.gated_scores", 0)
    A = scores_mod.gated_scores(t["q"], t["k"], t["g"], 0.3, cu_seqlens=cu_t, chunk_indices=idx)
    assert launch_counts("gdn.")["gdn.gated_scores"] == before + 1
    ref = R.gated_scores_ref(t["q"], t["k"], t["g"], 0.3, cu_t)
    # every row's columns up to the chunk's length are written (zeros above the diagonal)
    for b, s, e, _ in R.chunks(B, T, cu_t):
        blk = A[b, s:e, :, :e - s]
        assert not blk.isnan().any()
        assert rel_rms(blk, ref[b, s:e, :, :e - s]) < 1e-5


# the split forward's output (fla's chunk_fwd_o with the scores read): K=256 V=512 is fla's default
# GatedDeltaNet head, where the split is the forward; a packed batch with tokens after the last
# document (written as zeros)
OUTPUT_CASES = dict(CASES, k256_v512=(1, 100, 1, 2, 256, 512, None),
                    varlen_padded=(1, 160, 1, 2, 64, 64, [0, 37, 38, 130]))


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-6), (torch.float16, 3e-3)])
@pytest.mark.parametrize("name", list(OUTPUT_CASES))
def test_chunk_output(name, dtype, tol):
    B, T, H, HV, K, V, cu = OUTPUT_CASES[name]
    t, cu_t = _inputs(B, T, H, HV, K, V, cu, dtype)
    idx = None
    if cu_t is not None:
        from fla.ops.utils.index import prepare_chunk_indices
        idx = prepare_chunk_indices(cu_t, 64)
    Aqk = R.gated_scores_ref(t["q"], t["k"], t["g"], 0.3, cu_t).to(dtype)
    before = launch_counts("gdn.").get("gdn.chunk_output", 0)
    o = out_mod.chunk_output(t["q"], t["h"], t["v_new"], Aqk, t["g"], 0.3, cu_seqlens=cu_t, chunk_indices=idx)
    assert launch_counts("gdn.")["gdn.chunk_output"] == before + 1
    assert o.dtype == dtype and not o.isnan().any()
    ref = R.chunk_output_ref(t["q"], t["h"], t["v_new"], Aqk, t["g"], 0.3, cu_t)
    assert rel_rms(o.double(), ref) < tol, name
    if cu is not None:
        assert (o[:, cu[-1]:] == 0).all()


def test_chunk_output_every_config():
    """Every configuration of the output kernel, forced (K = 128 so that both K-blocks split it)."""
    t, _ = _inputs(1, 130, 1, 2, 128, 128, None, torch.float32)
    Aqk = R.gated_scores_ref(t["q"], t["k"], t["g"], 0.3).float()
    ref = R.chunk_output_ref(t["q"], t["h"], t["v_new"], Aqk, t["g"], 0.3)
    for c in out_mod.CONFIGS + out_mod.CANDIDATES:
        o = out_mod.chunk_output(t["q"], t["h"], t["v_new"], Aqk, t["g"], 0.3, config=c)
        assert rel_rms(o.double(), ref) < 2e-6, config_name(c)


def test_chunk_output_rejects_mismatched_shapes():
    t, _ = _inputs(1, 70, 1, 2, 64, 64, None, torch.float32)
    Aqk = R.gated_scores_ref(t["q"], t["k"], t["g"], 0.3).float()
    with pytest.raises(ValueError, match="chunk_output"):
        out_mod.chunk_output(t["q"], t["h"][:, :1], t["v_new"], Aqk, t["g"], 0.3)


# measured (interpreter): fp32 <= 8.3e-7, fp16 <= 1.7e-4 (A rounded to fp16 at the store); bounds
# 2.4x and 18x that.
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-6), (torch.float16, 3e-3)])
@pytest.mark.parametrize("name", list(CASES) + ["strong_decay", "correlated_k"])
def test_wy_inverse(name, dtype, tol):
    """A = (I + StrictLower(diag(beta) K K^T Gamma))^-1 against the fp64 solve, every chunk (a
    1-token document, a chunk's tail), the group's value heads from one program; beta up to 2
    everywhere, strong decay in two cases, and in the last keys that all point nearly one way (K K^T
    near 1, weak decay: L's entries up to 2, the inverse's about as large). Every column of the
    chunk's rows is written (the output starts as NaN), and above the diagonal exactly 0: the scans
    read A masked by its rows only."""
    B, T, H, HV, K, V, cu = CASES.get(name, (1, 64, 1, 2, 128, 32, None))
    t, cu_t = _inputs(B, T, H, HV, K, V, cu, dtype, strong=(name in ("tail", "strong_decay")))
    if name == "correlated_k":
        kf = torch.randn(K) + 0.15 * torch.randn(B, T, H, K)
        t["k"] = torch.nn.functional.normalize(kf, dim=-1).to(dtype)
        t["g"] = t["g"] * 0.02
    idx = None
    if cu_t is not None:
        from fla.ops.utils.index import prepare_chunk_indices
        idx = prepare_chunk_indices(cu_t, 64)
    before = launch_counts("gdn.").get("gdn.wy_inverse", 0)
    A = inv_mod.wy_inverse(t["k"], t["g"], t["beta"], cu_seqlens=cu_t, chunk_indices=idx)
    assert launch_counts("gdn.")["gdn.wy_inverse"] == before + 1
    ref = R.wy_inverse_ref(t["k"], t["g"], t["beta"], cu_t)
    for b, s, e, _ in R.chunks(B, T, cu_t):
        n = e - s
        blk = A[b, s:e]  # [n, HV, 64]
        assert not blk.isnan().any()
        upper = torch.arange(64)[None, :] > torch.arange(n)[:, None]  # [n, 64], every column >= n among them
        assert (blk.transpose(0, 1)[:, upper] == 0).all()
        assert rel_rms(blk.double()[:, :, :n], ref[b, s:e, :, :n]) < tol, name


# measured (interpreter): fp32 1e-7..1.5e-6, fp16 2e-5..4.1e-4 (the fp16 roundings of the
# gated operands and of Z); bounds about 5x that.
_ONE_BLOCK = [c for c in dqk_mod.CONFIGS if c.kwargs["BV"] == 128]  # the V loop's single trip at V = 128


@pytest.mark.parametrize("dqk_config", [None] + _ONE_BLOCK, ids=lambda c: "autotuned" if c is None else config_name(c))
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 2e-3)])
@pytest.mark.parametrize("name", list(CASES))
def test_wy_dqkwg_bwd(name, dtype, tol, dqk_config):
    """Both halves against the fp64 reference on every case (a tail chunk, grouped values, packed
    documents with a 1-token one, K = 128), with the second half autotuned (the interpreter runs
    its first config) and in one value block (the V loop's single trip)."""
    B, T, H, HV, K, V, cu = CASES[name]
    t, cu_t = _inputs(B, T, H, HV, K, V, cu, dtype, strong=(name == "tail"))
    idx = None
    if cu_t is not None:
        from fla.ops.utils.index import prepare_chunk_indices
        idx = prepare_chunk_indices(cu_t, 64)
    names = ("gdn.wy_dv_bwd", "gdn.wy_dqk_bwd")
    before = [launch_counts("gdn.").get(n, 0) for n in names]
    out = bwd_mod.wy_dqkwg_bwd(**t, scale=K ** -0.5, cu_seqlens=cu_t, chunk_indices=idx, out_dtype=torch.float32,
                               dqk_config=dqk_config)
    assert [launch_counts("gdn.")[n] for n in names] == [b + 1 for b in before]
    ref = R.wy_dqkwg_bwd_ref(**{n: x.double() for n, x in t.items() if n != "A"}, scale=K ** -0.5, cu_seqlens=cu_t)
    for n, o, r in zip(("dq", "dk", "dv", "dbeta", "dg"), out, ref):
        err = rel_rms(o, r)
        assert err < tol, (n, err)


@pytest.mark.parametrize("dqk_config", [None] + _ONE_BLOCK, ids=lambda c: "autotuned" if c is None else config_name(c))
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 2e-3)])
@pytest.mark.parametrize("name", ["grouped", "varlen_1tok"])
def test_wy_dqkwg_bwd_per_head_shares(name, dtype, tol, dqk_config):
    """A program per value head (``per_head``): dq, dk ``[B, T, HV, K]``, each value head's share,
    which summed over the group are the reference's dq, dk; dv, dbeta and dg as without it."""
    B, T, H, HV, K, V, cu = CASES[name]
    G = HV // H
    t, cu_t = _inputs(B, T, H, HV, K, V, cu, dtype, strong=False)
    idx = None
    if cu_t is not None:
        from fla.ops.utils.index import prepare_chunk_indices
        idx = prepare_chunk_indices(cu_t, 64)
    out = bwd_mod.wy_dqkwg_bwd(**t, scale=K ** -0.5, cu_seqlens=cu_t, chunk_indices=idx, out_dtype=torch.float32,
                               per_head=True, dqk_config=dqk_config)
    assert out[0].shape == (B, T, HV, K) and out[1].shape == (B, T, HV, K)
    ref = R.wy_dqkwg_bwd_ref(**{n: x.double() for n, x in t.items() if n != "A"}, scale=K ** -0.5, cu_seqlens=cu_t)
    got = [o.view(B, T, H, G, K).double().sum(3) for o in out[:2]] + list(out[2:])
    for n, o, r in zip(("dq", "dk", "dv", "dbeta", "dg"), got, ref):
        err = rel_rms(o, r)
        assert err < tol, (n, err)


@pytest.mark.parametrize("G", [2, 1])
@pytest.mark.parametrize("config", dqk_mod.CONFIGS + dqk_mod.CANDIDATES, ids=config_name)
def test_wy_dqk_bwd_every_config_k128_grouped(config, G):
    """Every configuration of the second half forced (the interpreter's autotuner runs only the
    first): K = 128 with a K block of 64 (two programs per chunk adding their parts of dg) and
    of 128 (one), over a group of two value heads (and one) with a tail chunk; dg starts as NaN
    where the launcher does not zero it."""
    B, T, H, HV, K, V = 1, 80, 1, G, 128, 64
    t, _ = _inputs(B, T, H, HV, K, V, None, torch.float32, seed=3)
    ref = R.wy_dqkwg_bwd_ref(**{n: x.double() for n, x in t.items() if n != "A"}, scale=K ** -0.5)
    out = bwd_mod.wy_dqkwg_bwd(**t, scale=K ** -0.5, out_dtype=torch.float32, dqk_config=config)
    for n, o, r in zip(("dq", "dk", "dv", "dbeta", "dg"), out, ref):
        err = rel_rms(o, r)
        assert err < 1e-5, (n, err)


_MERGE_D = [c for c in dv_mod.CANDIDATES if c.kwargs.get("MERGE_D") and c.kwargs["BV"] <= 64]


@pytest.mark.parametrize("config", [None] + _MERGE_D, ids=lambda c: "autotuned" if c is None else config_name(c))
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 2e-3)])
@pytest.mark.parametrize("name", ["grouped", "varlen_1tok"])
def test_wy_dv_bwd_alone(name, dtype, tol, config):
    """The first backward half's own outputs, the score gradients included, against autograd
    (the pair's dq, dk, dg are held to the reference by test_wy_dqkwg_bwd); the autotuner's pick
    and each candidate of the merged-accumulator form (MERGE_D: BV 32 loops over V = 64, BV 64
    takes it whole)."""
    B, T, H, HV, K, V, cu = CASES[name]
    t, cu_t = _inputs(B, T, H, HV, K, V, cu, dtype)
    idx = None
    if cu_t is not None:
        from fla.ops.utils.index import prepare_chunk_indices
        idx = prepare_chunk_indices(cu_t, 64)
    NT = len(R.chunks(B, T, cu_t)) // (B if cu is None else 1)
    x = {n: t[n] for n in ("k", "v", "v_new", "g", "beta", "A", "h", "do", "dv2")}
    before = launch_counts("gdn.").get("gdn.wy_dv_bwd", 0)
    out = dv_mod.wy_dv_bwd(**x, scale=K ** -0.5, NT=NT, cu_seqlens=cu_t, chunk_indices=idx, config=config)
    assert launch_counts("gdn.")["gdn.wy_dv_bwd"] == before + 1
    ref = R.wy_dv_bwd_ref(**{n: x.double() for n, x in t.items() if n != "A"}, scale=K ** -0.5, cu_seqlens=cu_t)
    for n, o, r in zip(("dv", "dbeta", "dAqk", "dAkk"), out[:4], ref):
        if n.startswith("dA"):  # the written part: each row's columns up to its chunk's length
            for b, s, e, _ in R.chunks(B, T, cu_t):
                assert not o[b, s:e, :, :e - s].isnan().any(), n
            o = torch.where(_chunk_cols(B, T, HV, cu_t), o.double(), 0.0)
        err = rel_rms(o, r)
        assert err < tol, (n, err)


def _chunk_cols(B, T, HV, cu_t):
    """[B, T, HV, BT] bool: the columns of each row inside its chunk."""
    m = torch.zeros(B, T, HV, 64, dtype=torch.bool)
    for b, s, e, _ in R.chunks(B, T, cu_t):
        m[b, s:e, :, :e - s] = True
    return m


# The inputs' stages in one launch each way (taken with the l2norm in the op), against autograd of
# the plain fp64 functions: the l2norm of q and k (through their strides: the fused q/k/v conv's
# column slices), beta's sigmoid (times 2: allow_neg_eigval), the in-op gate and its chunk-local
# cumsum (log2 units), or a precomputed gate; the backward's sums toward dA_log and ddt_bias. The
# value heads of a group (G = HV / H: 2, 4, 1, 3 below) split their qk head's rows between them.
INPUT_CASES = {  # (B, T, H, HV, K, cu_seqlens, gate_in_kernel, strided)
    "grouped": (2, 100, 2, 4, 64, None, True, False),
    "varlen_1tok": (1, 150, 1, 4, 64, [0, 37, 38, 150], True, False),
    "column_slices": (1, 70, 2, 2, 128, None, True, True),
    # three value heads share a qk head's rows: 32 each, the third's start past the chunk
    "column_slices_g3": (1, 100, 1, 3, 64, None, True, True),
    "precomputed_gate": (2, 70, 1, 2, 64, None, False, False),
}


def _inputs_case(name, dtype):
    from kernel_fun._delta import chunking

    B, T, H, HV, K, cu, gate_in, strided = INPUT_CASES[name]
    torch.manual_seed(0)
    V = 64  # v is copied where strided (a V unlike K in the column-slice case)
    if strided:
        buf = torch.randn(B, T, 2 * H * K + HV * V, dtype=torch.float64)
        q64, k64 = (buf[..., i * H * K:(i + 1) * H * K].view(B, T, H, K) for i in (0, 1))
        v64 = buf[..., 2 * H * K:].view(B, T, HV, V)
    else:
        v64 = torch.randn(B, T, HV, V, dtype=torch.float64)
        q64, k64 = torch.randn(B, T, H, K, dtype=torch.float64), torch.randn(B, T, H, K, dtype=torch.float64)
    q64, k64 = q64.to(dtype).double(), k64.to(dtype).double()  # the values the kernel sees
    g64 = torch.randn(B, T, HV).to(dtype).double() if gate_in else -torch.rand(B, T, HV, dtype=torch.float64)
    b64 = torch.randn(B, T, HV).to(dtype).double()
    A_log, dt = torch.rand(HV, dtype=torch.float64), torch.randn(HV, dtype=torch.float64)
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.long)
    idx = None if cu_t is None else chunking.chunk_meta(cu_t, 64, None)[0]
    low = dict(q=(buf.to(dtype)[..., :H * K].view(B, T, H, K) if strided else q64.to(dtype)),
               k=(buf.to(dtype)[..., H * K:2 * H * K].view(B, T, H, K) if strided else k64.to(dtype)),
               v=(buf.to(dtype)[..., 2 * H * K:].view(B, T, HV, V) if strided else v64.to(dtype)),
               g=g64.to(dtype) if gate_in else g64.float(), beta=b64.to(dtype), A_log=A_log.float(), dt_bias=dt.float())
    v64 = v64.to(dtype).double()
    return (B, T, H, HV, K, cu_t, idx, gate_in), dict(q=q64, k=k64, v=v64, g=g64, beta=b64, A_log=A_log, dt_bias=dt), low


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float16, 2e-3)], ids=["fp32", "fp16"])
@pytest.mark.parametrize("name", list(INPUT_CASES))
def test_inputs_fwd(name, dtype, tol):
    from kernel_fun.gdn._kernels.inputs_fwd import inputs_fwd

    (B, T, H, HV, K, cu_t, idx, gate_in), x, low = _inputs_case(name, dtype)
    before = launch_counts().get("gdn.inputs_fwd", 0)
    q, q_rstd, k, k_rstd, v, gc, beta = inputs_fwd(low["q"], low["k"], low["v"], low["g"], low["beta"], low["A_log"],
                                                   low["dt_bias"], gate_in, True, 2.0, 1 / math.log(2.0), cu_t, idx)
    assert launch_counts()["gdn.inputs_fwd"] == before + 1
    # v: the same tensor where contiguous, else a bitwise copy
    assert (v is low["v"]) == low["v"].is_contiguous() and torch.equal(v, low["v"])
    qn, kn, b, g = R.inputs_fwd_ref(x["q"], x["k"], x["g"], x["beta"], x["A_log"], x["dt_bias"], gate_in, 2.0, cu_t)
    for n, got, want in (("q", q, qn), ("k", k, kn), ("v", v, x["v"]), ("beta", beta, b), ("gc", gc, g),
                         ("q_rstd", q_rstd, qn[..., 0] / x["q"][..., 0]), ("k_rstd", k_rstd, kn[..., 0] / x["k"][..., 0])):
        assert got.is_contiguous() and torch.isfinite(got).all(), n
        assert rel_rms(got.double(), want) < tol, (n, rel_rms(got.double(), want))
    # beta as given (the sigmoid applied outside the op): the same values, in fp32 (the scans' beta
    # loads are pipelined at 4 bytes an element)
    beta_given = inputs_fwd(low["q"], low["k"], low["v"], low["g"], low["beta"], low["A_log"], low["dt_bias"],
                            gate_in, False, 1.0, 1 / math.log(2.0), cu_t, idx)[6]
    assert beta_given.dtype == torch.float32 and torch.equal(beta_given, low["beta"].float())
    # an fp32 beta as given is handed on as it is: no copy
    beta32 = low["beta"].float()
    assert inputs_fwd(low["q"], low["k"], low["v"], low["g"], beta32, low["A_log"], low["dt_bias"],
                      gate_in, False, 1.0, 1 / math.log(2.0), cu_t, idx)[6] is beta32


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float16, 2e-3)], ids=["fp32", "fp16"])
@pytest.mark.parametrize("name", list(INPUT_CASES))
def test_inputs_bwd(name, dtype, tol):
    """dg in: the gradient of the per-token natural-log gate (as the chain returns it); out: the
    gradients of the raw gate input, A_log, dt_bias (in-op gate), or dg as given (precomputed)."""
    from kernel_fun.gdn._kernels.inputs_bwd import inputs_bwd

    (B, T, H, HV, K, cu_t, idx, gate_in), x, low = _inputs_case(name, dtype)
    qn, kn, _, _ = R.inputs_fwd_ref(x["q"], x["k"], x["g"], x["beta"], x["A_log"], x["dt_bias"], gate_in, 2.0, cu_t)
    torch.manual_seed(1)
    dqn, dkn = torch.randn_like(qn), torch.randn_like(kn)
    dbeta, dg = torch.randn_like(x["beta"]), torch.randn_like(x["g"])
    want = dict(zip(["q", "k", "beta", "g", "A_log", "dt_bias"],
                    R.inputs_bwd_ref(x["q"], x["k"], x["g"], x["beta"], x["A_log"], x["dt_bias"], gate_in, dqn, dkn,
                                     dbeta, dg, 2.0, cu_t)))
    before = launch_counts().get("gdn.inputs_bwd", 0)
    got = inputs_bwd(qn.detach().to(dtype), (qn[..., 0] / x["q"][..., 0]).detach().float(), dqn.to(dtype),
                     kn.detach().to(dtype), (kn[..., 0] / x["k"][..., 0]).detach().float(), dkn.to(dtype), low["beta"],
                     dbeta.float(), True, 2.0, low["g"], low["A_log"], low["dt_bias"], dg.float(), gate_in, cu_t, idx)
    assert launch_counts()["gdn.inputs_bwd"] == before + 1
    for n, g_ in zip(["q", "k", "beta", "g", "A_log", "dt_bias"], got):
        if want[n] is None:
            assert g_ is None, n
            continue
        assert torch.isfinite(g_).all(), n
        assert rel_rms(g_.double(), want[n]) < tol, (n, rel_rms(g_.double(), want[n]))


@pytest.mark.parametrize("name", ["grouped", "varlen_1tok", "column_slices_g3"])
def test_inputs_bwd_adds_the_value_heads_shares(name):
    """dq, dk given as each value head's share ``[B, T, HV, K]`` (``wy_dqk_bwd(per_head=True)``):
    the same gradients as from their group sums, to fp32 rounding; a dq of neither shape refused."""
    from kernel_fun.gdn._kernels.inputs_bwd import inputs_bwd

    (B, T, H, HV, K, cu_t, idx, gate_in), x, low = _inputs_case(name, torch.float32)
    G = HV // H
    torch.manual_seed(3)
    qn = torch.nn.functional.normalize(x["q"], dim=-1).float()
    kn = torch.nn.functional.normalize(x["k"], dim=-1).float()
    rq, rk = (torch.rand(B, T, H) + 0.5 for _ in range(2))
    dq_parts, dk_parts = torch.randn(B, T, HV, K), torch.randn(B, T, HV, K)
    sums = [p.view(B, T, H, G, K).double().sum(3).float() for p in (dq_parts, dk_parts)]
    rest = (low["beta"], torch.randn(B, T, HV), True, 2.0, low["g"], low["A_log"], low["dt_bias"],
            torch.randn(B, T, HV), gate_in, cu_t, idx)
    want = inputs_bwd(qn, rq, sums[0], kn, rk, sums[1], *rest)
    got = inputs_bwd(qn, rq, dq_parts, kn, rk, dk_parts, *rest)
    for a, b in zip(got, want):
        assert (a is None and b is None) or rel_rms(a.double(), b.double()) < 1e-6
    bad = torch.randn(B, T, HV + 1, K)  # as many heads as neither q nor v
    with pytest.raises(ValueError, match="must be"):
        inputs_bwd(qn, rq, bad, kn, rk, bad, *rest)
    with pytest.raises(ValueError, match="must be"):  # dq and dk of two shapes
        inputs_bwd(qn, rq, sums[0], kn, rk, dk_parts, *rest)


def _strided_out(B, T, parts, dtype, pad=(8, 24)):
    """A NaN ``[B, T, pad0 + sum(parts) + pad1]`` buffer and ``[B, T, n, d]`` views of its column
    ranges (n, d in ``parts``), as the fused q/k/v gradient's parts are laid out."""
    buf = torch.full((B, T, pad[0] + sum(n * d for n, d in parts) + pad[1]), float("nan"), dtype=dtype)
    views, c = [], pad[0]
    for n, d in parts:
        views.append(buf[..., c:c + n * d].unflatten(-1, (n, d)))
        c += n * d
    return buf, views


@pytest.mark.parametrize("name", ["grouped", "varlen_1tok"])
def test_wy_dqkwg_bwd_dv_into_strided_rows(name):
    """dv written into a column slice of a wider tensor (the fused q/k/v gradient's v part) and
    read back from there by the second half: every output bit for bit as into a tensor of its
    own, and no column outside the slice touched (they stay NaN)."""
    B, T, H, HV, K, V, cu = CASES[name]
    t, cu_t = _inputs(B, T, H, HV, K, V, cu, torch.float16)
    idx = None
    if cu_t is not None:
        from fla.ops.utils.index import prepare_chunk_indices
        idx = prepare_chunk_indices(cu_t, 64)
    kw = dict(scale=K ** -0.5, cu_seqlens=cu_t, chunk_indices=idx, out_dtype=torch.float32)
    want = bwd_mod.wy_dqkwg_bwd(**t, **kw)
    buf, (dv_out,) = _strided_out(B, T, [(HV, V)], torch.float16)
    got = bwd_mod.wy_dqkwg_bwd(**t, **kw, dv_out=dv_out)
    assert got[2] is dv_out
    for n, a, b in zip(("dq", "dk", "dv", "dbeta", "dg"), got, want):
        assert torch.equal(a, b), n
    assert buf[..., :8].isnan().all() and buf[..., 8 + HV * V:].isnan().all()


def test_inputs_bwd_into_strided_rows():
    """dq, dk written into two column slices of one wider tensor (the fused q/k/v gradient's q
    and k parts): bit for bit as into tensors of their own, nothing outside them touched."""
    from kernel_fun.gdn._kernels.inputs_bwd import inputs_bwd

    (B, T, H, HV, K, cu_t, idx, gate_in), x, low = _inputs_case("grouped", torch.float16)
    torch.manual_seed(2)
    qn = torch.nn.functional.normalize(x["q"], dim=-1).half()
    kn = torch.nn.functional.normalize(x["k"], dim=-1).half()
    rq, rk = (torch.rand(B, T, H) + 0.5 for _ in range(2))
    dq, dk = torch.randn(B, T, H, K).half(), torch.randn(B, T, H, K).half()
    args = (qn, rq, dq, kn, rk, dk, low["beta"], torch.randn(B, T, HV), True, 2.0, low["g"], low["A_log"],
            low["dt_bias"], torch.randn(B, T, HV), gate_in, cu_t, idx)
    want = inputs_bwd(*args)
    buf, (dq_out, dk_out) = _strided_out(B, T, [(H, K), (H, K)], torch.float16)
    got = inputs_bwd(*args, dq_out=dq_out, dk_out=dk_out)
    assert got[0] is dq_out and got[1] is dk_out
    for a, b in zip(got, want):
        assert (a is None and b is None) or torch.equal(a, b)
    assert buf[..., :8].isnan().all() and buf[..., 8 + 2 * H * K:].isnan().all()
    with pytest.raises(ValueError, match="one stride"):
        inputs_bwd(*args, dq_out=dq_out, dk_out=torch.empty(B, T, H, K).half())
