"""cconv test fixtures shared by the GPU test files."""
import pytest


@pytest.fixture(params=["tma", "ptr"])
def fwd_path(request, monkeypatch):
    """Both forwards on every case: "tma" sends each x a descriptor can read (fwd.tma_ok)
    through the TMA forward whatever its size, "ptr" (KERNEL_FUN_CCONV_TMA=0, the user's
    switch) none."""
    from kernel_fun.cconv._kernels import fwd as fwd_mod

    monkeypatch.setenv("KERNEL_FUN_CCONV_TMA", "1" if request.param == "tma" else "0")
    monkeypatch.setattr(fwd_mod, "_TMA_MIN_BYTES", 0)
    return request.param
