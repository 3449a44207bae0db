"""What a run killed between step checkpoints must show, whatever its layout (``run.checkpoint_every_steps``
with ``fault.kill_worker_at_step``)."""

import pytest


def assert_resumed_at_the_next_unseen_batch(result, every: int, kill: int) -> None:
    """The step log of ``result``: the first attempt ran steps 1 .. ``kill - 1``, the second resumed
    from the last step checkpoint before them and ran every step after it once, to the end. The steps
    run twice are fewer than ``every``, and ran the same batches from the same state both times:
    their losses are equal (same data order, same weights and optimiser state, same RNG)."""
    checkpoint = (kill - 1) // every * every
    assert result.metrics["resumed_from_step"] == checkpoint, result.summary()
    attempts: dict[int, list[dict]] = {}
    for entry in result.step_log:
        attempts.setdefault(entry["attempt_from_step"], []).append(entry)
    assert sorted(attempts) == [0, checkpoint], f"attempts started at steps {sorted(attempts)}"
    first, second = attempts[0], attempts[checkpoint]
    total = second[-1]["step"]
    assert [e["step"] for e in first] == list(range(1, kill)), "the first attempt skipped or repeated a step"
    assert [e["step"] for e in second] == list(range(checkpoint + 1, total + 1)), (
        "after the checkpoint a step was skipped or ran twice"
    )
    assert second[-1]["epoch"] == result.history[-1]["epoch"] == len(result.history)
    repeated = {e["step"]: e["loss"] for e in first if e["step"] > checkpoint}
    assert 0 < len(repeated) < every and result.repeated_steps() == len(repeated)
    again = {e["step"]: e["loss"] for e in second if e["step"] in repeated}
    assert again == pytest.approx(repeated, rel=1e-5, abs=1e-6), "a repeated step saw other data or state"
    assert {e["global_batch"] for e in result.step_log} == {result.step_log[0]["global_batch"]}
    assert f"resumed from the checkpoint of step {checkpoint} after a restart" in result.summary()
