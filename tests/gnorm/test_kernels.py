"""gnorm kernels through Triton's interpreter against the fp64 reference: every option
fla 0.6.0's rms_norm_gated takes, odd widths, one row, empty leading dims, NaN-poisoned
outputs, and a bitwise-reproducible dw."""
import itertools

import pytest
import torch
import triton

from kernel_fun import gnorm
from kernel_fun._common.witness import launches
from kernel_fun.gnorm._kernels import bwd as bwd_mod
from kernel_fun.gnorm._kernels import fwd as fwd_mod

from gnorm_cases import check_errs, compare, make_inputs  # noqa: E402  (conftest: this folder on sys.path)


@pytest.fixture(autouse=True)
def _clean(clean_state, poison_outputs):
    yield


TOL = {torch.float32: 1e-5, torch.float16: 3e-3}

# Every combination of activation x affine (weight, bias) x residual x prenorm x
# residual_in_fp32 for swish and sigmoid; silu (fla's alias of swish) with a weight only.
_AFFINE = [dict(weight=True, bias=False), dict(weight=False, bias=False), dict(weight=True, bias=True),
           dict(weight=False, bias=True)]
_RES = [None, "same", torch.float32]
_CASES = [(act, aff, res, pre, rif) for act, aff, res, pre, rif in itertools.product(
    ("swish", "silu", "sigmoid"), range(4), range(3), (False, True), (False, True))
    if act != "silu" or aff == 0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("act,aff,res,prenorm,rif", _CASES)
def test_options_match_reference(dtype, act, aff, res, prenorm, rif):
    res_dtype = None if _RES[res] is None else (dtype if _RES[res] == "same" else _RES[res])
    inp = make_inputs((3, 7, 40), dtype, residual=res_dtype, **_AFFINE[aff])
    before = launches("gnorm.")
    errs, (y, h, grads) = compare(gnorm.rms_norm_gated, inp, act, prenorm, rif)
    assert launches("gnorm.fwd") and launches("gnorm.") - before >= 2  # ours ran fwd and bwd
    check_errs(errs, TOL[dtype])
    assert y.dtype == dtype and y.shape == inp["x"].shape
    assert grads["x"].dtype == dtype and grads["g"].dtype == dtype
    for k in ("weight", "bias", "residual"):
        if inp[k] is not None:
            assert grads[k].dtype == inp[k].dtype
    if prenorm:  # fla's contract for the second output's dtype
        want = res_dtype if res_dtype is not None else (torch.float32 if rif else dtype)
        assert h.dtype == want


@pytest.mark.parametrize("V", [2, 96, 200, 256, 513])
@pytest.mark.parametrize("act", ["swish", "sigmoid"])
def test_widths(V, act):
    inp = make_inputs((2, 5, V), torch.float32, bias=True)
    errs, _ = compare(gnorm.rms_norm_gated, inp, act)
    check_errs(errs, 1e-5)


def test_width_one():
    # V = 1: y = sign(x) w b-shifted gate, and dx = rstd^3 eps w dyg is nearly all cancellation
    # (wdy - xh * mean(xh * wdy)): held to an absolute bound at the size of its two terms
    inp = make_inputs((6, 1), torch.float32, bias=True)
    errs, (_, _, grads) = compare(gnorm.rms_norm_gated, inp, "swish")
    assert all(v <= 1e-5 for k, v in errs.items() if k != "dx"), errs
    from kernel_fun.gnorm.reference import rms_norm_gated_ref_grads

    gen = torch.Generator().manual_seed(1)
    dy = torch.randn(6, 1, generator=gen)
    rg = rms_norm_gated_ref_grads(inp["x"], inp["g"], inp["weight"], inp["bias"], dy, "swish", eps=1e-5)
    scale = (dy.abs() * inp["weight"].detach().abs() / inp["x"].detach().abs()).max()
    assert (grads["x"].double() - rg["x"]).abs().max() <= 1e-6 * scale


@pytest.mark.parametrize("shape", [(1, 64), (64,), (1, 1, 1, 128), (4, 2, 3, 4, 24)])
def test_leading_shapes_and_one_row(shape):
    inp = make_inputs(shape, torch.float16, residual=torch.float32)
    errs, (y, h, _) = compare(gnorm.rms_norm_gated, inp, "sigmoid", prenorm=True)
    check_errs(errs, 3e-3)
    assert y.shape == shape and h.shape == shape


def test_many_rows_span_several_tiles_and_programs():
    # more tiles than the interpreter's persistent grid (4 "SMs" x PPS programs): every program
    # walks several tiles, and the last tile is partial
    inp = make_inputs((bwd_mod.MAX_PPS * 4 * 3 + 5, 16), torch.float32, bias=True, residual=torch.float32)
    errs, _ = compare(gnorm.rms_norm_gated, inp, "swish", prenorm=True)
    check_errs(errs, 1e-5)


@pytest.mark.parametrize("config", [triton.Config({"TILE": 512, "PPS": 2 * bwd_mod.MAX_PPS, "NS": 1}, num_warps=1)]
                         + [c for c in bwd_mod.CANDIDATES if c.kwargs["PPS"] > bwd_mod.MAX_PPS],
                         ids=bwd_mod.config_name)
def test_forced_backward_with_more_programs_than_the_autotuner_has(config):
    """A forced config with more programs per SM than any autotuned config (the partials are
    sized for the config that runs) fills its whole grid here (4 "SMs" x PPS programs, several
    tiles each) and still gives dx, dg, dw, db of the reference."""
    from kernel_fun._common.numerics import rel_rms
    from kernel_fun.gnorm.reference import rms_norm_gated_ref_grads

    V = 16
    rows = 4 * config.kwargs["PPS"] * (config.kwargs["TILE"] // V) * 2 + 3
    inp = make_inputs((rows, V), torch.float32, bias=True)
    x, g, w, b = (inp[k].detach() for k in ("x", "g", "weight", "bias"))
    y, rstd, h = fwd_mod.gnorm_fwd(x, g, w, b, None, None, 1e-6, "swish")
    dy = torch.randn_like(y)
    dx, dg, dw, db, _ = bwd_mod.gnorm_bwd(x if h is None else h, g, w, b, rstd, dy, None, "swish", x.dtype,
                                          None, True, True, config=config)
    ref = rms_norm_gated_ref_grads(x, g, w, b, dy, "swish", eps=1e-6)
    for name, got in (("x", dx), ("g", dg), ("weight", dw), ("bias", db)):
        assert rel_rms(got, ref[name]) < 1e-5, name


def test_mixed_dtypes():
    inp = make_inputs((4, 48), torch.float16, bias=True, wdtype=torch.float16)
    inp["g"] = inp["g"].detach().float().requires_grad_()  # g fp32, x fp16
    errs, (y, _, grads) = compare(gnorm.rms_norm_gated, inp, "swish")
    check_errs(errs, 3e-3)
    assert y.dtype == torch.float16 and grads["g"].dtype == torch.float32
    assert grads["weight"].dtype == torch.float16


def test_empty_leading_dim():
    inp = make_inputs((0, 3, 32), torch.float32, bias=True, residual=torch.float32)
    y, h = gnorm.rms_norm_gated(inp["x"], inp["g"], inp["weight"], inp["bias"], residual=inp["residual"],
                                prenorm=True)
    assert y.shape == (0, 3, 32) and h.shape == (0, 3, 32)
    gx, gw, gb = torch.autograd.grad(y.sum() + h.sum(), (inp["x"], inp["weight"], inp["bias"]))
    assert gx.shape == (0, 3, 32)
    assert torch.equal(gw, torch.zeros(32)) and torch.equal(gb, torch.zeros(32))


def test_prenorm_output_alone_carries_gradient():
    # only h is used: y's gradient is None inside the backward (not materialized)
    inp = make_inputs((3, 32), torch.float32, residual=torch.float32)
    y, h = gnorm.rms_norm_gated(inp["x"], inp["g"], inp["weight"], None, residual=inp["residual"], prenorm=True)
    dh = torch.randn_like(h)
    gx, gr = torch.autograd.grad(h, (inp["x"], inp["residual"]), dh)
    assert torch.equal(gx, dh) and torch.equal(gr, dh)
    # and y alone under prenorm: h's gradient is None, zeros stand in (one compiled variant)
    errs, _ = compare(gnorm.rms_norm_gated, inp, "swish", prenorm=True, use_h_grad=False)
    assert all(v <= 1e-5 for v in errs.values()), errs


def test_noncontiguous_inputs_and_expanded_grad():
    base = make_inputs((4, 6, 64), torch.float32)
    x = base["x"].detach()[:, :, :40].clone().requires_grad_()  # contiguous copy for the reference
    xs = torch.randn(4, 6, 64)
    xs[..., :40] = x.detach()
    xs = xs[..., :40].requires_grad_()  # a column slice: row stride 64, unit column stride
    g = base["g"].detach()[..., :40].transpose(0, 1).contiguous().transpose(0, 1).requires_grad_()
    w = torch.ones(40, requires_grad=True)
    y = gnorm.rms_norm_gated(xs, g, w, None, activation="sigmoid")
    y.sum().backward()  # dy is an expanded (stride 0) tensor
    from kernel_fun.gnorm.reference import rms_norm_gated_ref_grads
    from kernel_fun._common.numerics import rel_rms

    rg = rms_norm_gated_ref_grads(x, g, w, None, torch.ones(4, 6, 40), "sigmoid", eps=1e-6)
    assert rel_rms(xs.grad, rg["x"]) < 1e-5 and rel_rms(g.grad, rg["g"]) < 1e-5
    assert rel_rms(w.grad, rg["weight"]) < 1e-5


def test_dw_is_bitwise_reproducible():
    inp = make_inputs((bwd_mod.MAX_PPS * 4 * 2 + 3, 48), torch.float32, bias=True)
    y = gnorm.rms_norm_gated(inp["x"], inp["g"], inp["weight"], inp["bias"], activation="swish")
    dy = torch.randn_like(y)
    first = torch.autograd.grad(y, (inp["weight"], inp["bias"]), dy, retain_graph=True)
    second = torch.autograd.grad(y, (inp["weight"], inp["bias"]), dy)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


def test_eps_reaches_the_kernel():
    inp = make_inputs((3, 32), torch.float32)
    inp["x"] = (inp["x"].detach() * 1e-3).requires_grad_()  # mean(x^2) ~ 1e-6: eps matters
    for eps in (1e-6, 1e-2):
        errs, _ = compare(gnorm.rms_norm_gated, inp, "swish", eps=eps)
        check_errs(errs, 1e-5)


def test_config_pruning_keeps_what_fits_and_never_nothing():
    # the interpreter autotunes over one config, so the GPU's pruning is checked here directly
    from kernel_fun.gnorm._kernels.common import prune_by_registers

    prune = prune_by_registers(16)
    kept = prune(bwd_mod.CONFIGS, {}, BV=256)
    assert kept and all(max(c.kwargs["TILE"], 256) // (32 * c.num_warps) <= 16 for c in kept)
    wide = prune(bwd_mod.CONFIGS, {}, BV=8192)
    assert [c.num_warps for c in wide] == [16]  # only the wide-row config fits
    assert prune_by_registers(1)(fwd_mod.CONFIGS, {"BV": 64}) == [max(fwd_mod.CONFIGS, key=lambda c: c.num_warps)]


# the slot layout at a size the interpreter runs: 4-row tiles (V = 16), 3 slots, 40 tiles, so
# each slot takes 13-14 tiles' sums in order
_SLOT_CFG = triton.Config({"TILE": 64, "PPS": 1, "NS": 1, "SLOTS": 3}, num_warps=1)


@pytest.mark.parametrize("bias,tail_first", [(False, True), (True, True), (True, False)])
def test_slot_layout_backward_matches_the_reference_and_repeats_bitwise(bias, tail_first, monkeypatch):
    """One tile a program, each tile's dw/db row sums added into partial row t % S in tile order
    behind the slot's flag (bwd's module docstring): dx, dg, dw, db of the reference, the same bits
    on a second run, and the flags left at each slot's tile count (every tile added exactly once)."""
    from kernel_fun._common.numerics import rel_rms
    from kernel_fun.gnorm.reference import rms_norm_gated_ref_grads

    cfg = triton.Config({**_SLOT_CFG.kwargs, "TAIL_FIRST": tail_first}, num_warps=_SLOT_CFG.num_warps)
    V, S = 16, cfg.kwargs["SLOTS"]
    rows = 40 * (_SLOT_CFG.kwargs["TILE"] // V) - 3  # the last tile partial
    inp = make_inputs((rows, V), torch.float32, bias=bias)
    x, g, w = (inp[k].detach() for k in ("x", "g", "weight"))
    b = inp["bias"].detach() if bias else None
    y, rstd, h = fwd_mod.gnorm_fwd(x, g, w, b, None, None, 1e-6, "sigmoid")
    dy = torch.randn_like(y)
    seen = {}
    real_zeros = torch.zeros

    def spy_zeros(*a, **k):  # the launcher's flags: kept to read back after the launch
        t = real_zeros(*a, **k)
        if k.get("dtype") == torch.int32:
            seen["flag"] = t
        return t

    with monkeypatch.context() as m:
        m.setattr(bwd_mod.torch, "zeros", spy_zeros)
        first = bwd_mod.gnorm_bwd(h if h is not None else x, g, w, b, rstd, dy, None, "sigmoid", x.dtype, None,
                                  True, bias, config=cfg)
    n_tiles = 40
    assert seen["flag"].tolist() == [len(range(s, n_tiles, S)) for s in range(S)]
    ref = rms_norm_gated_ref_grads(x, g, w, b, dy, "sigmoid", eps=1e-6)
    for name, got in (("x", first[0]), ("g", first[1]), ("weight", first[2])) + ((("bias", first[3]),) if bias else ()):
        assert rel_rms(got, ref[name]) < 1e-5, name
    second = bwd_mod.gnorm_bwd(h if h is not None else x, g, w, b, rstd, dy, None, "sigmoid", x.dtype, None,
                               True, bias, config=cfg)
    for a, c in zip(first, second):
        assert (a is None and c is None) or torch.equal(a, c)

