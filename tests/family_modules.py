"""A family's test helper module, ``tests/<family>/<stem>.py``, imported under a name of its own,
``<family>_<stem>``: tests/kda and tests/gdn each have an ``fla_standins.py`` and a
``chain_cases.py``, and a test that needs both families' (or runs in a spawned process) cannot
tell them apart by file name. tests/conftest.py puts tests/ on ``sys.path``, so ``import
family_modules`` works from any test folder (and in the processes a test spawns)."""
import importlib.util
import sys
from pathlib import Path

TESTS = Path(__file__).parent


def load(family: str, stem: str):
    """``tests/<family>/<stem>.py`` as the module ``<family>_<stem>`` (imported once)."""
    name = f"{family}_{stem}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, TESTS / family / f"{stem}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]
