"""Argument classification: handled, routed with a named reason, or unknown (routed)."""
from kernel_fun._common.classify import check, classify, only, ours, signature_problems


def fla_op(x, weight=None, residual=None, backend="triton", **kwargs):
    pass


RULES = {
    "x": ours(),
    "weight": ours(),
    "residual": only(None, "residual"),
    "backend": check(lambda v, call: None if v in (None, "triton") else f"backend={v!r}"),
}


def test_handled_call():
    assert classify(RULES, {"x": 1, "weight": 2, "residual": None, "backend": "triton"}) == (True, "")


def test_routed_argument_names_itself():
    ok, reason = classify(RULES, {"x": 1, "weight": 2, "residual": 3, "backend": "triton"})
    assert not ok and reason.startswith("residual")
    ok, reason = classify(RULES, {"x": 1, "weight": 2, "residual": None, "backend": "cuda"})
    assert not ok and reason == "backend='cuda'"


def test_unknown_keyword_routes_never_ignored():
    ok, reason = classify(RULES, {"x": 1}, {"seq_idx": 5})
    assert not ok and "'seq_idx' is not classified" in reason
    ok, reason = classify(RULES, {"x": 1, "mystery": 0})
    assert not ok and "'mystery'" in reason


def test_only_uses_identity_for_bools_and_none():
    rule = only(False, "flag")
    assert rule.check(False, {}) is None
    assert rule.check(0, {}) is not None  # 0 is not the default False: route, don't guess


def test_signature_check_catches_new_fla_parameter():
    def ours_op(x, weight=None, residual=None, backend="triton", **kwargs):
        pass

    assert signature_problems(ours_op, fla_op, RULES) == []

    def fla_op_next(x, weight=None, residual=None, backend="triton", new_flag=False, **kwargs):
        pass

    problems = signature_problems(ours_op, fla_op_next, RULES)
    assert "fla parameter 'new_flag' is not classified" in problems
    assert "fla parameter 'new_flag' is missing from our signature" in problems


def test_signature_check_catches_default_change():
    def ours_op(x, weight=None, residual=None, backend="cuda", **kwargs):
        pass

    assert any("default of 'backend'" in p for p in signature_problems(ours_op, fla_op, RULES))
