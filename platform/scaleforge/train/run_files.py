"""Files in a training run's folder, beside its checkpoints: the loss curve and the step log, named as
the user named the storage (``s3://...``)."""

import json
from pathlib import Path
from typing import Optional

from scaleforge import storage
from scaleforge.train.curves import write_loss_curve


def loss_curve(storage_path: str, run_name: str, checkpoint: str, state: dict) -> Optional[str]:
    """The loss-curve PNG in the run's folder, if the run logged a curve (``run.log_every_steps``)."""
    if not state.get("curve"):
        return None
    return write_loss_curve(
        run_file(storage_path, run_name, checkpoint, "loss_curve.png"),
        state["curve"],
        state["history"],
        state["step"] // len(state["history"]),
    )


def step_log(storage_path: str, run_name: str, checkpoint: str, records: list[dict]) -> list[dict]:
    """The step log, also written as ``step_log.jsonl`` in the run's folder (with step checkpoints)."""
    if records:
        lines = "".join(json.dumps(entry) + "\n" for entry in records)
        storage.write_atomic(run_file(storage_path, run_name, checkpoint, "step_log.jsonl"), lines)
    return list(records)


def checkpoint_location(storage_path: str, run_name: str, path: str) -> str:
    """Where the final checkpoint is, as the user named the storage (``s3://...``, not ``bucket/...``)."""
    return run_file(storage_path, run_name, path, Path(path).name)


def run_file(storage_path: str, run_name: str, checkpoint: str, name: str) -> str:
    """``name`` in the run's folder (where its checkpoint ``checkpoint`` is), as the user named the
    storage."""
    return (
        storage.join(storage_path, run_name, name)
        if storage.is_uri(storage_path)
        else str(Path(checkpoint).parent / name)
    )
