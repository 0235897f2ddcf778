"""The state scans launch the sequences of a varlen batch longest first (``scan_order``)."""
import torch

from kernel_fun._delta.chunking import scan_order


def test_longest_first_ties_in_order():
    cu = torch.tensor([0, 37, 100, 164, 170, 233, 233], dtype=torch.int32)  # 37, 63, 64, 6, 63, 0
    assert scan_order(cu).tolist() == [2, 1, 4, 0, 3, 5]
    assert scan_order(cu).dtype == torch.int32


def test_cached_per_tensor_and_remade_after_an_in_place_refill():
    cu = torch.tensor([0, 10, 100], dtype=torch.int32)
    first = scan_order(cu)
    assert first.tolist() == [1, 0]
    assert scan_order(cu) is first  # the forward and backward scans of a step share it
    cu[1] = 95  # a loader refilling its buffer in place: lengths 95, 5
    assert scan_order(cu).tolist() == [0, 1]
    other = torch.tensor([0, 10, 100], dtype=torch.int32)
    assert scan_order(other).tolist() == [1, 0]


def test_a_permutation_of_many_documents():
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(0, 300, (200,), generator=g)
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    order = scan_order(cu).long()
    assert sorted(order.tolist()) == list(range(200))
    assert (lengths[order][:-1] >= lengths[order][1:]).all()


def test_made_fresh_and_not_cached_under_capture(monkeypatch):
    """A tensor made during CUDA graph capture holds nothing until the graph replays: an eager
    call must never be handed one, and the captured sort must follow each replay's documents."""
    from kernel_fun._common import capture

    cu = torch.tensor([0, 5, 100], dtype=torch.int32)
    monkeypatch.setattr(capture, "is_capturing", lambda: True)
    first = scan_order(cu)
    assert first.tolist() == [1, 0]
    assert scan_order(cu) is not first  # not cached
    monkeypatch.setattr(capture, "is_capturing", lambda: False)
    eager = scan_order(cu)
    assert eager is not first and scan_order(cu) is eager


def test_inference_tensors_have_no_version_counter():
    """Under torch.inference_mode cu_seqlens has no version counter (reading it raises): the order
    is made fresh, not cached."""
    with torch.inference_mode():
        cu = torch.tensor([0, 5, 100, 130], dtype=torch.int32)
        first = scan_order(cu)
        assert first.tolist() == [1, 2, 0]
        assert scan_order(cu) is not first


def test_varlen_scans_under_inference_mode():
    """The scans with packed documents under torch.inference_mode (evaluation, generation): the
    launch order is made without a version counter, and the result is the one made outside it."""
    from kernel_fun._delta._kernels.state_scan_fwd import state_scan_fwd

    g = torch.Generator().manual_seed(0)
    T, H, K, V = 100, 2, 32, 32
    cu = torch.tensor([0, 10, 70, 100], dtype=torch.int32)
    q, k, w = (torch.randn(1, T, H, K, generator=g) * s for s in (1.0, 0.1, 0.1))
    u = torch.randn(1, T, H, V, generator=g)
    gate = -torch.rand(1, T, H, generator=g)
    kw = dict(g=gate, scale=0.2, output_final_state=True, chunk_size=64)
    o, ht, _, _ = state_scan_fwd(q, k, w, u, cu_seqlens=cu.clone(), **kw)
    with torch.inference_mode():
        o_inf, ht_inf, _, _ = state_scan_fwd(q, k, w, u, cu_seqlens=cu.clone(), **kw)
    assert torch.equal(o, o_inf) and torch.equal(ht, ht_inf)
