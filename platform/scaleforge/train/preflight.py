"""Pre-flight of the training job: the data is readable and the architecture builds, before Ray starts."""

import torch

from scaleforge.config.loader import ConfigError
from scaleforge.config.schema import TrainJobConfig
from scaleforge.data.preflight import check_data
from scaleforge.models import build_model
from scaleforge.storage import check_fields
from scaleforge.train.plan import check_fits


def check_runnable(cfg: TrainJobConfig) -> None:
    """Check that ``cfg`` can start: the data can be read, every worker gets at least one training
    example, and the model builds for the data's input length and classes.

    Raises:
        ConfigError: one line naming the field (``data.source``, ``scaling.num_workers``, the model's).
        scaleforge.storage.StorageError: ``artifact.dir`` or ``run.storage_path`` names storage that
            cannot be reached.
    """
    check_fields({"artifact.dir": cfg.artifact.dir, "run.storage_path": cfg.run.storage_path})
    info = check_data(cfg.data)
    if cfg.scaling.num_workers > info.num_train:
        raise ConfigError(
            f"scaling.num_workers ({cfg.scaling.num_workers}) is larger than the number of "
            f"training examples ({info.num_train})"
        )
    if (kill := cfg.fault.kill_worker_at_step) is not None:
        steps = cfg.optim.epochs * (info.num_train // (cfg.optim.batch_size * cfg.global_slices))
        if kill > steps:
            raise ConfigError(f"fault.kill_worker_at_step ({kill}) is after the run's last step ({steps})")
    try:
        with torch.device("meta"):  # shapes only: nothing is allocated, whatever the model's size
            build_model(cfg.model, info.input_dim, info.num_classes)
    except ValueError as err:  # the message names the model family and the field that does not fit
        raise ConfigError(str(err)) from None
    check_fits(cfg, info.input_dim, info.num_classes)
