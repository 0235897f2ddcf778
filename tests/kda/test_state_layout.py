"""``state_v_first=True`` (what fla's ``KimiDeltaAttention`` always passes): states in
``[N, HV, V, K]``, with the initial state's gradient, on our chain (CPU tier: our kernels
interpreted, fla's stages as stand-ins), against the fp64 recurrence in the K-first layout."""
import pytest
import torch

from kernel_fun import kda
from kernel_fun._common.numerics import rel_rms
from kernel_fun._common.witness import launch_counts
from kernel_fun.kda.reference import chunk_kda_ref

import fla_standins  # noqa: E402  (tests/kda/conftest.py puts this folder on sys.path)
from chain_cases import make_inputs  # noqa: E402


@pytest.fixture(autouse=True)
def _standins(monkeypatch, clean_state):
    if torch.cuda.is_available():
        pytest.skip("the CPU tier (interpreter + stand-ins)")
    return fla_standins.install(monkeypatch)


@pytest.mark.parametrize("alias", [False, True], ids=["state_v_first", "transpose_state_layout"])
def test_v_first_states_match_the_k_first_recurrence(alias):
    B, T, H, HV, K, V = 1, 70, 1, 2, 64, 128  # V != K, so a layout mix-up cannot pass
    t = make_inputs(B, T, H, HV, K, V, h0=True, device="cpu", dtype=torch.float16)
    h0_kv = t.pop("initial_state")
    h0_vk = h0_kv.detach().transpose(-1, -2).contiguous().requires_grad_(True)
    flags = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                 output_final_state=True)
    layout = dict(transpose_state_layout=True) if alias else dict(state_v_first=True)
    args = [t[n] for n in ("q", "k", "v", "g", "beta")]
    aux = dict(A_log=t["A_log"], dt_bias=t["dt_bias"])
    assert kda.is_supported(*args, initial_state=h0_vk, **aux, **flags, **layout) == (True, "")
    before = launch_counts("delta.")
    if alias:
        with pytest.warns(DeprecationWarning, match="state_v_first"):
            o, ht = kda.chunk_kda(*args, initial_state=h0_vk, **aux, **flags, **layout)
    else:
        o, ht = kda.chunk_kda(*args, initial_state=h0_vk, **aux, **flags, **layout)
    assert launch_counts("delta.").get("delta.state_scan_fwd", 0) > before.get("delta.state_scan_fwd", 0)
    assert tuple(ht.shape) == (B, HV, V, K) and ht.is_contiguous()
    gen = torch.Generator().manual_seed(3)
    do = torch.randn(o.shape, generator=gen).to(o.dtype)
    dht_vk = torch.randn(ht.shape, generator=gen)
    leaves = args + [aux["A_log"], aux["dt_bias"], h0_vk]
    ours = torch.autograd.grad([o, ht], leaves, [do, dht_vk])

    ref_leaves = [x.detach().double().requires_grad_(True) for x in args + [aux["A_log"], aux["dt_bias"]]]
    h0_ref = h0_kv.detach().double().requires_grad_(True)  # K-first, the reference's layout
    ro, rht = chunk_kda_ref(*ref_leaves[:5], A_log=ref_leaves[5], dt_bias=ref_leaves[6],
                            initial_state=h0_ref, **flags)
    refs = torch.autograd.grad([ro, rht], ref_leaves + [h0_ref], [do.double(), dht_vk.double().transpose(-1, -2)])
    assert rel_rms(o, ro) < 2e-3
    assert rel_rms(ht, rht.transpose(-1, -2)) < 2e-3
    names = ("dq", "dk", "dv", "dg", "dbeta", "dA_log", "ddt_bias", "dh0")
    errs = {n: rel_rms(a, b if n != "dh0" else b.transpose(-1, -2)) for n, a, b in zip(names, ours, refs)}
    bad = {n: e for n, e in errs.items() if not e < (1.3e-2 if n == "dA_log" else 2e-3)}
    assert not bad, errs


def test_v_first_state_shape_is_checked():
    t = make_inputs(1, 70, 1, 2, 64, 128, device="cpu", dtype=torch.float16)
    args = [t[n].detach() for n in ("q", "k", "v", "g", "beta")]
    with pytest.raises(ValueError, match=r"\[N, HV, V, K\]"):
        kda.chunk_kda(*args, A_log=t["A_log"], dt_bias=t["dt_bias"], use_gate_in_kernel=True,
                      state_v_first=True, initial_state=torch.zeros(1, 2, 64, 128))


def test_strided_q_k_v_run_like_contiguous_ones():
    """Column slices of a wider projection (fla's entry makes its inputs contiguous; so do we
    before fla's stages, whose l2norm would fail on a strided view)."""
    t = make_inputs(1, 70, 1, 2, 64, 64, device="cpu", dtype=torch.float16)
    wide = torch.cat([t["q"].detach(), torch.zeros_like(t["q"].detach())], -1)[..., :64]
    assert not wide.is_contiguous()
    args = [t[n].detach() for n in ("k", "v", "g", "beta")]
    kw = dict(A_log=t["A_log"].detach(), dt_bias=t["dt_bias"].detach(), use_gate_in_kernel=True,
              use_qk_l2norm_in_kernel=True, state_v_first=True)
    o_strided, _ = kda.chunk_kda(wide, *args, **kw)
    o_dense, _ = kda.chunk_kda(wide.contiguous(), *args, **kw)
    assert torch.equal(o_strided, o_dense)
