"""Can FlashQLA (QwenLM's TileLang GDN, the ``flash_qla`` package) run on this GPU machine, and
does it compute what ours does? Prints the toolchain TileLang looks for (nvcc, CUDA_HOME,
cuda-python's NVRTC), imports flash_qla, and runs one small fwd + bwd of its
``chunk_gated_delta_rule`` and of ours on the same inputs (the call FlashQLA supports: the gate
precomputed in log space, beta activated, l2norm in the op), against the fp64 recurrence.
Never timed: `kernel-fun bench --family gdn --case prod_b8_vs_flashqla` is the timed A/B.

The device machine reaches no package index: tools/gpu_run.sh's `flashqla` step installs the
wheels carried in `.whl_fq/` (flash_qla, tilelang, apache-tvm-ffi, ml_dtypes,
torch_c_dlpack_ext; z3-solver does not fit the 64 MiB carry and TileLang imports without it).
"""
from __future__ import annotations

import importlib.metadata
import os
import shutil
import sys
import time


def env() -> None:
    print("python", sys.version.split()[0])
    for name in ("torch", "triton", "tilelang", "apache-tvm-ffi", "flash_qla", "z3-solver", "cuda-python",
                 "cuda-bindings", "nvidia-cuda-nvcc-cu12", "nvidia-cuda-nvcc", "nvidia-cuda-nvrtc"):
        try:
            print(f"  {name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            print(f"  {name} -")
    print("nvcc on PATH:", shutil.which("nvcc"))
    print("CUDA_HOME:", os.environ.get("CUDA_HOME"), " /usr/local/cuda exists:", os.path.exists("/usr/local/cuda"))


def main() -> int:
    env()
    import torch
    import torch.nn.functional as F

    t0 = time.time()
    try:
        import flash_qla
    except Exception as e:  # the finding is the point: print it, do not hide it
        print(f"import flash_qla failed: {type(e).__name__}: {e}")
        return 1
    print(f"import flash_qla {time.time() - t0:.1f} s")

    from kernel_fun import gdn
    from kernel_fun._common.numerics import rel_rms as rel
    from kernel_fun.bench.gdn import flashqla_off
    from kernel_fun.gdn.reference import chunk_gated_delta_rule_ref

    B, T, H, HV, K, V = 1, 256, 2, 4, 128, 128
    gen = torch.Generator(device="cuda").manual_seed(0)

    def r(*s, dt=torch.bfloat16):
        return torch.randn(*s, device="cuda", generator=gen).to(dt)

    q, k, v = r(B, T, H, K), r(B, T, H, K), r(B, T, HV, V)
    g = (-torch.rand(HV, device="cuda", generator=gen).exp() * F.softplus(r(B, T, HV, dt=torch.float32)))
    beta = r(B, T, HV).sigmoid()
    do = r(B, T, HV, V)
    leaves = [x.requires_grad_() for x in (q, k, v, g, beta)]

    def run(fn, cast=None):
        xs = [x.detach().to(cast).requires_grad_() if cast else x for x in leaves]
        o = fn(*xs, use_qk_l2norm_in_kernel=True, state_v_first=True)[0]
        return [o] + list(torch.autograd.grad(o, xs, do.to(o.dtype)))

    names = ("o", "dq", "dk", "dv", "dg", "dbeta")
    ref = run(chunk_gated_delta_rule_ref, torch.float64)
    # with flash_qla installed our op routes this call to fla, i.e. to FlashQLA: off, it is ours
    with flashqla_off():
        ours = run(gdn.chunk_gated_delta_rule)
    t0 = time.time()
    try:
        fq = run(flash_qla.chunk_gated_delta_rule)
    except Exception as e:
        print(f"flash_qla fwd+bwd failed after {time.time() - t0:.1f} s: {type(e).__name__}: {e}")
        return 1
    torch.cuda.synchronize()
    print(f"flash_qla first fwd+bwd (compile included) {time.time() - t0:.1f} s")
    for n, a, b, e in zip(names, ours, fq, ref):
        print(f"  {n:6s} ours vs fp64 {rel(a, e):.2e}  flash_qla vs fp64 {rel(b, e):.2e}  ours vs flash_qla {rel(a, b):.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
