"""Training-state checkpoints without pickle: model and optimiser tensors in safetensors, the rest JSON.

``torch.save`` of an optimiser state dict would pickle it; here tensors are flattened to
``state.<param index>.<name>`` keys and the (tensor-free) param groups go to JSON. When
parameters are sharded (expert parallelism) every rank writes its own optimiser shard
(``optimizer.rank<r>.*``) into the same checkpoint folder.
"""

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

MODEL_FILE = "model.safetensors"
STATE_FILE = "trainer_state.json"


def save_training_state(
    folder: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    """Write model weights, optimiser state and JSON ``state`` (epoch, step, history) into ``folder``."""
    save_model_state(folder, model.state_dict())
    save_optimizer_state(folder, optimizer)
    write_trainer_state(folder, state)


def load_training_state(
    folder: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> dict[str, Any]:
    """Restore what :func:`save_training_state` wrote; returns the JSON ``state``."""
    model.load_state_dict(load_model_weights(folder))
    load_optimizer_state(folder, optimizer)
    return read_trainer_state(folder)


def save_model_state(folder: Path, state_dict: dict[str, torch.Tensor]) -> None:
    save_file({k: v.detach().cpu().contiguous() for k, v in state_dict.items()}, Path(folder) / MODEL_FILE)


def load_model_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The model weights of a training checkpoint."""
    return load_file(Path(folder) / MODEL_FILE)


def write_trainer_state(folder: Path, state: dict[str, Any]) -> None:
    (Path(folder) / STATE_FILE).write_text(json.dumps(state))


def read_trainer_state(folder: Path) -> dict[str, Any]:
    """The JSON training state (epoch, step, history) of a checkpoint, without touching tensors."""
    return json.loads((Path(folder) / STATE_FILE).read_text())


def save_optimizer_state(folder: Path, optimizer: torch.optim.Optimizer, shard: str = "") -> None:
    """Optimiser tensors to ``optimizer<shard>.safetensors``, param groups and scalars to JSON."""
    opt_state = optimizer.state_dict()
    tensors, scalars = {}, {}
    for index, entries in opt_state["state"].items():
        for name, value in entries.items():
            if torch.is_tensor(value):
                tensors[f"state.{index}.{name}"] = value.detach().cpu().contiguous()
            else:
                scalars[f"{index}.{name}"] = value
    save_file(tensors, Path(folder) / f"optimizer{shard}.safetensors")
    document = {"param_groups": opt_state["param_groups"], "scalars": scalars}
    (Path(folder) / f"optimizer{shard}.json").write_text(json.dumps(document))


def load_optimizer_state(folder: Path, optimizer: torch.optim.Optimizer, shard: str = "") -> None:
    document = json.loads((Path(folder) / f"optimizer{shard}.json").read_text())
    state: dict[int, dict[str, Any]] = {}
    for key, tensor in load_file(Path(folder) / f"optimizer{shard}.safetensors").items():
        _, index, name = key.split(".", 2)
        state.setdefault(int(index), {})[name] = tensor
    for key, value in document["scalars"].items():
        index, name = key.split(".", 1)
        state.setdefault(int(index), {})[name] = value
    groups = [{k: tuple(v) if k == "betas" else v for k, v in g.items()} for g in document["param_groups"]]
    optimizer.load_state_dict({"state": state, "param_groups": groups})
