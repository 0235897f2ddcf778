"""Temporary: which wy_dqk_bwd variant / config hits the illegal memory access (one process each)."""
import os, subprocess, sys, json, time

VARIANTS = {
    "A_current": [],
    "B_store_not_atomic": [("tl.atomic_add(dg + row0 * HV + i_hv + o_i * HV, b_rc", "tl.store(dg + row0 * HV + i_hv + o_i * HV, b_rc")],
    "C_no_split_pid2": [("chunk_program(cu_seqlens, chunk_indices, T, H, H, BT, IS_VARLEN, NK)", "chunk_program(cu_seqlens, chunk_indices, T, H, H, BT, IS_VARLEN)"),
                        ("i_kb = tl.program_id(0) % NK", "i_kb = tl.program_id(2)"),
                        ('grid = lambda meta: (NT * cdiv(KP, meta["BK"]), B * H)', 'grid = lambda meta: (NT, B * H, cdiv(KP, meta["BK"]))')],
    "D_no_dgz_where": [("b_dgh = tl.where(i_kb == 0, tl.load(p_gz, mask=m_t, other=0.0), 0.0)", "b_dgh = tl.load(p_gz, mask=m_t, other=0.0)")],
}


def child(variant, cfg_i, shape):
    import importlib.util
    import torch
    src = open("src/kernel_fun/gdn/_kernels/wy_dqk_bwd.py").read()
    for a, b in VARIANTS[variant]:
        assert a in src, (variant, a)
        src = src.replace(a, b)
    src = src.replace("from .wy_dv_bwd import prune_bv", "from kernel_fun.gdn._kernels.wy_dv_bwd import prune_bv")
    path = f"/tmp/dqk_{variant}.py"
    open(path, "w").write(src)
    spec = importlib.util.spec_from_file_location(f"dqk_{variant}", path)
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
    cfg = (m.CONFIGS + m.CANDIDATES)[cfg_i]
    B, T, H, HV, K, V = shape
    NT = T // 64
    d = os.environ.get("DIAG_DEVICE", "cuda")
    r = lambda *s, dt=torch.bfloat16: torch.randn(*s, device=d).to(dt)
    args = dict(q=r(B, T, H, K), k=r(B, T, H, K), v_new=r(B, T, HV, V), g=-torch.rand(B, T, HV, device=d),
                h=r(B, NT, HV, K, V), dh=r(B, NT, HV, K, V), do=r(B, T, HV, V), dv=r(B, T, HV, V),
                dAqk=r(B, T, HV, 64), dAkk=r(B, T, HV, 64), dgz=r(B, T, HV, dt=torch.float32))
    out = m.wy_dqk_bwd(**args, scale=0.088, NT=NT, config=cfg)
    torch.cuda.synchronize() if d == "cuda" else None
    t0 = time.time()
    for _ in range(20):
        m.wy_dqk_bwd(**args, scale=0.088, NT=NT, config=cfg)
    torch.cuda.synchronize() if d == "cuda" else None
    print(json.dumps(dict(variant=variant, cfg=str(cfg), shape=shape, ok=True, ms=(time.time() - t0) / 20 * 1e3,
                          finite=bool(torch.isfinite(out[0]).all()))))


if __name__ == "__main__":
    if len(sys.argv) > 1:
        child(sys.argv[1], int(sys.argv[2]), tuple(json.loads(sys.argv[3])))
        sys.exit(0)
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
    shapes = [[4, 4096, 16, 32, 128, 128], [2, 1024, 16, 16, 128, 128]]
    jobs = [("A_current", ci, shapes[0]) for ci in range(6)] + [("A_current", 0, shapes[1])]
    jobs += [(v, ci, shapes[0]) for v in ("B_store_not_atomic", "C_no_split_pid2") for ci in (0, 4)]
    jobs += [("D_no_dgz_where", 0, shapes[0])]
    from concurrent.futures import ThreadPoolExecutor

    def one(job):
        v, ci, sh = job
        try:
            p = subprocess.run([sys.executable, __file__, v, str(ci), json.dumps(sh)], env=env, capture_output=True,
                               text=True, timeout=150)
        except subprocess.TimeoutExpired:
            return f"{v} {ci} {sh} TIMEOUT"
        line = [l for l in p.stdout.splitlines() if l.startswith("{")]
        err = [l for l in p.stderr.splitlines() if "Error" in l or "error" in l][-1:]
        return f"{v} {ci} {sh} " + (line[0] if line else f"FAIL rc={p.returncode} {err}")

    with ThreadPoolExecutor(12) as ex:
        for res in ex.map(one, jobs):
            print(res, flush=True)
