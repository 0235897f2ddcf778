"""kernel-fun: fast GPU kernels for the linear-attention layers of hybrid language models.

Each family is a drop-in for its flash-linear-attention (fla) counterpart:
``kernel_fun.cconv``, ``kernel_fun.kda``, ``kernel_fun.gnorm`` (and, as it lands, ``gdn``);
``kernel_fun.patch_fla()`` routes fla's own layers through them.
Importing this package imports none of torch, triton or fla; the families import what
they need when they are imported.
"""
from __future__ import annotations

__version__ = "0.1.0"


def patch_fla(modules=()):
    """Route fla's layers through kernel-fun (see ``kernel_fun.patch``); returns what it rebound."""
    from .patch import patch_fla as _patch

    return _patch(modules)


def unpatch_fla():
    """Undo ``patch_fla()``; returns what it restored."""
    from .patch import unpatch_fla as _unpatch

    return _unpatch()


def patched_fla(modules=()):
    """Context manager: ``with kernel_fun.patched_fla(): ...``."""
    from .patch import patched_fla as _patched

    return _patched(modules)


def _dist_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def versions() -> dict:
    """kernel_fun, python, torch, triton, fla, CUDA, and the GPU with its sm when present.

    Imports torch (for CUDA and the device) only when it is installed; never triton or fla.
    """
    import platform

    out = {
        "kernel_fun": __version__,
        "python": platform.python_version(),
        "torch": _dist_version("torch"),
        "triton": _dist_version("triton"),
        "fla": _dist_version("fla-core") or _dist_version("flash-linear-attention"),
        "cuda": None,
        "device": None,
    }
    if out["torch"] is not None:
        try:
            import torch

            out["torch"] = torch.__version__
            out["cuda"] = torch.version.cuda
            if torch.cuda.is_available():
                major, minor = torch.cuda.get_device_capability()
                out["device"] = f"{torch.cuda.get_device_name()} (sm{major}{minor})"
        except Exception as exc:  # a broken torch must not break a version report
            out["device"] = f"unknown ({type(exc).__name__}: {exc})"
    return out
