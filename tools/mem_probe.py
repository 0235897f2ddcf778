"""Where the live-memory residue of gdn's ``runtime_contract`` check comes from (docs/gdn.md, twenty-eighth
session): the fixture's 50 fwd + bwd calls at the GPU test's ``layer_grouped`` case ended 4.65 MB (one call's
gradients) above the baseline, the growth alternating between 0 and that in no regular order. Prints the
growth per call with Python's collector on, off and run after each call, fresh, after a call on a busy
side stream, after the fixture's capture and after the old test's form of it, and what
``gc.DEBUG_SAVEALL`` finds unreachable after three calls (Triton's launch hooks too). GPU only:
``PYTHONPATH=/tmp/site:src python3 tools/mem_probe.py`` from the repository root."""
import gc, sys, os, time
from collections import Counter
sys.path.insert(0, "tests")
import torch
import conftest as C  # tests/conftest.py (tests/gdn stays off the path: its conftest would shadow this one)
import family_modules
from kernel_fun import gdn
make_inputs, run = (getattr(family_modules.load("gdn", "chain_cases"), n) for n in ("make_inputs", "run"))

c = dict(B=2, T=1000, H=2, HV=4, K=128, V=128, h0=True)
t = make_inputs(**c, device="cuda", dtype=torch.bfloat16)
do = torch.randn(2, 1000, 4, 128, device="cuda").to(torch.bfloat16)
flags = dict(use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True, state_v_first=True,
             allow_neg_eigval=False, output_final_state=False)
def step():
    return {k: (v.detach() if v is not None else None) for k, v in run(gdn.chunk_gated_delta_rule, t, do, None, **flags).items()}

def growth(n, label, collect=False, pause=0.0):
    torch.cuda.synchronize(); base = torch.cuda.memory_allocated(); out = []
    for _ in range(n):
        step(); torch.cuda.synchronize()
        if collect: gc.collect()
        if pause: time.sleep(pause)  # the autograd engine's device thread letting go of its graph task
        out.append((torch.cuda.memory_allocated() - base) // 1024)
    print(label, out, flush=True)

def garbage(label):
    gc.collect(); gc.disable(); gc.set_debug(gc.DEBUG_SAVEALL)
    for _ in range(3): step()
    n = gc.collect()
    print(label, "unreachable", n, Counter(type(o).__name__ for o in gc.garbage).most_common(8), flush=True)
    fns = [o for o in gc.garbage if type(o).__name__ == "function"]
    print(label, Counter(f.__qualname__ for f in fns).most_common(6))
    ts = [o for o in gc.garbage if isinstance(o, torch.Tensor)]
    print(label, "tensors", [tuple(x.shape) for x in ts][:10])
    frames = [o for o in gc.garbage if type(o).__name__ == "frame"]
    print(label, "frames", Counter((f.f_code.co_name, os.path.basename(f.f_code.co_filename)) for f in frames).most_common(8))
    gc.garbage.clear(); gc.set_debug(0); gc.enable()

from triton import knobs
print("launch hooks", knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, flush=True)
for _ in range(3): step()
growth(12, "fresh, gc on:")
gc.disable(); growth(12, "fresh, gc off:"); gc.enable()
garbage("fresh")
s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    torch.cuda._sleep(10_000_000); step()
torch.cuda.current_stream().wait_stream(s)
growth(12, "after side stream:")
static, _ = C._captured(step, lambda out: None)
del static
growth(16, "after capture, gc on:")
growth(16, "after capture, gc.collect each step:", collect=True)
growth(16, "after capture, 10 ms pause each step:", pause=0.01)
gc.disable(); growth(16, "after capture, gc off:"); gc.enable()
garbage("after capture")

print("launch hooks", knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, flush=True)
# the old test's form: two warm-ups on a side stream, the graph and its outputs deleted together
s2 = torch.cuda.Stream(); s2.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s2):
    for _ in range(2): step()
torch.cuda.current_stream().wait_stream(s2)
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    static = step()
graph.replay(); torch.cuda.synchronize()
del graph, static
growth(16, "old form, gc on:")
gc.disable(); growth(16, "old form, gc off:"); gc.enable()
