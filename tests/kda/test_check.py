"""`kernel-fun check` for kda: our stage kernels against their references (interpreted on CPU)."""

from kernel_fun.bench.kda import check


def test_interpreted_check_passes(device):
    assert check(device) == []


def test_check_catches_a_wrong_stage(monkeypatch, device):
    from kernel_fun.kda import chain

    real = chain.intra_bwd

    def wrong(**kw):
        dq, dk, db, dg = real(**kw)
        return dq, dk * 1.01, db, dg

    monkeypatch.setattr(chain, "intra_bwd", wrong)
    failures = check(device)
    assert len(failures) == 1 and "intra_bwd: output 1" in failures[0]


def test_check_runs_the_intra_stage_as_the_chain_does(monkeypatch, device):
    """The check calls our intra stage with the one anchor's fast range, as the chain does."""
    from kernel_fun.kda import chain

    real, seen = chain.intra_bwd, []

    def spy(**kw):
        seen.append(kw.get("fast_range"))
        return real(**kw)

    monkeypatch.setattr(chain, "intra_bwd", spy)
    assert check(device) == []
    assert seen == [chain.INTRA_BWD_FAST_RANGE]
