"""A shard's update rule takes exactly the steps of torch.optim's SGD and Adam, on the same state."""

import subprocess
import sys

import pytest
import torch

from scaleforge.paramserver.update import SliceOptimizer


@pytest.mark.parametrize(
    "kind, momentum, make",
    [
        ("sgd", 0.0, lambda p: torch.optim.SGD([p], lr=1.0)),
        ("sgd", 0.9, lambda p: torch.optim.SGD([p], lr=1.0, momentum=0.9)),
        ("adam", 0.0, lambda p: torch.optim.Adam([p], lr=1.0)),
    ],
)
def test_each_step_equals_torch_optims_class_and_so_does_its_state(kind, momentum, make):
    torch.manual_seed(0)
    start = torch.randn(1000)
    ours = SliceOptimizer(start.clone(), kind, momentum)
    param = torch.nn.Parameter(start.clone())
    theirs = make(param)
    for step, lr in enumerate([0.1, 0.05, 0.05, 0.01, 0.2]):  # a rate per step, as staleness sets it
        grad = torch.randn(1000) * (step + 1)
        ours.step(grad, lr)
        param.grad = grad.clone()
        theirs.param_groups[0]["lr"] = lr
        theirs.step()
        assert torch.equal(ours.param, param.detach()), (kind, step)
    expected = theirs.state[param]
    assert sorted(ours.state) == sorted(expected)  # a shard's checkpoint keeps the class's layout
    for name, value in expected.items():
        assert torch.equal(ours.state[name], value), name


def test_an_unknown_kind_is_named():
    with pytest.raises(ValueError, match="optimizer 'lamb': expected 'sgd' or 'adam'"):
        SliceOptimizer(torch.zeros(3), "lamb")


def test_a_step_does_not_import_the_compiler():
    """What building torch.optim's class would cost a shard's process: torch._dynamo's import."""
    code = (
        "import sys, torch\n"
        "from scaleforge.paramserver.update import SliceOptimizer\n"
        "for kind in ('sgd', 'adam'):\n"
        "    SliceOptimizer(torch.zeros(4), kind, 0.9).step(torch.ones(4), 0.1)\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
