"""Test tiers: CPU tests run our Triton kernels through Triton's interpreter; `-m gpu` tests
need CUDA and are skipped without it."""
import os

import pytest


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


HAS_CUDA = _has_cuda()
# Must be set before any kernel module is imported: triton.jit reads it at decoration time.
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device():
    """Where kernels run: the GPU when there is one, else CPU tensors through the interpreter."""
    return "cuda" if HAS_CUDA else "cpu"
