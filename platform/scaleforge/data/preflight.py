"""Pre-flight checks of a ``data`` section: its files exist and can be read (before Ray starts)."""

from typing import Union

from pyarrow import ArrowException

from scaleforge import storage
from scaleforge.config.data import DataSpec, TextDataSpec
from scaleforge.config.loader import ConfigError
from scaleforge.data.sources import DatasetInfo, describe, localized
from scaleforge.text.corpus import CorpusError, load_corpus
from scaleforge.text.dataset import describe_text


def check_files(spec: DataSpec, field: str = "data") -> None:
    """Check that every file ``spec`` names exists.

    Args:
        spec: The data section.
        field: Its dotted name in the config, for the message.

    Raises:
        ConfigError: ``data.source: data file '...' does not exist`` (or ``data.test_path``), or its
            storage (or, for MNIST-1D, ``data.cache_dir``'s) cannot be reached.
    """
    if spec.is_mnist1d:
        try:
            storage.check_reachable(spec.cache_dir)
        except storage.StorageError as err:
            raise ConfigError(f"{field}.cache_dir: {err}") from None
    local = localized(spec)
    for name in ("source", "test_path"):
        written = getattr(spec, name)
        if not written or spec.is_mnist1d:
            continue
        try:
            exists = storage.is_file(getattr(local, name))
        except storage.StorageError as err:
            raise ConfigError(f"{field}.{name}: {err}") from None
        if not exists:
            raise ConfigError(f"{field}.{name}: data file {storage.describe(written)!r} does not exist")


def check_data(spec: Union[DataSpec, TextDataSpec], field: str = "data") -> DatasetInfo:
    """Check that ``spec``'s files exist and can be read, and return the dataset's sizes.

    Args:
        spec: The data section.
        field: Its dotted name in the config, for the message.

    Returns:
        Sizes of the dataset (examples, input length, classes), read cheaply.

    Raises:
        ConfigError: a file is missing, unreadable, or holds malformed arrays.
    """
    if spec.kind == "text":
        try:
            info = describe_text(
                spec, load_corpus(localized(spec).source, spec.validation_fraction, spec.column)
            )
        except CorpusError as err:
            raise ConfigError(f"{field}.source: {err}") from None
        if not info.num_test:
            raise ConfigError(
                f"{field}.seq_len ({spec.seq_len}): the validation split of {spec.source!r} is shorter "
                "than one window; lower data.seq_len or raise data.validation_fraction"
            )
        return info
    check_files(spec, field)
    try:
        return describe(spec)
    except (KeyError, OSError, ArrowException) as err:
        raise ConfigError(f"{field}.source: cannot read {spec.source}: {err}") from None
    except ValueError as err:  # malformed arrays: the message names the file and what is wrong
        raise ConfigError(str(err)) from None
