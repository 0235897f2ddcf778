"""kernel-fun: fast GPU kernels for the linear-attention layers of hybrid language models.

Each family is a drop-in for its flash-linear-attention (fla) counterpart:
``kernel_fun.cconv``, ``kernel_fun.kda`` (and, as they land, ``gdn``, ``gnorm``).
Importing this package imports none of torch, triton or fla; the families import what
they need when they are imported.
"""
from __future__ import annotations

__version__ = "0.1.0"
