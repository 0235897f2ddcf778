"""`kernel-fun check` for kda: our stage kernels against their references (interpreted on CPU)."""

from kernel_fun.bench.kda import check


def test_interpreted_check_passes(device):
    assert check(device) == []


def test_check_catches_a_wrong_stage(monkeypatch, device):
    from kernel_fun.kda import chain

    real = chain.STAGES["intra_bwd"]

    def wrong(**kw):
        dq, dk, db, dg = real(**kw)
        return dq, dk * 1.01, db, dg

    monkeypatch.setitem(chain.STAGES, "intra_bwd", wrong)
    failures = check(device)
    assert len(failures) == 1 and "intra_bwd: output 1" in failures[0]


def test_check_runs_the_intra_stage_as_the_chain_does(monkeypatch, device):
    """With the one-anchor switch on, the check calls our intra stage with its fast range."""
    from kernel_fun.kda import chain

    real, seen = chain.STAGES["intra_bwd"], []

    def spy(**kw):
        seen.append(kw.get("fast_range"))
        return real(**kw)

    monkeypatch.setitem(chain.STAGES, "intra_bwd", spy)
    monkeypatch.setattr(chain, "INTRA_BWD_ONE_ANCHOR", True)
    assert check(device) == []
    monkeypatch.setattr(chain, "INTRA_BWD_ONE_ANCHOR", False)
    assert check(device) == []
    assert seen == [chain.INTRA_BWD_FAST_RANGE, None]


def test_bench_records_every_chain_switch():
    from kernel_fun.bench.kda import chain_setup
    from kernel_fun.kda import chain

    switches = chain_setup()["switches"]
    for n in ("FUSE_L2NORM_BWD", "FUSE_DG_CUMSUM", "FUSE_GATE_BWD", "FUSE_WY_FWD", "FUSE_WY_INTRA_BWD",
              "INTRA_BWD_ONE_ANCHOR"):
        assert switches[n] == getattr(chain, n), n
