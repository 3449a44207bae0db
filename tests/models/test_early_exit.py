"""The early-exit network (BranchyNet): both exits learn from the joint loss, and run as a cascade it
answers as the cascade policy does over both exits, paying the rest of the network only for the
inputs it hands on."""

import numpy as np
import pytest
import torch
from conftest import REPO

from scaleforge.data import load_mnist1d
from scaleforge.models import CNN1dSpec
from scaleforge.models.early_exit import EarlyExitCNN1d, joint_loss
from scaleforge.quickfit import cross_entropy, fit
from scaleforge.routing import simulate_cascade

SPEC = CNN1dSpec(channels=[16, 32, 32], hidden=64)


@pytest.fixture(scope="module")
def data():
    return load_mnist1d(3000, 42, 0.2, "~/.cache/scaleforge")


def _trained(data, loss) -> EarlyExitCNN1d:
    torch.manual_seed(0)
    model = EarlyExitCNN1d(SPEC, 40, 10, exit_after=2)
    return fit(
        model,
        data["x"],
        data["y"],
        epochs=3,
        batch_size=128,
        lr=3e-3,
        weight_decay=1e-4,
        one_cycle=True,
        loss=loss,
    )


@pytest.fixture(scope="module")
def model(data) -> EarlyExitCNN1d:
    return _trained(data, joint_loss)


def _accuracies(model: EarlyExitCNN1d, data) -> list[float]:
    with torch.inference_mode():
        logits = model.exit_logits(torch.from_numpy(data["x_test"]).float())
    return [float((exit.argmax(1).numpy() == data["y_test"]).mean()) for exit in logits]


def test_the_joint_loss_trains_the_side_exit_that_the_final_exits_loss_leaves_untrained(model, data):
    side, final = _accuracies(model, data)
    alone_side, alone_final = _accuracies(_trained(data, cross_entropy), data)
    print(
        f"joint loss: side exit {side:.3f}, final {final:.3f}; final exit's loss alone: {alone_side:.3f}, "
        f"{alone_final:.3f}"
    )
    assert side > 0.6 and final > 0.7  # 10 classes: chance is 0.1
    assert alone_side < 0.3 and side > alone_side + 0.3


@pytest.mark.parametrize("threshold", [0.0, 0.7, 0.9, 1.01])
def test_as_a_cascade_it_answers_as_the_policy_over_both_exits_and_runs_the_rest_only_for_handed_on_rows(
    model, data, threshold
):
    x = torch.from_numpy(data["x_test"]).float()
    with torch.inference_mode():
        exits = [logits.softmax(dim=-1) for logits in model.exit_logits(x)]
        final = model(x).softmax(dim=-1)
    rows_through_rest = []
    hook = model.rest.register_forward_hook(
        lambda module, inputs, output: rows_through_rest.append(len(inputs[0]))
    )
    try:
        answer = model.predict(x, threshold)
    finally:
        hook.remove()
    expected = simulate_cascade(exits, [threshold], "max_prob")
    assert torch.equal(answer.stage, expected.stage)
    torch.testing.assert_close(answer.probs, expected.probs)
    handed_on = int((answer.stage == 1).sum())
    assert sum(rows_through_rest) == handed_on
    if threshold == 0.0:
        assert handed_on == 0
    if threshold > 1:
        assert handed_on == len(x)
        torch.testing.assert_close(answer.probs, final)
    if (
        threshold == 0.7
    ):  # a confident side exit answers part of the inputs, at most a point below the final's
        assert 0.15 < answer.answered_at(0) < 1.0
        accuracy = float((answer.predictions.numpy() == data["y_test"]).mean())
        assert accuracy >= float((final.argmax(1).numpy() == data["y_test"]).mean()) - 0.01


@pytest.mark.parametrize("exit_after", [0, 3])
def test_a_side_exit_outside_the_blocks_is_refused_naming_the_range(exit_after):
    with pytest.raises(ValueError, match=rf"exit_after must be between 1 and 2 .*got {exit_after}"):
        EarlyExitCNN1d(SPEC, 40, 10, exit_after=exit_after)


def test_rows_go_through_the_network_independently(model):
    """What sharing the stem's feature maps rests on: in eval mode a row's logits do not depend on
    the other rows of its batch (batch norm uses its running statistics)."""
    x = torch.from_numpy(np.random.default_rng(0).normal(size=(16, 40)).astype(np.float32))
    with torch.inference_mode():
        torch.testing.assert_close(model(x)[3:7], model(x[3:7]))


@pytest.mark.slow
def test_jobs_train_trains_the_registered_family_and_both_exits_learn(ray_cluster, tmp_path, capsys):
    """``cnn1d_early_exit`` through ``python -m jobs.train``, 2 data-parallel workers: the trainer's loss
    (the final exit's cross-entropy plus the family's side-exit loss) trains both exits, the artifact
    scores what the job reported, and its manifest lists the exits a cascade of its own would serve."""
    from jobs.train import main
    from scaleforge.artifacts import load_artifact
    from scaleforge.models import model_family

    overrides = [f"storage={tmp_path}", "data.num_samples=5000", "optim.epochs=4"]
    config = ["--config", str(REPO / "configs" / "train_early_exit.yaml")]
    assert main([*config, *[arg for o in overrides for arg in ("--set", o)]]) == 0
    summary = capsys.readouterr().out
    artifact = load_artifact(tmp_path / "artifacts" / "train_early_exit")
    assert artifact.manifest["model"]["name"] == "cnn1d_early_exit"
    assert artifact.manifest["exits"] == {"names": ["side", "final"], "after_blocks": [2, 3]}
    data = load_mnist1d(5000, 42, 0.2, "~/.cache/scaleforge")
    x = torch.from_numpy(data["x_test"]).float()
    exits = model_family("cnn1d_early_exit").exit_probabilities(artifact.model.eval(), x)
    side, final = [float((p.argmax(1).numpy() == data["y_test"]).mean()) for p in exits]
    print(summary, f"side exit {side:.3f}, final exit {final:.3f}")
    assert side > 0.5 and final > 0.7  # 10 classes: chance is 0.1 (measured: 0.665 and 0.793)
    assert f"test accuracy {final:.4f}" in summary  # the final exit is what the job scored
