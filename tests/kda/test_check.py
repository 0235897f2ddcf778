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
