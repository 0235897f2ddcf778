"""The model A/B's pieces that need no GPU: the config parser, the structured tokens, the
noise-floor perturbation, parameter groups, the kernel classifier and the choice of the learning
rate the loss is compared at."""
import pytest
import torch

from kernel_fun.bench import model


def test_parse_overrides_and_rejects_unknown_keys():
    cfg = model.parse({"layers": "2", "T": "1024", "lr": "1e-3"})
    assert cfg["layers"] == 2 and cfg["T"] == 1024 and cfg["lr"] == 1e-3 and cfg["hidden"] == 2048
    from kernel_fun.bench.harness import UsageError

    with pytest.raises(UsageError, match="unknown --shape key 'D'"):
        model.parse({"D": "4"})
    with pytest.raises(UsageError, match="layers='two' is not a int"):
        model.parse({"layers": "two"})


def test_layer_kinds_own_heads_under_the_overrides():
    """gdn_default is fla's GatedDeltaNet as its config builds it (6 heads of 256, values 2x): its heads
    and head size come with the kind, --shape still overrides them, the other kinds keep DEFAULTS'."""
    cfg = model.parse({}, "gdn_default")
    assert (cfg["heads"], cfg["head_dim"]) == (6, 256) and model.LAYERS["gdn_default"][1] == {"expand_v": 2}
    assert model.parse({"heads": "4"}, "gdn_default")["heads"] == 4
    assert (model.parse({}, "gdn")["heads"], model.parse({}, "gdn")["head_dim"]) == (16, 128)


def test_cli_model_usage_errors_exit_2(capsys):
    from kernel_fun.__main__ import main

    assert main(["bench", "--model", "kda", "--shape", "D=4"]) == 2
    assert "unknown --shape key 'D'" in capsys.readouterr().err


def test_structured_tokens_follow_their_recurrence_mostly():
    x = model.structured_tokens(3, 500, 1000, seed=0)
    assert x.shape == (3, 501) and x.dtype == torch.int64 and int(x.min()) >= 0 and int(x.max()) < 1000
    assert torch.equal(x, model.structured_tokens(3, 500, 1000, seed=0))  # seeded
    # most steps follow x[t+1] = (a x[t] + c) mod V for one (a, c) per sequence: the loss can fall
    for row in x:
        best = max(((row[1:] == (a * row[:-1] + c) % 1000).float().mean().item(), a)
                   for a in range(1, 8) for c in [int((row[1] - a * row[0]) % 1000)])
        assert best[0] > 0.7


def test_one_ulp_perturbation_is_one_bf16_ulp():
    """bf16 values move to a bf16 neighbour one ulp of their binade away, up or down."""
    w = (torch.randn(1000, generator=torch.Generator().manual_seed(0)) * 3).to(torch.bfloat16).float()
    w[:3] = torch.tensor([1.0, -2.0, 0.75])  # binade edges
    p = w.clone()
    model.perturb_one_ulp(p, seed=1)
    assert torch.equal(p.to(torch.bfloat16).float(), p)  # still a bf16 value
    _, e = torch.frexp(w)
    assert torch.equal((p - w).abs(), torch.ldexp(torch.ones_like(w), e - 8))
    assert (p > w).any() and (p < w).any()
    h = w.half()  # fp16 values, fp16 storage: fp16's ulp (10 mantissa bits)
    q = h.clone()
    model.perturb_one_ulp(q, seed=1, fmt=torch.float16)
    assert torch.equal((q.float() - h.float()).abs(), torch.ldexp(torch.ones_like(w), e - 11))


GDN_FLA_AT_5E4 = [9.24, 6.66, 10.6, 5.46, 4.56, 3.82, 3.07, 2.33, 1.63, 1.06, 0.63, 0.41]  # every GDN record
KDA_FLA_AT_5E4 = [9.2, 7.14, 6.16, 5.53, 4.81, 4.02, 3.76, 2.81, 2.29, 1.78, 1.34, 0.99]


def test_loss_bumps_are_rises_over_the_step_before():
    assert model.loss_bumps(GDN_FLA_AT_5E4) == [2]
    assert model.loss_bumps(KDA_FLA_AT_5E4) == []
    assert model.loss_bumps([5.0, 5.04, 5.10]) == [2]  # 1% is the tolerance, not 0
    assert model.loss_bumps([5.0, 5.04]) == []


def test_loss_is_compared_at_the_largest_lr_where_fla_is_smooth():
    runs = []

    def curve_at(arm, lr):  # fla bumps above 2e-4; ours and the noise floor offset from it
        runs.append((arm, lr))
        base = [9.0, 7.0, 9.5 if lr > 2e-4 else 6.0, 5.0]
        return [x + {"fla": 0.0, "ours": 1e-3, "fla_ulp": 1e-2}[arm] for x in base]

    at5 = {arm: curve_at(arm, 5e-4) for arm in ("fla", "ours", "fla_ulp")}
    runs.clear()
    r = model.loss_at_smooth_lr(at5, 5e-4, curve_at)
    assert r["lr"] == pytest.approx(1.25e-4) and r["smooth"]
    assert r["fla_bumps_at"] == {"0.0005": [2], "0.00025": [2]}
    assert r["max_loss_diff"] == {"ours": pytest.approx(1e-3), "fla_ulp": pytest.approx(1e-2)}
    assert sorted(runs) == sorted((a, lr) for lr in (2.5e-4, 1.25e-4) for a in ("fla", "ours", "fla_ulp"))
    # already smooth: nothing more runs, the configured rate's curves are the comparison
    runs.clear()
    smooth = {arm: [x + 0.001 * i for x in KDA_FLA_AT_5E4] for i, arm in enumerate(("fla", "ours", "fla_ulp"))}
    r = model.loss_at_smooth_lr(smooth, 5e-4, curve_at)
    assert runs == [] and r["lr"] == 5e-4 and r["smooth"] and r["fla_bumps_at"] == {}
    # never smooth: the last rate tried, said so
    r = model.loss_at_smooth_lr(at5, 5e-4, lambda arm, lr: at5[arm])
    assert not r["smooth"] and r["lr"] == pytest.approx(5e-4 / 8) and len(r["fla_bumps_at"]) == model.LR_HALVINGS


def test_parameter_groups():
    assert model.group_of("blocks.3.attn.A_log") == "A_log"
    assert model.group_of("blocks.0.attn.q_conv1d.weight") == "q_conv1d"
    assert model.group_of("blocks.1.norm.weight") == "block_norm"
    assert model.group_of("embed.weight") == "embed"


def test_kernel_classifier():
    ours, fla = {"state_scan_fwd_kernel"}, {"chunk_kda_fwd_kernel_intra_token_parallel"}
    assert model.classify_kernel("state_scan_fwd_kernel", ours, fla) == "ours"
    assert model.classify_kernel("chunk_kda_fwd_kernel_intra_token_parallel", ours, fla) == "fla"
    assert model.classify_kernel("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_TNT", ours, fla) == "torch_gemm"
    assert model.classify_kernel("vectorized_elementwise_kernel", ours, fla) == "torch_other"


def test_fla_kernel_names_include_its_cached_autotuner_wrapped_kernels():
    # fla wraps its l2norm and conv kernels in fla.ops.utils.cache.CachedAutotuner (not a type
    # from triton's modules); the 2026-12-01 model record counted fla's l2norm_bwd_kernel
    # (0.50 ms a step, replaced by ours inside the kda backward) as torch's
    import fla.modules.norm.l2norm  # noqa: F401
    import fla.ops.kda  # noqa: F401

    names = model._jit_names("fla")
    for kernel in ("l2norm_bwd_kernel", "l2norm_fwd_kernel", "chunk_kda_bwd_kernel_intra"):
        assert kernel in names, kernel
    assert not names & {"torch", "triton"}


def test_gpu_idle_is_the_step_less_its_kernels():
    arm = {"median_step_ms": 54.37, "median_host_ms": 40.5,
           "profile": {"by_kind_ms": {"ours": 12.975, "fla": 1.502, "torch_gemm": 18.779, "torch_other": 16.98}}}
    assert model.gpu_idle_ms(arm) == {"step_ms": 54.37, "kernels_ms": 50.236, "idle_ms": 4.134, "host_ms": 40.5}


def test_idle_gaps_finds_where_the_gpu_waits():
    """The idle between kernels (overlaps and back-to-back launches count none), per 5 ms window of
    the timeline, and the longest gaps with their neighbours, from the profiler's device spans."""
    from kernel_fun.bench import model

    spans = [(0.0, 100.0, "a"), (100.0, 300.0, "b"), (250.0, 280.0, "overlapped"),  # no gap
             (350.0, 400.0, "c"),  # 50 us after b
             (6000.0, 6100.0, "d"),  # 5600 us after c: in the first window (it starts there)
             (6105.0, 11000.0, "e")]  # 5 us: idle, but below min_us in the list
    got = model.idle_gaps(spans, top=2)
    assert got["idle_ms"] == 5.655 and got["span_ms"] == 11.0
    assert got["idle_ms_per_window"] == [5.65, 0.005, 0.0]
    assert got["gaps"] == [{"us": 5600.0, "at_ms": 0.4, "after": "c", "before": "d"},
                           {"us": 50.0, "at_ms": 0.3, "after": "b", "before": "c"}]
    assert model.idle_gaps([])["idle_ms"] == 0.0
