"""What every part of bench/serving.py shares: the models' shapes, the request size and torch threads."""

from pathlib import Path

from scaleforge.config.serve import ModelEntry
from scaleforge.models import CNN1dSpec

REPO = Path(__file__).resolve().parents[2]
CACHE = Path("~/.cache/scaleforge/serving-bench").expanduser()
STUDENT = CNN1dSpec(channels=[16, 32], hidden=64, pool=True)
# Wide and unpooled so that one batch of 64 costs well over 10 ms on a CPU core: the benchmark
# then measures model cost, not framework overhead.
TEACHER = CNN1dSpec(channels=[96, 192, 192], hidden=256)
EXIT_AFTER = 1  # the early-exit network: the teacher with a side exit after its first conv block
BATCH = 64
THREADS = ModelEntry.model_fields["threads"].default  # torch threads per model process, everywhere
