"""delta test helpers: ``poisoned_outputs``."""
import pytest


@pytest.fixture
def poisoned_outputs(monkeypatch):
    """Every output a kda/_delta launcher allocates (``_common.tuning.alloc``) starts as NaN, so
    an element a kernel forgets to write fails."""
    from kernel_fun._common import tuning

    monkeypatch.setattr(tuning, "POISON_OUTPUTS", True)
