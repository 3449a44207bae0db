"""d. Elastic capacity and e. the language-model workload of bench/paramserver.py."""

import contextlib
import sys
from pathlib import Path

import numpy as np

from paramserver_parts.common import ROOT, ps_config
from scaleforge.config import AsyncSGDConfig, load_config
from scaleforge.data.in_memory import load_in_memory
from scaleforge.paramserver import run_async_sgd
from scaleforge.paramserver.preflight import check_runnable
from scaleforge.paramserver.report import workers_over_time

ELASTIC_BAR = 0.92


def elastic() -> list:
    """2 workers, 4 from 4 s, 1 from 10 s, each worker's 8 epochs; the plot shows both lines."""
    cfg = ps_config(
        "workers.num_workers=2",
        "run.stop_at_accuracy=null",
        "workers.scaling=[{at_s: 4, workers: 4}, {at_s: 10, workers: 1}]",
    )
    with contextlib.redirect_stdout(sys.stderr):
        result = run_async_sgd(cfg)
    plot = ROOT / "docs/paramserver_elastic.png"
    plot.parent.mkdir(parents=True, exist_ok=True)
    plot.write_bytes(Path(result.plot_path).read_bytes())
    timeline = workers_over_time(result)
    print(
        f"d. Elastic: async, {cfg.workers.num_workers} workers, then 4 from 4 s, then 1 from 10 s; "
        f"plot {plot.relative_to(ROOT)}\n   workers over time: "
        + ", ".join(f"{n} from {t:.1f} s" for t, n in timeline[:-1])
        + f"; {result.updates} updates in {result.wall_s:.1f} s, final test accuracy "
        f"{result.test_accuracy:.4f}",
        flush=True,
    )
    counts = [n for _, n in timeline]
    shape = counts[0] == 2 and max(counts) == 4 and counts[-1] == 1
    return [
        (
            "d. elastic 2 -> 4 -> 1 workers: final test accuracy",
            f"{result.test_accuracy:.4f} ({' -> '.join(map(str, _runs(counts)))} workers)",
            f">= {ELASTIC_BAR}",
            shape and result.test_accuracy >= ELASTIC_BAR,
        )
    ]


def language_model() -> list:
    """``configs/async_sgd_lm.yaml`` in async and sync mode; validation bits per byte of each against
    the unigram entropy of the corpus (training and validation bytes together)."""
    from scaleforge.text.tokenizer import unigram_bits_per_byte

    rows = []
    for mode in ("async", "sync"):
        cfg = load_config(
            AsyncSGDConfig,
            ROOT / "configs/async_sgd_lm.yaml",
            [
                f"server.mode={mode}",
                f"run.output_dir=/tmp/scaleforge-bench-ps-lm/{mode}",
                f"artifact.dir=/tmp/scaleforge-bench-ps-lm/{mode}/model",
            ],
            preflight=check_runnable,
        )
        with contextlib.redirect_stdout(sys.stderr):
            result = run_async_sgd(cfg)
        data = load_in_memory(cfg.data)
        unigram = unigram_bits_per_byte(
            np.concatenate([data.x.ravel(), data.x_test.ravel()]).astype(np.uint8).tobytes()
        )
        print(
            f"e. Language model ({cfg.model.name}, {cfg.model.num_layers} layers, d_model "
            f"{cfg.model.d_model}), "
            f"{mode}: {cfg.server.num_shards} shards, {cfg.workers.num_workers} workers, "
            f"{cfg.workers.epochs} epochs, "
            f"{result.updates} updates in {result.wall_s:.1f} s; validation {result.score:.3f} bits per "
            "byte, "
            f"unigram entropy {unigram:.3f}",
            flush=True,
        )
        rows.append(
            (
                f"e. language model, {mode}: validation bits per byte",
                f"{result.score:.3f}",
                f"< {unigram:.3f} (unigram)",
                result.metric == "bits_per_byte" and result.score < unigram,
            )
        )
    return rows


def _runs(counts: list[int]) -> list[int]:
    """The distinct levels in order (2, 3, 4, 3, 2, 1 -> the same; repeated levels collapse)."""
    return [n for i, n in enumerate(counts) if i == 0 or n != counts[i - 1]]
