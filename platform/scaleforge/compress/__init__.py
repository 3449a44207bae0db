"""Compression: distillation, pruning, low-rank factorization and quantization, run as a recipe.

Each step is one file under ``steps/`` (its config entry, check, apply and replay) over the plain
torch algorithms here (``prune``, ``low_rank``, ``quantize``, ``finetune``); distillation and sweeps
use Ray; ``run.run_compression`` is the job. Compressed models are saved as ordinary artifacts whose
manifest lists the architecture edits, so ``scaleforge.artifacts.load_model`` rebuilds any of them.
"""

from scaleforge.lazy import lazy_exports

__all__ = ["CompressJobConfig", "CompressionResult", "run_compression"]
__getattr__ = lazy_exports(
    __name__,
    {
        "CompressJobConfig": "scaleforge.config.compress",
        "CompressionResult": "scaleforge.compress.run",
        "run_compression": "scaleforge.compress.run",
    },
)
