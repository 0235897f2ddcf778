"""The layer tests' CPU tier: skipped on a GPU machine (the model A/B runs fla's layers there),
fla's modules unpatched before and after each test."""
import pytest
import torch

import kernel_fun


@pytest.fixture
def layer_cpu_tier(clean_state):
    if torch.cuda.is_available():
        pytest.skip("the CPU tier; on the GPU the model A/B (kernel-fun bench --model) runs the layers")
    kernel_fun.unpatch_fla()
    yield
    kernel_fun.unpatch_fla()
