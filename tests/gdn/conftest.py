"""gdn test helpers, loaded under names of their own (tests/kda has modules of the same file
names): ``gdn_fla_standins`` (fla's stage functions in plain torch, for the CPU chain test)
and ``gdn_chain_cases`` (inputs and the fwd+bwd runner)."""
import importlib.util
import sys
from pathlib import Path

for _name, _file in (("gdn_fla_standins", "fla_standins.py"), ("gdn_chain_cases", "chain_cases.py")):
    if _name not in sys.modules:
        _spec = importlib.util.spec_from_file_location(_name, Path(__file__).parent / _file)
        _mod = importlib.util.module_from_spec(_spec)
        sys.modules[_name] = _mod
        _spec.loader.exec_module(_mod)
