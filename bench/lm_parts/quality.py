"""1. Quality: the shipped config on Ray Train against one plain PyTorch process given its wall-clock,
and the general-purpose compressors."""

import time
from pathlib import Path

from lm_parts.runs import job, plain
from lm_parts.setup import OUT, Sizes
from scaleforge.runtime import ensure_ray
from scaleforge.text.corpus import load_corpus
from scaleforge.text.tokenizer import compressed_bits_per_byte
from scaleforge.train import run_training


def quality(tmp: Path, sizes: Sizes) -> list:
    """The shipped config on Ray Train against one plain process given its wall-clock, and the compressors."""
    cfg = job(tmp, "lm_small", *sizes.cut)
    corpus = load_corpus(cfg.data.source, cfg.data.validation_fraction, cfg.data.column)
    validation = corpus.read("validation")[: cfg.data.max_validation_bytes]
    gzip, xz = (compressed_bits_per_byte(validation, name) for name in ("gzip -9", "xz -9e"))
    began = time.perf_counter()
    ensure_ray(min_cpus=8)  # the 4-worker layouts; this run uses 2 workers
    ours = run_training(cfg)
    ray_wall = time.perf_counter() - began
    # One process makes the update the data-parallel step makes: a batch of the workers' batches together.
    whole_batch = f"optim.batch_size={cfg.optim.batch_size * cfg.dims.data_world}"
    single, _ = plain(
        "single",
        tmp,
        "--seconds",
        f"{ray_wall:.1f}",
        "--threads",
        "2",
        *(f"--set={override}" for override in (*sizes.cut, whole_batch)),
    )
    bits = ours.metrics["bits_per_byte"]
    print(
        f"validation: {len(validation):,} bytes of {cfg.data.source} ({corpus.fingerprint()[:19]}...); "
        f"gzip -9 {gzip:.3f}, xz -9e {xz:.3f} bits/byte",
        file=OUT,
    )
    print(
        f"quality, {ray_wall / 60:.1f} min each: Ray Train dp=2 {bits:.3f} bits/byte at "
        f"{ours.metrics['tokens_per_s']:,.0f} tokens/s; one plain PyTorch process ({single['threads']} "
        "threads) "
        f"{single['bits_per_byte']:.3f} at {single['tokens_per_s']:,.0f} tokens/s ({single['steps']:,} "
        "steps of "
        f"{single['batch_size']}, scored {single['total_s']:.0f} s after its start-up began, "
        f"{single['scoring_s_estimated']:.0f} s set aside for scoring); "
        f"{bits - xz:+.3f} bits/byte from xz -9e",
        file=OUT,
    )
    return [
        (
            "bits/byte, train_lm_small.yaml (dp=2)",
            f"{bits:.3f} in {ray_wall / 60:.1f} min",
            f"<= gzip -9 {gzip:.3f}, < 15 min",
            bits <= gzip and ray_wall < 900,
        ),
        (
            "bits/byte against one plain process, same wall-clock",
            f"{bits:.3f} vs {single['bits_per_byte']:.3f}",
            "<= plain",
            bits <= single["bits_per_byte"],
        ),
    ]
