"""Pre-flight of the parameter-server job: data, workers and shards fit the model, before Ray starts."""

from torch import nn

from scaleforge.config.async_sgd import AsyncSGDConfig
from scaleforge.config.loader import ConfigError
from scaleforge.data.preflight import check_data
from scaleforge.models import build_model, count_parameters
from scaleforge.storage import check_fields


def check_runnable(cfg: AsyncSGDConfig) -> None:
    """Check that ``cfg`` can start: every worker (also after scaling events) gets a training
    example, every shard a parameter, and the model has no BatchNorm statistics to share.

    Raises:
        ConfigError: one line naming the field (``workers.num_workers``, ``server.num_shards``, ...).
        scaleforge.storage.StorageError: ``artifact.dir`` or ``run.output_dir`` cannot be reached.
    """
    check_fields({"artifact.dir": cfg.artifact.dir, "run.output_dir": cfg.run.output_dir})
    info = check_data(cfg.data)
    if cfg.workers.num_workers > info.num_train:
        raise ConfigError(
            f"workers.num_workers ({cfg.workers.num_workers}) is larger than the number of "
            f"training examples ({info.num_train})"
        )
    if any(e.workers > info.num_train for e in cfg.workers.scaling):
        raise ConfigError("workers.scaling asks for more workers than there are training examples")
    try:
        model = build_model(cfg.model, info.input_dim, info.num_classes)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if cfg.server.num_shards > count_parameters(model):
        raise ConfigError(
            f"server.num_shards ({cfg.server.num_shards}) is larger than the number of "
            f"parameters ({count_parameters(model)})"
        )
    if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        raise ConfigError(
            "the parameter server shares parameters, not BatchNorm statistics: "
            "use a model without BatchNorm (e.g. model.batch_norm=false for cnn1d)"
        )
