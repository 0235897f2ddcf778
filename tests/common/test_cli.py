"""`kernel-fun bench` / `check` as a user meets them: refusals, --help, one line per kernel."""
import re
import types

import pytest

from kernel_fun import __main__ as cli
from kernel_fun.bench import harness


@pytest.mark.parametrize("argv,needle", [
    (["bench", "--family", "kda", "--shape", "D=4096"], "--shape: D does not fit kda (its keys: B, T, H, HV, K, V)"),
    (["bench", "--shape", "D=4096"], "D does not fit kda"),  # both families: D is cconv's only
    (["bench", "--family", "cconv", "--shape", "B=eight"], "B='eight' for cconv must be a non-negative integer"),
    (["bench", "--family", "cconv", "--shape", "layout=diagonal"], "layout='diagonal' for cconv must be one of"),
    (["bench", "--family", "cconv", "--shape", "W=7"], "W=7 for cconv must be 1..4"),
    (["bench", "--shape", "D"], "expected KEY=VALUE"),
    (["bench", "--case", "nope"], "--case: no selected family has nope (cases: cconv: prod_d2048"),
    (["bench", "--family", "cconv", "--case", "prod_b16"], "no selected family has prod_b16"),
    (["bench", "--stages", "delta"], "--stages: no family 'delta' (families: cconv, kda, gdn, gnorm"),
    (["bench", "--stages", "cconv", "--kernel", "kda.wy_bwd"], "--kernel: kda.wy_bwd is not a cconv kernel"),
    (["bench", "--stages", "cconv", "--shape", "N=4"], "--shape: N does not fit the cconv stages (their keys: B, T"),
    (["bench", "--stages", "kda", "--shape", "T=long"], "T='long' for the kda stages must be a non-negative integer"),
    (["bench", "--stages", "kda", "--case", "prod_b8"], "--stages takes one family and no --case"),
    (["bench", "--kernel", "cconv.fwd"], "--device, --kernel and --config go with --stages"),
])
def test_bench_refuses_what_does_not_fit_in_one_line(capsys, argv, needle):
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("kernel-fun bench: ")
    assert needle in err


def test_help_lists_stages_and_lower(capsys):
    with pytest.raises(SystemExit):
        cli.main(["bench", "--help"])
    out = capsys.readouterr().out
    assert "--stages FAMILY" in out and "--stages kernels (--kernel): cconv.fwd, cconv.fwd_tma" in out
    assert "cconv.dw_reduce (inside cconv.bwd)" in out
    with pytest.raises(SystemExit):
        cli.main(["check", "--help"])
    assert "--lower" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["bench", "check"])
def test_help_lists_cases_and_shape_keys_per_family(capsys, command):
    with pytest.raises(SystemExit) as exc:
        cli.main([command, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for fam in cli.BENCH_FAMILIES:
        mod = __import__(f"kernel_fun.bench.{fam}", fromlist=["x"])
        assert f"  {fam}:" in out
        for name in harness.case_names(mod):
            assert name in out
        for key in getattr(mod, "SHAPE_KEYS", {}):
            assert f"{key} (" in out


def test_cconv_check_prints_one_line_per_shipped_kernel(capsys):
    from kernel_fun.bench import cconv as bench_cconv

    assert cli.main(["check", "--family", "cconv"]) == 0
    out = capsys.readouterr().out
    for name in bench_cconv.KERNELS:
        assert re.search(rf"^check {re.escape(name)} +ok +\d+ launches", out, re.M), (name, out)
    assert "check cconv: ok" in out


def test_check_family_fails_a_declared_kernel_it_did_not_run(capsys):
    from kernel_fun._common.witness import record_launch

    def check(device):
        record_launch("fake.one")
        return ["fake one: output 0 relative error 1e-2"]

    mod = types.SimpleNamespace(KERNELS={"fake.one": "first", "fake.two": "second"}, check=check)
    fails = harness.check_family("fake", mod, "cpu")
    out = capsys.readouterr().out
    assert re.search(r"^check fake.one +FAILED +1 launches \(first\)$", out, re.M)
    assert "    fake one: output 0" in out
    assert re.search(r"^check fake.two +NOT RUN +0 launches", out, re.M)
    assert "fake.two: the check did not launch it" in fails and "check fake: FAILED" in out


def test_every_cconv_launch_witness_is_a_declared_kernel():
    """A new cconv kernel (a record_launch name in src) must join KERNELS, so check covers it."""
    import pathlib

    import kernel_fun
    from kernel_fun.bench import cconv as bench_cconv

    src = pathlib.Path(kernel_fun.__file__).parent / "cconv"
    names = set()
    for path in src.rglob("*.py"):
        names |= set(re.findall(r'record_launch\("([^"]+)"\)', path.read_text()))
    assert names and names == set(bench_cconv.KERNELS)


def test_host_us_is_the_wall_time_of_a_burst_per_call(monkeypatch):
    import time

    import torch

    syncs = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: syncs.append(1))
    calls = []

    def fn():
        calls.append(1)
        time.sleep(0.001)

    us = harness.host_us(fn, calls=5, bursts=3)
    assert len(calls) == 15 and len(syncs) == 4  # a sync before each burst, none inside
    assert 1000 <= us < 5000


def test_bench_rows_carry_host_time_beside_fla():
    row = {"family": "cconv", "case": "c", "direction": "fwd", "ours_ms": 0.25, "fla_ms": 0.3,
           "speedup": 1.2, "engaged": True, "ours_host_us": 41.5, "fla_host_us": 60.25}
    line = harness._format_row(row)
    assert "41.5" in line and "60.2" in line
    assert "host us" in harness.header()


def test_host_bursts_shrink_for_slow_calls():
    assert harness.host_bursts(0.25) == harness.HOST_BURSTS  # a cconv forward: every burst
    assert harness.host_bursts(30.0) == 10                  # a kda fwd+bwd at B=16: 3 s of GPU
    assert harness.host_bursts(1000.0) == harness.HOST_MIN_BURSTS


def test_run_case_hands_each_row_over_as_it_is_made(monkeypatch):
    """A case cut off in its second direction (a device call's timeout) has already handed its
    first row to ``on_row``, which the CLI uses to rewrite the record."""
    monkeypatch.setattr(harness, "median_ms", lambda fn: 2.0)
    monkeypatch.setattr(harness, "host_us", lambda fn, bursts=None: 50.0)
    monkeypatch.setattr(harness, "kernel_ms", lambda fn: 1.5)

    def cut():
        raise KeyboardInterrupt

    case = harness.Case("cconv", "c", {}, [harness.Direction("fwd", lambda: None, lambda: None),
                                           harness.Direction("bwd", cut, lambda: None)], witness=("cconv.",))
    seen = []
    with pytest.raises(KeyboardInterrupt):
        harness.run_case(case, {"copy_TBps": 4.0}, on_row=seen.append)
    assert [r["direction"] for r in seen] == ["fwd"] and seen[0]["ours_host_us"] == 50.0
    assert seen[0]["ours_kernel_ms"] == seen[0]["fla_kernel_ms"] == 1.5 and seen[0]["host_bound"] is False


def test_a_row_whose_host_time_reaches_its_median_is_marked_host_bound(monkeypatch, capsys):
    """The timed median of a call whose host time per call is at least 90% of it measures the
    host: the row says so (``host_bound``, and the printed line), beside its kernels' own time."""
    monkeypatch.setattr(harness, "median_ms", lambda fn: 0.30)
    monkeypatch.setattr(harness, "host_us", lambda fn, bursts=None: 290.0)
    monkeypatch.setattr(harness, "kernel_ms", lambda fn: 0.21)
    case = harness.Case("cconv", "c", {}, [harness.Direction("bwd", lambda: None, lambda: None)], witness=("cconv.",))
    row, = harness.run_case(case, {"copy_TBps": 4.0})
    assert row["host_bound"] is True and row["ours_kernel_ms"] == 0.21
    assert "host-bound" in capsys.readouterr().out


def test_a_row_whose_host_time_exceeds_its_kernels_is_host_bound(monkeypatch):
    """The H200's cconv packed backward (2026-12-03): timed 0.73 ms, its kernels 0.435, host 468 us
    a call. The host cannot keep the kernels fed (the timed median holds host time: do_bench's
    start event is recorded before the host issues the call), so the row is host-bound though its
    host time is under 90% of the median; the kernels' own ratio is recorded beside the timed one."""
    monkeypatch.setattr(harness, "median_ms", lambda fn: 0.73)
    monkeypatch.setattr(harness, "host_us", lambda fn, bursts=None: 468.0)
    kernels = iter([0.435, 2.474])  # ours, then fla's
    monkeypatch.setattr(harness, "kernel_ms", lambda fn: next(kernels))
    case = harness.Case("cconv", "c", {}, [harness.Direction("bwd", lambda: None, lambda: None)], witness=("cconv.",))
    row, = harness.run_case(case, {"copy_TBps": 4.0})
    assert row["host_bound"] is True and row["kernel_speedup"] == round(2.474 / 0.435, 3)
