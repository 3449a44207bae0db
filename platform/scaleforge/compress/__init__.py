"""Compression: distillation, pruning, low-rank factorization and quantization, run as a recipe.

Steps are plain torch (``prune``, ``low_rank``, ``quantize``, ``finetune``); distillation and
sweeps use Ray; ``run.run_compression`` is the job. Compressed models are saved as ordinary
artifacts whose manifest lists the architecture edits, so ``scaleforge.artifacts.load_model``
rebuilds any of them.
"""

from scaleforge.config.compress import CompressJobConfig
from scaleforge.lazy import lazy_exports

__all__ = ["CompressJobConfig", "CompressionResult", "run_compression"]
__getattr__ = lazy_exports(
    __name__, {"CompressionResult": "scaleforge.compress.run", "run_compression": "scaleforge.compress.run"}
)
