"""1. Quality: the shipped config on Ray Train against one plain PyTorch process given its wall-clock, in
alternating runs, and the general-purpose compressors."""

import statistics
import time
from pathlib import Path

from lm_parts.machine import wait_for_no_ray
from lm_parts.runs import in_own_process, job, plain
from lm_parts.setup import OUT, Sizes
from scaleforge.text.corpus import load_corpus
from scaleforge.text.tokenizer import compressed_bits_per_byte
from scaleforge.train import run_training


def quality(tmp: Path, sizes: Sizes, target: float | None = None) -> list:
    """``sizes.quality_runs`` runs a side in turn: the shipped config on Ray Train (a process of its own,
    whose Ray goes with it), then, once no Ray is left on the machine, one plain process given the
    wall-clock that Ray run took; and the compressors on the same validation bytes. Each Ray run's bar:
    at most ``target`` bits/byte, else gzip -9's, within 15 minutes."""
    cfg = job(tmp, "lm_small", *sizes.cut, config=sizes.config_path)
    corpus = load_corpus(cfg.data.source, cfg.data.validation_fraction, cfg.data.column)
    validation = corpus.read("validation")[: cfg.data.max_validation_bytes]
    gzip, xz = (compressed_bits_per_byte(validation, name) for name in ("gzip -9", "xz -9e"))
    # One process makes the update the data-parallel step makes: a batch of the workers' batches together.
    whole_batch = f"optim.batch_size={cfg.optim.batch_size * cfg.dims.data_world}"
    ours, single = [], []
    for index in range(sizes.quality_runs):
        ours.append(in_own_process(tmp, "quality_run", sizes, index))
        wait_for_no_ray(sizes.other_ray_ok)
        single.append(
            plain(
                "single",
                tmp,
                "--seconds",
                f"{ours[-1]['wall_s']:.1f}",
                "--threads",
                "2",
                *(f"--set={override}" for override in (*sizes.cut, whole_batch)),
                config=sizes.config_path,
            )[0]
        )
    print(
        f"validation: {len(validation):,} bytes of {cfg.data.source} ({corpus.fingerprint()[:19]}...); "
        f"gzip -9 {gzip:.3f}, xz -9e {xz:.3f} bits/byte",
        file=OUT,
    )
    return _report(ours, single, gzip, xz, sizes.config, target)


def quality_run(tmp: Path, sizes: Sizes) -> dict:
    """The shipped config on Ray Train, in a process of its own (``bench/lm.py --own-process``): bits per
    byte, tokens/s and the wall-clock from the call (Ray's start included) to the scored result."""
    cfg = job(tmp, "lm_small", *sizes.cut, config=sizes.config_path)
    began = time.perf_counter()
    metrics = run_training(cfg).metrics
    return {
        "bits_per_byte": metrics["bits_per_byte"],
        "tokens_per_s": metrics["tokens_per_s"],
        "wall_s": time.perf_counter() - began,
    }


def versus(ours: list[float], theirs: list[float]) -> bool | None:
    """Lower is better: True when the mean of ``ours`` is below the mean of ``theirs`` by more than the
    spread (the larger of the two sides' max - min), False when above by more, None (a tie) when the gap
    is inside the spread."""
    gap = statistics.mean(ours) - statistics.mean(theirs)
    return None if abs(gap) <= _spread(ours, theirs) else gap < 0


def _spread(*sides: list[float]) -> float:
    return max(max(side) - min(side) for side in sides)


def _report(
    ours: list[dict], single: list[dict], gzip: float, xz: float, config: str, target: float | None
) -> list:
    bits, plain_bits = [o["bits_per_byte"] for o in ours], [s["bits_per_byte"] for s in single]
    walls = [o["wall_s"] for o in ours]
    print(
        f"quality, {len(ours)} runs a side in turn (Ray Train, then plain, ...), each plain run given the "
        f"wall-clock of the Ray run before it ({_each(w / 60 for w in walls)} min), start-up and scoring "
        "included on both sides; bits/byte: mean, spread (max - min) and each run:",
        file=OUT,
    )
    for label, values, extra in (
        (f"Ray Train dp=2, {config}", bits, f"{_each((o['tokens_per_s'] for o in ours), ',.0f')} tokens/s"),
        (
            f"one plain PyTorch process, {single[0]['threads']} threads",
            plain_bits,
            f"{_each((s['tokens_per_s'] for s in single), ',.0f')} tokens/s; "
            f"{_each((s['steps'] for s in single), ',')} steps of {single[0]['batch_size']}; scoring "
            f"{_each((s['scoring_s_estimated'] for s in single), '.0f')} s set aside",
        ),
    ):
        print(
            f"  {label:38s} {statistics.mean(values):.3f}, spread {max(values) - min(values):.3f} "
            f"[{_each(values, '.3f')}]; {extra}",
            file=OUT,
        )
    mean, plain_mean = statistics.mean(bits), statistics.mean(plain_bits)
    print(
        f"  Ray Train's mean {mean - xz:+.3f} bits/byte from xz -9e (the moonshot: below it, "
        f"{'reached' if max(bits) < xz else 'not reached'})",
        file=OUT,
    )
    bar, label = (target, f"{target:.2f}") if target else (gzip, f"gzip -9 {gzip:.3f}")
    return [
        (
            f"bits/byte, {config} (dp=2)",
            f"{mean:.3f} (max {max(bits):.3f}) in <= {max(walls) / 60:.1f} min",
            f"each <= {label}, < 15 min",
            max(bits) <= bar and max(walls) < 900,
        ),
        (
            "bits/byte against one plain process, same wall-clock",
            f"{mean:.3f} vs {plain_mean:.3f}, spread {_spread(bits, plain_bits):.3f}",
            "<= plain beyond the spread",
            versus(bits, plain_bits),
        ),
    ]


def _each(values, spec: str = ".1f") -> str:
    return ", ".join(format(v, spec) for v in values)
