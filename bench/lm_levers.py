"""The levers of a model that does not fit, on the language model: precision, compilation and
recomputation, each against the same job without it, side by side in one run.

    .venv/bin/python bench/lm_levers.py      (about 25 minutes on 2 idle cores)

On ``configs/train_lm_tiny.yaml`` (2 workers, one thread each), run as a user runs it through one
local Ray:

1. **bf16 against fp32** (``optim.precision``): the shipped config under dp=2 and fsdp=2, trained to
   the end both ways on the same batches (one seeded order) with each of 3 seeds, the order of the
   two precisions swapped every seed; bar: the median of bf16's validation bits/byte within 0.02 of
   fp32's (a gap beyond 0.02 by less than the spread of the seeds is a tie). Tokens/s of the last
   epoch beside it.
2. **torch.compile against eager** (``run.compile``) for dp=2, fsdp=2, tp=2 and pp=2: two epochs of a
   third of the bytes, tokens/s of the second (the first pays for compiling), two rounds with the
   order swapped, medians and spreads; bar: compiled dp=2 at least 1.15x eager. Beside it, what
   fusion could give at most, measured: the share of one eager training step of the same model,
   batch and thread that goes to matrix multiplications, attention and the optimiser (kernels that
   inductor leaves to oneDNN / MKL or to torch's own), from torch's profiler; fusing everything else to
   zero time would speed the step up by at most ``1 / share``.
3. **Activation checkpointing** (``parallel.activation_checkpointing``): tokens/s of dp=2 with
   ``full`` and ``selective`` against ``none``, the same two epochs (what recomputation costs; what
   it saves is ``tests/models/test_recompute.py``'s).

Prints each bar with met/missed (a gap inside the spread is a tie); exit status 1 if one was missed.
"""

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "platform"), str(ROOT)]

from bars import print_bars  # noqa: E402
from jobs_here import job_folder  # noqa: E402
from lm_compile import kernel_share  # noqa: E402
from provenance import check_and_print  # noqa: E402

from scaleforge.config import TrainJobConfig, load_config  # noqa: E402
from scaleforge.runtime import ensure_ray  # noqa: E402
from scaleforge.train import run_training  # noqa: E402
from scaleforge.train.preflight import check_runnable  # noqa: E402

CONFIG = ROOT / "configs/train_lm_tiny.yaml"
SHORT = ["data.max_train_bytes=100000", "optim.epochs=2"]
LAYOUTS = {"dp=2": [], "fsdp=2": ["parallel.fsdp=2"], "tp=2": ["parallel.tp=2"], "pp=2": ["parallel.pp=2"]}
ROUNDS = 2
EARLIER_BF16_GAP = {
    "dp=2": "+0.0405 with bf16 evaluation, +0.0405 after",
    "fsdp=2": "+0.0589 with bf16 evaluation, +0.0091 after",
}
"""bf16's gap when this bench ran one seed per precision. In its first complete run evaluation ran under
autocast too (bf16 logits) and FSDP gathered bf16 parameters, and the bar was missed on both layouts;
evaluation now scores the fp32 weights in fp32, as the exported model is scored, and FSDP gathers
fp32 (the code changed, not the metric). The run after that still missed on dp=2 by a gap
that one plain process of the same model and data also shows in part (+0.0135): one seed cannot tell
a bias from the spread of seeds, so the statistic is now the median of SEEDS seeds per side, with the
spread, and a gap inside the spread is a tie; the one-seed figures stay printed."""
SEEDS = (0, 1, 2)
ONE_ORDER = ["run.checkpoint_every_steps=500"]
"""Step checkpoints (none falls due in these runs) read one seeded order of the data on every worker,
so both precisions see the same batches; Ray Data's streaming split hands blocks to whichever worker
asks first, which moves dp=2's final bits/byte by several hundredths from run to run."""


def _train(tmp: Path, name: str, *overrides: str):
    cfg = load_config(
        TrainJobConfig,
        CONFIG,
        [*overrides, f"run.name={name}", f"run.storage_path={tmp / 'runs'}", f"artifact.dir={tmp / name}"],
        check_runnable,
    )
    result = run_training(cfg)
    last = result.history[-1]
    print(f"{name}: {last['bits_per_byte']:.4f} bits/byte, {last['tokens_per_s']:,.0f} tokens/s", flush=True)
    return last


def _precision(tmp: Path) -> list:
    """bf16 against fp32, SEEDS seeds each (the order of the two swapped every seed): median bits/byte."""
    rows = []
    for layout in ("dp=2", "fsdp=2"):
        runs: dict[str, list[dict]] = {"fp32": [], "bf16": []}
        for seed in SEEDS:
            for p in ("fp32", "bf16") if seed % 2 == 0 else ("bf16", "fp32"):
                name = f"{layout}-{p}-seed{seed}".replace("=", "")
                overrides = [*LAYOUTS[layout], *ONE_ORDER, f"optim.precision={p}", f"optim.seed={seed}"]
                runs[p].append(_train(tmp, name, *overrides))
        fp32, bf16 = ([run["bits_per_byte"] for run in runs[p]] for p in ("fp32", "bf16"))
        gaps = [b - f for f, b in zip(fp32, bf16)]
        gap = statistics.median(bf16) - statistics.median(fp32)
        spread = max(max(fp32) - min(fp32), max(bf16) - min(bf16))
        met = True if abs(gap) <= 0.02 else (None if abs(gap) - spread <= 0.02 else False)
        speed = {p: statistics.median(run["tokens_per_s"] for run in runs[p]) for p in runs}
        rows.append(
            (
                f"{layout}: bf16 vs fp32 bits/byte",
                f"{statistics.median(bf16):.4f} vs {statistics.median(fp32):.4f} ({gap:+.4f}, medians of "
                f"{len(SEEDS)} seeds, spread {spread:.4f}; per seed {' '.join(f'{g:+.4f}' for g in gaps)}; "
                f"one seed: {EARLIER_BF16_GAP[layout]}); tokens/s {speed['bf16']:,.0f} vs "
                f"{speed['fp32']:,.0f}",
                "within 0.02",
                met,
            )
        )
    return rows


def _rounds(tmp: Path, tag: str, variants: dict[str, list[str]]) -> dict[str, list[float]]:
    """Second-epoch tokens/s of each variant, ROUNDS times, the order swapped every round."""
    speeds: dict[str, list[float]] = {name: [] for name in variants}
    for index in range(ROUNDS):
        order = list(variants) if index % 2 == 0 else list(reversed(variants))
        for name in order:
            run = f"{tag}-{name}-{index}".replace("=", "")
            speeds[name].append(_train(tmp, run, *SHORT, *variants[name])["tokens_per_s"])
    return speeds


def _ratio_row(what: str, fast: list[float], slow: list[float], bar: float | None):
    """Median of ``fast`` over median of ``slow``, with each side's spread."""
    ratio = statistics.median(fast) / statistics.median(slow)
    spread = max(max(fast) - min(fast), max(slow) - min(slow)) / statistics.median(slow)
    measured = (
        f"{ratio:.2f}x ({statistics.median(fast):,.0f} vs {statistics.median(slow):,.0f} tokens/s, "
        f"spread {spread:.2f})"
    )
    if bar is None:
        return (what, measured, "reported", True)
    met = True if ratio >= bar else (None if ratio + spread >= bar else False)
    return (what, measured, f">= {bar:.2f}x", met)


def _compile(tmp: Path) -> list:
    rows = []
    for layout, overrides in LAYOUTS.items():
        tag = layout.replace("=", "")
        speeds = _rounds(tmp, tag, {"eager": overrides, "compiled": [*overrides, "run.compile=true"]})
        bar = 1.15 if layout == "dp=2" else None
        rows.append(
            _ratio_row(f"{layout}: compiled vs eager tokens/s", speeds["compiled"], speeds["eager"], bar)
        )
    return rows


def _recompute(tmp: Path) -> list:
    speeds = _rounds(
        tmp,
        "ac",
        {mode: [f"parallel.activation_checkpointing={mode}"] for mode in ("none", "full", "selective")},
    )
    return [
        _ratio_row(f"dp=2: {mode} recomputation vs none tokens/s", speeds[mode], speeds["none"], None)
        for mode in ("full", "selective")
    ]


def main() -> int:
    check_and_print()
    rows = []
    with job_folder("levers") as tmp:
        ensure_ray(min_cpus=4)
        rows += _precision(tmp)
        rows += _compile(tmp)
        share = kernel_share(load_config(TrainJobConfig, CONFIG))
        rows += _recompute(tmp)
    rows.append(
        (
            "dp=2: an eager step in matmuls, attention, optimiser",
            f"{share:.0%} of its time: fusing all the rest away gains at most {1 / share:.2f}x",
            "reported",
            True,
        )
    )
    return print_bars(rows, "lever")


if __name__ == "__main__":
    sys.exit(main())
