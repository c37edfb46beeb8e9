"""backends.signature: torch's C++ tensor guard and the Python stand-in make the same
decision on every pair of tensors, and a guard tells apart each change gemm() relies on."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from backends import signature

VARIANTS = {
    "same": lambda x: x,
    "copy": lambda x: x.clone(),
    "transposed layout": lambda x: x.t().contiguous().t(),
    "column slice": lambda x: x[:, 1:],
    "row slice": lambda x: x[1:],
    "every other row": lambda x: x[::2],
    "fp64": lambda x: x.double(),
    "fp16": lambda x: x.half(),
    "requires grad": lambda x: x.clone().requires_grad_(),
    "meta": lambda x: x.to("meta"),
    "negated view": lambda x: x._neg_view(),
    "3-D": lambda x: x[None],
    "1-D": lambda x: x[0],
}


def test_torch_guard_is_the_one_used_here():
    """CI's torch has the C++ guard and it passes the self-check; if a torch upgrade breaks
    it, this says so (gemm() would still be right, through the Python guard, only slower)."""
    assert signature.implementation() == "torch TensorGuards"


PAIRS = st.lists(st.tuples(st.sampled_from(sorted(VARIANTS)), st.sampled_from(sorted(VARIANTS))),
                min_size=1, max_size=4)  # gemm() always passes four tensors: equal lengths


@settings(max_examples=60, deadline=None)
@given(shape=st.tuples(st.integers(2, 5), st.integers(2, 5)), pairs=PAIRS)
def test_torch_and_python_guards_agree(shape, pairs):
    base = torch.randn(shape)
    bound = [VARIANTS[first](base.clone()) for first, _ in pairs]
    called = [VARIANTS[second](base.clone()) for _, second in pairs]
    same = all(x.dtype == y.dtype and x.device == y.device and x.shape == y.shape
               and x.stride() == y.stride() and x.requires_grad == y.requires_grad
               and x.is_neg() == y.is_neg() for x, y in zip(bound, called))
    assert signature.guard(*bound).check(*called) is same
    assert signature.Described(*bound).check(*called) is same


@pytest.mark.parametrize("variant", sorted(set(VARIANTS) - {"same", "copy"}))
def test_a_guard_refuses_each_change(variant):
    x = torch.randn(4, 6)
    guard = signature.guard(x)
    assert guard.check(torch.randn(4, 6))
    assert not guard.check(VARIANTS[variant](x))


@pytest.mark.parametrize("make", [signature.guard, signature.Described],
                         ids=["torch", "python"])
def test_a_guard_holds_the_autocast_state_of_its_device_type(make):
    """gemm() keys no binding on autocast: the guard must refuse a tensor under autocast for
    its device type when it was built outside, and the reverse; autocast for another device
    type changes nothing on this one."""
    x = torch.randn(4, 6)
    outside = make(x)
    with torch.autocast("cpu"):
        assert not outside.check(x)
        inside = make(x)
        assert inside.check(x)
    assert not inside.check(x)
    assert outside.check(x)
    with torch.autocast("cuda", enabled=True):  # CUDA autocast: not this CPU tensor's
        assert outside.check(x)


def test_a_guard_takes_tensors_only():
    with pytest.raises(TypeError, match="takes tensors, got list"):
        signature.guard(torch.zeros(2), [1.0])
