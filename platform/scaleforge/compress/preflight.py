"""Pre-flight of the compression job: the teacher loads and the recipe fits it, before Ray starts.

The recipe is walked on a skeleton of the teacher as each step changes it, so a later step is
checked against the student or the pruned shapes it will really see. A language model
(``transformer_lm``) may be distilled, quantized (``int8_dynamic``, ``fp16``, ``bf16``) and exported;
pruning and factorization, which fine-tune a classifier in memory, are refused for it.
"""

import copy
from pathlib import Path
from typing import Optional

from torch import nn

from scaleforge.artifacts import ArtifactError, load_artifact
from scaleforge.compress.prune import prune_structured
from scaleforge.config.capabilities import either
from scaleforge.config.compress import CompressJobConfig
from scaleforge.config.loader import ConfigError
from scaleforge.config.models import capabilities_of, family_names
from scaleforge.data.preflight import check_data, check_files
from scaleforge.models import build_model
from scaleforge.models.surgery import default_layers, prunable_layers
from scaleforge.storage import StorageError, check_fields, is_uri


def check_runnable(cfg: CompressJobConfig) -> None:
    """Check that ``cfg`` can run: its data files exist, the teacher's artifact loads (checksum
    verified), and every recipe step and sweep setting fits the model it will see.

    Raises:
        ConfigError: one line naming the field (``teacher``, ``recipe[i] (step)``, ``sweeps[i] (name)``).
    """
    if cfg.data.kind == "text":
        check_data(cfg.data)
    else:
        check_files(cfg.data)
    check_fields({"teacher": cfg.teacher, "output": cfg.output})
    if not is_uri(cfg.teacher) and not Path(cfg.teacher).expanduser().is_dir():
        raise ConfigError(f"teacher: artifact folder {cfg.teacher!r} does not exist")
    try:
        teacher = load_artifact(cfg.teacher)
    except (ArtifactError, StorageError) as err:
        raise ConfigError(f"teacher: {err}") from None
    _check_data_fits(cfg, teacher.manifest["model"])
    check_recipe(cfg.recipe, teacher.model, teacher.manifest, "recipe")
    for index, sweep in enumerate(cfg.sweeps):
        for step in sweep.steps():
            check_recipe([step], teacher.model, teacher.manifest, f"sweeps[{index}] ({sweep.name})")


def check_recipe(steps: list, model: nn.Module, manifest: dict, where: str) -> None:
    """Walk ``steps`` on a skeleton of ``model`` as each step changes it.

    Args:
        steps: Recipe steps, in order.
        model: The model they start from (not changed: pruning works on a copy).
        manifest: Its artifact manifest (input size, classes, earlier edits such as quantization).
        where: The config field the steps come from, for the message (``recipe``, ``sweeps[0] (name)``).

    Raises:
        ConfigError: naming the step and the problem, if a step cannot run on the model it will see.
    """
    schemes = [edit["scheme"] for edit in manifest.get("architecture") or [] if edit["op"] == "quantize"]
    skeleton, spec, quantized, int8 = (
        model,
        manifest["model"],
        bool(schemes),
        any(s.startswith("int8") for s in schemes),
    )
    for index, step in enumerate(steps):
        label = f"{where}[{index}] ({step.step})"
        if (capabilities := capabilities_of(spec["name"])).refuses(step.step):
            raise ConfigError(
                f"{label}: does not apply to the {'language ' * capabilities.language_model}model "
                f"{spec['name']!r}; its recipe may {capabilities.recipe()}"
            )
        if quantized and step.step != "export":
            raise ConfigError(f"{label}: the model is already quantized; only export can follow quantize")
        if step.step == "distill":
            try:
                skeleton = build_model(step.student, manifest["input_dim"], manifest["num_classes"])
            except ValueError as err:  # an architecture that does not fit the teacher's inputs
                raise ConfigError(f"{label}: student: {err}") from None
            spec = step.student.model_dump()
        elif step.step == "prune":
            _check_layers(label, skeleton, step.layers, (nn.Linear, nn.Conv1d))
            if step.method == "structured":
                skeleton = prune_structured(
                    copy.deepcopy(skeleton), step.sparsity, step.layers, manifest["input_dim"]
                )
        elif step.step == "low_rank":
            _check_layers(label, skeleton, step.layers, (nn.Linear,))
            for name in step.layers or default_layers(skeleton, (nn.Linear,)):
                layer = skeleton.get_submodule(name)
                if step.rank is not None and step.rank > min(layer.in_features, layer.out_features):
                    raise ConfigError(
                        f"{label}: rank {step.rank} is larger than layer {name!r} allows "
                        f"({layer.out_features} x {layer.in_features}: at most "
                        f"{min(layer.in_features, layer.out_features)})"
                    )
        elif step.step == "quantize":
            quantized, int8 = True, step.scheme.startswith("int8")
            if capabilities_of(spec["name"]).refuses("quantize", step.scheme):
                able = either(family_names(lambda c, scheme=step.scheme: scheme in c.quant_schemes), "and")
                raise ConfigError(
                    f"{label}: {step.scheme} supports {able} models; use int8_dynamic for {spec['name']!r}"
                )
        elif step.step == "export":
            if index != len(steps) - 1:
                raise ConfigError(f"{label}: export must be the last step")
            if step.onnx and int8:
                raise ConfigError(
                    f"{label}: onnx export takes fp32 or half-precision models, not eager int8 modules"
                )


def _check_data_fits(cfg: CompressJobConfig, teacher: dict) -> None:
    """A language model's teacher comes with its text (windows within its context), a classifier with arrays."""
    name, language_model = teacher["name"], capabilities_of(teacher["name"]).language_model
    if language_model != (cfg.data.kind == "text"):
        raise ConfigError(
            f"data: the teacher is a language model ({name}) trained on text; set data.kind=text"
            if language_model
            else f"data: data.kind=text is for a language model teacher; the teacher is a {name}"
        )
    if language_model and cfg.data.seq_len > teacher["context"]:
        raise ConfigError(
            f"data.seq_len ({cfg.data.seq_len}) is above the teacher's context ({teacher['context']})"
        )


def _check_layers(label: str, model: nn.Module, names: Optional[list[str]], kinds: tuple) -> None:
    available = [name for name, layer in prunable_layers(model).items() if isinstance(layer, kinds)]
    for name in names or []:
        if name not in available:
            raise ConfigError(f"{label}: unknown layer {name!r}; layers: {', '.join(available)}")
