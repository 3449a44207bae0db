"""Pre-flight of the compression job: the teacher loads and the recipe fits it, before Ray starts.

The recipe is walked on a skeleton of the teacher as each step changes it, so a later step is
checked against the student or the pruned shapes it will really see. Each step checks itself
(``CompressionStep.check``); the walk applies the two rules that hold for every step: a model
takes only the steps its family's capabilities accept (``Capabilities.compress_steps``: a language
model distills, quantizes and exports; pruning and factorization fine-tune a classifier in memory),
and a frozen (quantized) model only steps that do not change it.
"""

from pathlib import Path

from torch import nn

from scaleforge.artifacts import ArtifactError, load_artifact
from scaleforge.compress.steps import CompressionStep, Skeleton, step_for_edit
from scaleforge.config.compress import CompressJobConfig
from scaleforge.config.loader import ConfigError
from scaleforge.config.models import capabilities_of
from scaleforge.data.preflight import check_data, check_files
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


def check_recipe(steps: list[CompressionStep], model: nn.Module, manifest: dict, where: str) -> None:
    """Walk ``steps`` on a skeleton of ``model`` as each step changes it.

    Args:
        steps: Recipe steps, in order.
        model: The model they start from (not changed: pruning works on a copy).
        manifest: Its artifact manifest (input size, classes, earlier edits such as quantization).
        where: The config field the steps come from, for the message (``recipe``, ``sweeps[0] (name)``).

    Raises:
        ConfigError: naming the step and the problem, if a step cannot run on the model it will see.
    """
    skeleton = Skeleton(model, manifest["model"], manifest["input_dim"], manifest["num_classes"])
    for edit in manifest.get("architecture") or []:
        step_for_edit(edit["op"]).note(skeleton, edit)
    for index, step in enumerate(steps):
        label = f"{where}[{index}] ({step.step})"
        skeleton.last = index == len(steps) - 1
        spec = skeleton.spec
        if (capabilities := capabilities_of(spec["name"])).refuses(step.step):
            raise ConfigError(
                f"{label}: does not apply to the {'language ' * capabilities.language_model}model "
                f"{spec['name']!r}; its recipe may {capabilities.recipe()}"
            )
        if skeleton.frozen and step.changes_model:
            raise ConfigError(f"{label}: {skeleton.frozen}")
        step.check(skeleton, label)


def _check_data_fits(cfg: CompressJobConfig, teacher: dict) -> None:
    """A language model's teacher comes with its text (windows within its context), a classifier with
    arrays."""
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
