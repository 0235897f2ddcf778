"""Transitional: the names `_common/support.py` held before `_common` was split by idea.

# transitional: the lead removes this after merging

New code imports the module of the idea it needs:

| module | idea |
|---|---|
| `switches` | the environment switches, read per call |
| `hardware` | capability probes, the device and tensor gates |
| `capture` | the CUDA graph capture gate and the warm signatures |
| `report` | log once per reason, per call under KERNEL_FUN_DEBUG |
| `gate` | `decide`: the switches, fla drift, then a family's checks |

Branches written against the old module still call ``support.decide`` and friends and
monkeypatch ``support._capturing`` / ``support._read_capability``: setting one of these names
here sets it in its home module too, so the patch reaches the code that reads it.
"""
from __future__ import annotations

import sys
import types

from . import capture as _capture, gate as _gate, hardware as _hardware, report as _report
from . import switches as _switches
from .capture import _capturing, capture_gate, is_capturing, mark_warm, reset_warm
from .gate import decide
from .hardware import (ADMITTED_CAPABILITIES, _read_capability, device_capability, device_gate,
                       machine_gate, reset_probes, tensor_gate)
from .report import log_once, logger, report, reset_logged
from .switches import (FAMILIES, _warned, cconv_tma, debug, disabled_reason, env_flag, env_int,
                       fallback_on_drift, min_ctas, unknown_variables)

_HOME = {name: mod for mod in (_capture, _gate, _hardware, _report, _switches) for name in (
    "_capturing", "capture_gate", "is_capturing", "mark_warm", "reset_warm", "decide",
    "ADMITTED_CAPABILITIES", "_read_capability", "device_capability", "device_gate", "machine_gate",
    "reset_probes", "tensor_gate", "log_once", "logger", "report", "reset_logged", "FAMILIES",
    "_warned", "cconv_tma", "debug", "disabled_reason", "env_flag", "env_int", "fallback_on_drift",
    "min_ctas", "unknown_variables") if hasattr(mod, name)}


class _Forwarding(types.ModuleType):
    def __setattr__(self, name, value):
        home = _HOME.get(name)
        if home is not None:
            setattr(home, name, value)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Forwarding
