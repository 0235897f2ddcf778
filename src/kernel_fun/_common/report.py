"""Saying what a call did: once per process per (family, reason) at INFO, every call at DEBUG
under ``KERNEL_FUN_DEBUG=1``. A silent fallback reads as a correct 1.00x."""
from __future__ import annotations

import logging

from .switches import debug

logger = logging.getLogger("kernel_fun")
_logged: set = set()
_debug_handler = None


def log_once(key, message: str, level: int = logging.INFO) -> bool:
    """Log ``message`` once per process per ``key``; True when it was logged now."""
    if key in _logged:
        return False
    _logged.add(key)
    logger.log(level, message)
    return True


def _ensure_debug_handler() -> None:
    # KERNEL_FUN_DEBUG=1 must show the per-call lines even where nobody configured logging.
    global _debug_handler
    if _debug_handler is None and not logger.handlers:
        _debug_handler = logging.StreamHandler()
        _debug_handler.setFormatter(logging.Formatter("%(name)s %(levelname)s: %(message)s"))
        logger.addHandler(_debug_handler)
    if logger.level == logging.NOTSET or logger.level > logging.DEBUG:
        logger.setLevel(logging.DEBUG)


def report(family: str, ok: bool, reason: str, detail="") -> None:
    """Say what a call did. ``detail``: a string, or a zero-argument callable giving one, called
    only when the per-call DEBUG line is written (an engaged call builds no string)."""
    if ok:
        key = (family, "engaged")
        if key not in _logged:
            if ("versions",) not in _logged:  # once, the first time any family engages
                from .. import versions

                log_once(("versions",), f"kernel-fun versions: {versions()}")
            log_once(key, f"kernel-fun {family}: engaged")
    else:
        log_once((family, reason), f"kernel-fun {family}: falling back to fla: {reason}")
    if debug():
        _ensure_debug_handler()
        message = f"kernel-fun {family}: engaged" if ok else f"kernel-fun {family}: falling back to fla: {reason}"
        if callable(detail):
            detail = detail()
        logger.debug("%s%s", message, f" [{detail}]" if detail else "")


def reset_logged() -> None:
    _logged.clear()
