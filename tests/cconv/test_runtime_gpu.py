"""cconv on the GPU, through the public entry: parity with the reference and fla at production
shapes, launch witness by profiler, CUDA graphs, memory, aliasing, streams, determinism,
torch.compile."""
import pytest
import torch

from kernel_fun import cconv
from kernel_fun._common import capture, compat
from kernel_fun.cconv.reference import conv_ref, conv_ref_bwd

pytestmark = pytest.mark.gpu

PROD = dict(B=16, T=8192, D=2048, W=4)


from kernel_fun._common.numerics import rel_rms as _rel  # noqa: E402


def _inputs(B, T, D, W, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(B, T, D, device="cuda", dtype=dtype, generator=g).requires_grad_()
    w = (torch.randn(D, W, device="cuda", generator=g) / W).requires_grad_()
    b = torch.randn(D, device="cuda", generator=g).requires_grad_()
    return x, w, b


def _fla():
    return compat.fla_symbol("fla.modules.causal_conv1d", "causal_conv1d")


def test_parity_with_reference_and_fla_at_production_shape():
    x, w, b = _inputs(**PROD)
    y, _ = cconv.causal_conv1d(x, w, b, activation="silu")
    dy = torch.randn_like(y)
    dx, dw, db = torch.autograd.grad(y, (x, w, b), dy)
    y_f, _ = _fla()(x, w, b, activation="silu")
    dx_f, dw_f, db_f = torch.autograd.grad(y_f, (x, w, b), dy)
    # fp64 reference on a slice of the batch (the reference is slow on 16 x 8192 x 2048)
    sl = slice(0, 2)
    xs, ws, bs = x[sl].detach(), w.detach(), b.detach()
    y_ref = conv_ref(xs, ws, bs, True)
    dx_ref, _, _ = conv_ref_bwd(xs, ws, bs, dy[sl], True)
    assert _rel(y[sl], y_ref) < 5e-3
    assert _rel(dx[sl], dx_ref) < 8e-3
    _, dw_ref, db_ref = conv_ref_bwd(x.detach(), ws, bs, dy, True)
    assert _rel(dw, dw_ref) < 1e-4 and _rel(db, db_ref) < 1e-4
    # and against fla, which rounds the same way
    assert _rel(y, y_f) < 5e-3 and _rel(dx, dx_f) < 8e-3
    assert _rel(dw, dw_f) < 1e-3 and _rel(db, db_f) < 1e-3


def test_profiler_witness_ours_ran_not_fla(fwd_path):
    x, w, b = _inputs(2, 1024, 512, 4)
    cconv.causal_conv1d(x, w, b, activation="silu")[0].sum().backward()  # compile outside
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        y, _ = cconv.causal_conv1d(x, w, b, activation="silu")
        y.sum().backward()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    fwd_kernel = "conv_fwd_tma_kernel" if fwd_path == "tma" else "conv_fwd_kernel"
    assert any(n.startswith(fwd_kernel) for n in names), names
    assert any(n.startswith("conv_bwd_kernel") for n in names), names
    assert not any(n.startswith("causal_conv1d") for n in names), names  # fla's did not run


def test_cuda_graph_capture_replay_bit_identical(fwd_path, graph_replay):
    x, w, b = _inputs(4, 2048, 1024, 4)
    dy = torch.randn(4, 2048, 1024, device="cuda", dtype=torch.bfloat16)

    def step():
        y, _ = cconv.causal_conv1d(x, w, b, activation="silu")
        return (y,) + torch.autograd.grad(y, (x, w, b), dy)

    static, eager = graph_replay(step)
    for a, e in zip(static, eager):
        assert torch.equal(a, e)


def test_cold_signature_under_capture_goes_to_fla():
    x, w, b = _inputs(3, 777, 256, 4)
    capture.reset_warm()
    with torch.no_grad():
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                ok, reason = cconv.is_supported(x, w, b, activation="silu")
        except Exception:
            pass
    assert not ok and "capture" in reason


def test_no_memory_growth_and_no_aliasing(fwd_path, no_memory_growth):
    x, w, b = _inputs(4, 4096, 1024, 4)
    dy = torch.randn(4, 4096, 1024, device="cuda", dtype=torch.bfloat16)
    outs = []
    for i in range(3):
        y, _ = cconv.causal_conv1d(x, w, b, activation="silu")
        outs.append(y)
    ptrs = {o.data_ptr() for o in outs}
    assert len(ptrs) == 3
    assert torch.equal(outs[0], outs[2])
    del outs
    no_memory_growth(lambda: torch.autograd.grad(cconv.causal_conv1d(x, w, b, activation="silu")[0], (x, w, b), dy), 100)


def test_non_default_stream(fwd_path):
    x, w, b = _inputs(4, 2048, 1024, 4)
    ref = cconv.causal_conv1d(x, w, b, activation="silu")[0].detach().clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.cuda._sleep(10_000_000)  # keep the stream busy so a wrong-stream launch would race
        y, _ = cconv.causal_conv1d(x, w, b, activation="silu")
    torch.cuda.current_stream().wait_stream(s)
    assert torch.equal(y, ref)


def test_bitwise_deterministic_grads():
    x, w, b = _inputs(8, 4096, 2048, 4)
    dy = torch.randn(8, 4096, 2048, device="cuda", dtype=torch.bfloat16)
    runs = []
    for _ in range(3):
        y, _ = cconv.causal_conv1d(x, w, b, activation="silu")
        runs.append(torch.autograd.grad(y, (x, w, b), dy))
    for r in runs[1:]:
        for a, e in zip(r, runs[0]):
            assert torch.equal(a, e)


def test_more_than_2_31_elements():
    B, T, D = 1, (1 << 20) + 3, 2048  # 2.15e9 elements
    x = torch.randn(B, T, D, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(D, 4, device="cuda") / 4
    with torch.no_grad():
        y, _ = cconv.causal_conv1d(x, w, activation="silu")
    tail = slice(T - 64, T)
    ref = conv_ref(x[:, T - 64 - 3:], w, None, True)[:, 3:]
    assert _rel(y[:, tail], ref) < 5e-3
    head = conv_ref(x[:, :64], w, None, True)
    assert _rel(y[:, :64], head) < 5e-3
    del y
    # backward at the same size: the last rows are right
    x.requires_grad_()
    y, _ = cconv.causal_conv1d(x, w, activation="silu")
    dy = torch.randn_like(y)
    (dx,) = torch.autograd.grad(y, (x,), dy)
    sub = slice(T - 64 - 3, T)
    dx_ref, _, _ = conv_ref_bwd(x[:, sub].detach(), w, None, dy[:, sub], True)
    assert _rel(dx[:, T - 61:], dx_ref[:, -61:]) < 8e-3


def test_torch_compile_no_more_breaks_than_fla_and_no_recompile_on_T(compile_counts):
    w = (torch.randn(512, 4, device="cuda") / 4).requires_grad_()

    class Layer(torch.nn.Module):
        def __init__(self, conv):
            super().__init__()
            self.conv = conv

        def forward(self, x):
            return self.conv(x * 2.0, w, activation="silu")[0] * 3.0

    inputs = [(torch.randn(2, T, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True),)
              for T in (256, 384, 1000)]
    ours = compile_counts(Layer(cconv.causal_conv1d), inputs)
    fla = compile_counts(Layer(_fla()), inputs)
    print(f"graph breaks / unique graphs: ours {ours}, fla {fla}")
    assert ours[0] <= fla[0]
    assert ours[1] <= fla[1]  # a new T compiles no more graphs than fla's path does


@pytest.mark.parametrize("varlen", [False, True])
def test_output_final_state_matches_fla(varlen):
    """The prefill's conv state (output_final_state=True) against fla's, bit for bit, with y; and
    the state's gradient. fla's backward carries the state's slots 1..W-1 back to x and drops slot
    0's (token end - W: the next conv update shifts it out unread, so in a real graph its gradient
    is zero); ours carries every slot, as the returned tensor's derivative is. So: against fla with
    slot 0's gradient zero, and slot 0's alone landing on token end - W of each sequence."""
    B, T, D, W = (1, 3000, 512, 4) if varlen else (2, 1000, 512, 4)
    x, w, b = _inputs(B, T, D, W)
    cu = torch.tensor([0, 2, 1000, 1001, 3000], device="cuda") if varlen else None
    y, s = cconv.causal_conv1d(x, w, b, activation="silu", cu_seqlens=cu, output_final_state=True)
    y_f, s_f = _fla()(x, w, b, activation="silu", cu_seqlens=cu, output_final_state=True)
    assert torch.equal(s, s_f)
    assert _rel(y, y_f) < 5e-3
    dy, ds = torch.randn_like(y), torch.randn_like(s)
    ds[..., 0] = 0
    g = torch.autograd.grad((y, s), (x,), (dy, ds), retain_graph=True)[0]
    g_f = torch.autograd.grad((y_f, s_f), (x,), (dy, ds))[0]
    assert _rel(g, g_f) < 8e-3
    ds0 = torch.zeros_like(ds)
    ds0[..., 0] = torch.randn_like(ds[..., 0])
    g0 = torch.autograd.grad(s, (x,), ds0)[0]
    ends = cu[1:].tolist() if varlen else [T] * B
    starts = cu[:-1].tolist() if varlen else [0] * B
    want = torch.zeros_like(g0)
    for n, (bos, eos) in enumerate(zip(starts, ends)):
        if eos - W >= bos:  # slot 0 is a token of the sequence, not padding
            want[0 if varlen else n, eos - W] = ds0[n, :, 0]
    assert torch.equal(g0, want)
