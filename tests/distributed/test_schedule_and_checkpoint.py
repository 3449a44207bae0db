"""Learning-rate rules and pickle-free training-state checkpoints."""

import pytest
import torch

from scaleforge.distributed.checkpoint import load_training_state, read_trainer_state, save_training_state
from scaleforge.train.optim import learning_rate_at, peak_learning_rate


def test_linear_scaling_rule():
    assert peak_learning_rate(0.1, global_batch=8192, base_batch=256, scaling="linear") == pytest.approx(3.2)
    assert peak_learning_rate(0.1, global_batch=8192, base_batch=256, scaling="none") == 0.1


def test_warmup_then_cosine():
    kwargs = dict(peak=1.0, total_steps=110, warmup_steps=10, schedule="cosine")
    assert learning_rate_at(0, **kwargs) == pytest.approx(0.1)
    assert learning_rate_at(9, **kwargs) == pytest.approx(1.0)
    assert learning_rate_at(60, **kwargs) == pytest.approx(0.5)
    assert learning_rate_at(110, **kwargs) == pytest.approx(0.0, abs=1e-12)
    assert learning_rate_at(50, peak=1.0, total_steps=110, warmup_steps=0, schedule="constant") == 1.0


@pytest.mark.parametrize(
    "make", [lambda p: torch.optim.AdamW(p, lr=0.01), lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9)]
)
def test_resumed_training_continues_exactly(tmp_path, make):
    def setup():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
        return model, make(model.parameters())

    def step(model, optimizer, seed):
        torch.manual_seed(seed)
        loss = model(torch.randn(16, 4)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    model, optimizer = setup()
    for seed in range(3):
        step(model, optimizer, seed)
    save_training_state(tmp_path, model, optimizer, {"epoch": 2, "history": [{"a": 1}]})
    step(model, optimizer, 99)

    resumed, resumed_opt = setup()
    state = load_training_state(tmp_path, resumed, resumed_opt)
    step(resumed, resumed_opt, 99)
    assert state == {"epoch": 2, "history": [{"a": 1}]} == read_trainer_state(tmp_path)
    for a, b in zip(model.state_dict().values(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert not list(tmp_path.glob("*.pt")) and not list(tmp_path.glob("*.pkl"))
