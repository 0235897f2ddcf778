"""kda test helpers: ``fla_standins`` (fla's stage functions in plain torch, for the CPU chain
test) is importable from this folder's tests; ``poisoned_outputs``."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def poisoned_outputs(monkeypatch):
    """Every output a kda/_delta launcher allocates (``_common.tuning.alloc``) starts as NaN, so
    an element a kernel forgets to write fails."""
    from kernel_fun._common import tuning

    monkeypatch.setattr(tuning, "POISON_OUTPUTS", True)
