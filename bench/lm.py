"""The language model against plain PyTorch and general-purpose compressors, side by side in one run.

    .venv/bin/python bench/lm.py           (about 75 minutes on 2 idle cores)
    .venv/bin/python bench/lm.py --quick   (a few minutes: everything runs on a slice of the bytes;
                                            its bars say nothing about the full run)

On ``configs/train_lm_small.yaml``'s model and bytes (the standard library's sources):

1. **Quality.** The config run as shipped (Ray Train, 2 data-parallel workers, one thread each);
   then one plain PyTorch process, both cores' threads, given the same wall-clock as the whole Ray
   job took (start-up and the final scoring included on both sides), its batch the workers' batches
   together (the same update per step), its warm-up and cosine laid over its training time
   (``bench/peers/lm_plain.py single``). Both score the same
   validation windows in bits per byte; ``gzip -9`` and ``xz -9e`` compress the same validation bytes.
2. **Throughput.** The same model, batch and optimiser under PyTorch DDP the torchrun way (two
   processes, gloo, a ``DistributedSampler`` each: ``bench/peers/lm_plain.py ddp``) against the Ray Train
   job with the same two workers and per-rank batches: tokens/s in steady state (DDP's steps 50-300,
   Ray Train's 300-1,000: see ``Sizes``), the time up to then reported apart. Three rounds, DDP and
   the Ray side in turn (the order swapped each round), medians compared; DDP also runs beside the
   idle Ray cluster, which shows what the cluster's own processes (GCS, raylet, dashboard, agents,
   idle workers) cost on these cores, and both sides again on one rank, with a core to spare for
   everything but the training. It runs first, before this process starts a Ray of its own.
3. **Layouts.** Tokens/s, model and optimiser state per worker, and peak resident memory per worker
   of each layout the job offers, on the same model (an MoE feed-forward for ``ep``).

Prints each bar with met/missed; exit status 1 if one was missed.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import redirect_stdout
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import ray
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "platform"), str(ROOT)]

from bars import print_bars  # noqa: E402
from peers.lm_plain import peak_rss_mib  # noqa: E402

from scaleforge.config import TrainJobConfig, load_config  # noqa: E402
from scaleforge.distributed.memory import local_bytes  # noqa: E402
from scaleforge.runtime import ensure_ray  # noqa: E402
from scaleforge.text.corpus import load_corpus  # noqa: E402
from scaleforge.text.tokenizer import compressed_bits_per_byte  # noqa: E402
from scaleforge.train import run_training  # noqa: E402
from scaleforge.train.hooks import TrainHook  # noqa: E402
from scaleforge.train.preflight import check_runnable  # noqa: E402

CONFIG = ROOT / "configs" / "train_lm_small.yaml"


@dataclass(frozen=True)
class Sizes:
    """Optimiser steps of the throughput runs (DDP's, Ray Train's) and of each layout's run, and how
    many of the first are start-up rather than steady state; rounds of the throughput comparison;
    ``cut``: overrides that slice the bytes (``--quick``).

    DDP's tokens/s is flat after 50 steps; Ray Train's after its first ~100 (its progress lines, every
    100 steps, on 1-6 MB slices of the corpus), so its steady window is steps 300 to 1,000."""

    steps: int = 300
    warmup: int = 50
    ray_steps: int = 1000
    ray_warmup: int = 300
    layout_steps: int = 60
    layout_warmup: int = 10
    repeats: int = 3
    cut: tuple[str, ...] = ()


QUICK = Sizes(40, 10, 40, 10, 12, 4, 1, ("data.max_train_bytes=400000", "data.max_validation_bytes=100000"))
MOE = (
    "model.moe.num_experts=4",
    "model.moe.expert_hidden=256",
    "model.moe.top_k=1",
    "model.moe.capacity_factor=2.0",
)
LAYOUTS = {  # name: (workers, overrides)
    "dp=2": (2, ()),
    "fsdp=2": (2, ("parallel.fsdp=2",)),
    "tp=2": (2, ("parallel.tp=2",)),
    "pp=2 gpipe": (2, ("parallel.pp=2", "parallel.pp_schedule=gpipe")),
    "pp=2 1f1b": (2, ("parallel.pp=2", "parallel.pp_schedule=1f1b")),
    "ep=2 (MoE, 4 experts)": (2, ("parallel.ep=2", *MOE)),
    "dp=2 x tp=2": (4, ("parallel.tp=2",)),
    "fsdp=2 x tp=2": (4, ("parallel.fsdp=2", "parallel.tp=2")),
    "dp=2 x pp=2": (4, ("parallel.pp=2",)),
}


class Meter(TrainHook):
    """Steady-state tokens/s (rank 0's clock, steps after ``warmup``) and every worker's peak RSS."""

    def __init__(self, warmup: int, tokens_per_step: int):
        self.warmup, self.tokens_per_step, self.starts, self.warm_at = warmup, tokens_per_step, [], None

    def on_epoch_start(self, ctx, epoch: int) -> None:
        self.starts = []

    def on_step(self, ctx, epoch: int, step: int) -> None:
        self.starts.append(time.perf_counter())
        if step == self.warmup:
            self.warm_at = time.time()

    def epoch_metrics(self, ctx) -> dict:
        finished = time.perf_counter()
        steady = (
            (len(self.starts) - self.warmup) * self.tokens_per_step / (finished - self.starts[self.warmup])
        )
        mine = (peak_rss_mib(), sum(local_bytes(p) for p in ctx.model.module.parameters()) / 2**20)
        gathered = [None] * ctx.world
        dist.all_gather_object(gathered, mine)
        return {
            "steady_tokens_per_s": steady,
            "warm_at": self.warm_at,
            "rss_mib_per_worker": [g[0] for g in gathered],
            "param_mib_per_worker": [g[1] for g in gathered],
        }


def job(tmp: Path, name: str, *overrides: str) -> TrainJobConfig:
    return load_config(
        TrainJobConfig,
        CONFIG,
        [*overrides, f"artifact.dir={tmp / name}", f"run.storage_path={tmp / 'runs'}"],
        check_runnable,
    )


def short_job(tmp: Path, name: str, workers: int, steps: int, *overrides: str) -> TrainJobConfig:
    """The config cut to ``steps`` optimiser steps of one epoch (and a token validation split)."""
    cfg = job(tmp, name, f"scaling.num_workers={workers}", *overrides)
    seq, batch = cfg.data.seq_len, cfg.optim.batch_size
    return job(
        tmp,
        name,
        f"scaling.num_workers={workers}",
        *overrides,
        "run.log_every_steps=null",
        f"data.max_train_bytes={steps * cfg.dims.data_world * batch * seq + 1}",
        f"data.max_validation_bytes={batch * cfg.dims.data_world * seq + 1}",
    )


def timed(cfg: TrainJobConfig, warmup: int) -> tuple[dict, float]:
    """Metrics of ``cfg`` trained with a :class:`Meter`, and its start-up: call to the first steady step."""
    called = time.time()
    meter = Meter(warmup, cfg.optim.batch_size * cfg.dims.data_world * cfg.data.seq_len)
    metrics = run_training(cfg, hooks=[meter]).metrics
    return metrics, metrics["warm_at"] - called


def plain(mode: str, tmp: Path, *args: str, ranks: int = 2) -> tuple[dict, float]:
    """``bench/peers/lm_plain.py`` (under torchrun with ``ranks`` processes for ``ddp``): its result and when it
    was launched."""
    out = tmp / f"{mode}.json"
    launcher = (
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)]
        if mode == "ddp"
        else [sys.executable]
    )
    began = time.time()
    subprocess.run(
        [
            *launcher,
            str(ROOT / "bench" / "peers" / "lm_plain.py"),
            mode,
            "--config",
            str(CONFIG),
            "--out",
            str(out),
            *args,
        ],
        check=True,
        cwd=ROOT,
        stdout=sys.stderr,
    )
    return json.loads(out.read_text()), began


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
        f"{ours.metrics['tokens_per_s']:,.0f} tokens/s; one plain PyTorch process ({single['threads']} threads) "
        f"{single['bits_per_byte']:.3f} at {single['tokens_per_s']:,.0f} tokens/s ({single['steps']:,} steps of "
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


def throughput(tmp: Path, sizes: Sizes) -> list:
    """torchrun DDP against Ray Train: steady tokens/s of the same model on the same two workers.

    ``sizes.repeats`` rounds, each of two sides in turn, their order swapped every round so that the
    machine's drift over the part favours neither: torchrun with no Ray on the machine (two ranks, then
    one), and a process of its own (:func:`ray_round`) that starts an embedded Ray, runs DDP beside the
    idle cluster (what the cluster's own processes cost on these cores), then the Ray Train job on two
    workers and on one. The one-rank pair is the same comparison with a core to spare for everything
    but the training: it separates what Ray costs inside a worker from what its processes take from
    two workers that fill both cores. Medians are compared.
    """
    if ray.is_initialized():
        raise RuntimeError(
            "the throughput part measures DDP with no Ray on the machine: run it before the others"
        )
    cfg = job(tmp, "lm_small")
    alone, rounds = [], []
    for index in range(sizes.repeats):
        sides = [
            lambda: alone.append(
                {
                    "two": plain("ddp", tmp, *_ddp_steps(sizes)),
                    "one": plain("ddp", tmp, *_ddp_steps(sizes), ranks=1),
                }
            ),
            lambda: rounds.append(_in_own_process(tmp, sizes, index)),
        ]
        for side in sides if index % 2 == 0 else sides[::-1]:
            side()
    rates = {
        "alone": [run["two"][0]["tokens_per_s"] for run in alone],
        "beside": [r["beside"]["tokens_per_s"] for r in rounds],
        "ours": [r["ours"][0]["steady_tokens_per_s"] for r in rounds],
        "alone 1": [run["one"][0]["tokens_per_s"] for run in alone],
        "ours 1": [r["one"][0]["steady_tokens_per_s"] for r in rounds],
    }
    median = {name: statistics.median(values) for name, values in rates.items()}
    print(
        f"throughput, steps of {cfg.optim.batch_size} x {cfg.data.seq_len} tokens per rank (DDP: {sizes.steps}, steady "
        f"after {sizes.warmup}; Ray Train: {sizes.ray_steps}, steady after {sizes.ray_warmup}); median of {sizes.repeats} "
        f"rounds, torchrun and the Ray side in turn (each run's tokens/s in brackets):",
        file=OUT,
    )
    for label, name in (
        ("torchrun DDP, 2 ranks, no Ray on the machine", "alone"),
        ("torchrun DDP, 2 ranks, beside an idle Ray cluster", "beside"),
        ("Ray Train, 2 workers (on that cluster)", "ours"),
        ("torchrun DDP, 1 rank, no Ray on the machine", "alone 1"),
        ("Ray Train, 1 worker", "ours 1"),
    ):
        print(f"  {label:50s} {median[name]:7,.0f} tokens/s [{_each(rates[name])}]", file=OUT)
    print(
        f"  until the steady window: torchrun {_each((run['two'][0]['warm_at'] - run['two'][1] for run in alone), '.1f')} s "
        f"from launch to step {sizes.warmup}; Ray Train {_each((r['ours'][1] for r in rounds), '.1f')} s from the call "
        f"to step {sizes.ray_warmup}\n"
        f"  peak RSS per worker: torchrun {_mib(alone[-1]['two'][0]['rss_mib_per_rank'])}; "
        f"Ray Train {_mib(rounds[-1]['ours'][0]['rss_mib_per_worker'])}",
        file=OUT,
    )
    ratio, one = median["ours"] / median["alone"], median["ours 1"] / median["alone 1"]
    print(
        f"  the idle cluster alone costs DDP {1 - median['beside'] / median['alone']:.0%} of its tokens/s; "
        f"Ray Train / DDP beside it {median['ours'] / median['beside']:.2f}; with a core to spare (1 rank) "
        f"Ray Train / DDP {one:.2f}",
        file=OUT,
    )
    return [
        ("steady tokens/s, Ray Train / torchrun DDP", f"{ratio:.2f}", ">= 0.90", ratio >= 0.9),
        ("the same, 1 rank, a core to spare", f"{one:.2f}", ">= 0.90", one >= 0.9),
    ]


def ray_round(tmp: Path, sizes: Sizes) -> dict:
    """One round's Ray side, in a process of its own (a second ``ray.init`` after ``ray.shutdown`` in one
    process can crash on actor handles that Ray Data keeps): DDP beside the idle embedded cluster, then
    the Ray Train runs on it, on two workers and on one (metrics, and seconds from the call to the
    steady window)."""
    ensure_ray(min_cpus=8)
    time.sleep(15)  # past the cluster's own start-up (its processes and prestarted workers): idle
    beside, _ = plain("ddp", tmp, *_ddp_steps(sizes))
    return {
        "beside": beside,
        **{
            name: timed(short_job(tmp, "throughput", workers, sizes.ray_steps), sizes.ray_warmup)
            for name, workers in (("ours", 2), ("one", 1))
        },
    }


def _in_own_process(tmp: Path, sizes: Sizes, index: int) -> dict:
    out = tmp / f"ray_round_{index}.json"
    subprocess.run(
        [sys.executable, __file__, "--ray-round", str(out), "--sizes", json.dumps(asdict(sizes))],
        check=True,
        cwd=ROOT,
        stdout=sys.stderr,
    )
    return json.loads(out.read_text())


def _ddp_steps(sizes: Sizes) -> tuple[str, ...]:
    return ("--steps", str(sizes.steps), "--warmup", str(sizes.warmup), *(f"--set={o}" for o in sizes.cut))


def _each(values, spec: str = ",.0f") -> str:
    return ", ".join(format(v, spec) for v in values)


def layouts(tmp: Path, sizes: Sizes) -> list:
    """Every layout on the same model: tokens/s and memory per worker (a table, no bar)."""
    ensure_ray(min_cpus=8)
    print_layouts(
        {
            name: timed(
                short_job(tmp, name.split()[0], workers, sizes.layout_steps, *overrides), sizes.layout_warmup
            )[0]
            for name, (workers, overrides) in LAYOUTS.items()
        },
        sizes,
    )
    return []


PARTS = {"throughput": throughput, "quality": quality, "layouts": layouts}
"""In the order they run (``--part`` in any order keeps it)."""
OUT = sys.stdout
"""The tables and bars; the jobs' own progress goes to stderr (``make bench`` keeps stdout)."""


def main(sizes: Sizes, parts: list[str]) -> int:
    rows = []
    with tempfile.TemporaryDirectory(prefix="scaleforge-bench-lm-") as folder, redirect_stdout(sys.stderr):
        for part in (name for name in PARTS if name in parts):
            rows += PARTS[part](Path(folder), sizes)
    print()
    return print_bars(rows, "target")


def print_layouts(layouts: dict[str, dict], sizes: Sizes) -> None:
    print(
        f"\nlayouts ({sizes.layout_steps} steps, steady after {sizes.layout_warmup}). params: parameter MiB each worker "
        f"holds; state: parameters + gradients + AdamW moments, as the split strategies measure it, else 4x the "
        f"worker's parameters (AdamW); one process holds {4 * layouts['dp=2']['param_mib_per_worker'][0]:.2f} MiB of state:",
        file=OUT,
    )
    print(
        f"{'layout':24s} {'tokens/s':>9s} {'params/worker':>23s} {'state/worker':>23s} {'peak RSS/worker':>19s}",
        file=OUT,
    )
    for name, metrics in layouts.items():
        params = metrics["param_mib_per_worker"]
        state = (
            [_state(r) for r in metrics["memory_per_worker"]]
            if "memory_per_worker" in metrics
            else [4 * p for p in params]
        )
        print(
            f"{name:24s} {metrics['steady_tokens_per_s']:9,.0f} {_mib(params, 2):>23s} {_mib(state, 2):>23s} "
            f"{_mib(metrics['rss_mib_per_worker']):>19s}",
            file=OUT,
        )


def _state(report: dict) -> float:
    return (report["params"] + report["grads"] + report["optimizer"]) / 2**20


def _mib(values, decimals: int = 0) -> str:
    return "/".join(f"{v:.{decimals}f}" for v in values)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="every part on a slice of the bytes (bars say nothing)"
    )
    parser.add_argument(
        "--repeats", type=int, help=f"rounds of the throughput part (default {Sizes.repeats})"
    )
    parser.add_argument(
        "--part", action="append", choices=list(PARTS), help="run only this part (repeatable)"
    )
    parser.add_argument(
        "--ray-round", type=Path, help=argparse.SUPPRESS
    )  # the throughput part's own processes
    parser.add_argument("--sizes", type=json.loads, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ray_round:
        sizes = Sizes(**{**args.sizes, "cut": tuple(args.sizes["cut"])})
        with (
            tempfile.TemporaryDirectory(prefix="scaleforge-bench-lm-") as folder,
            redirect_stdout(sys.stderr),
        ):
            args.ray_round.write_text(json.dumps(ray_round(Path(folder), sizes)))
        sys.exit(0)
    sizes = QUICK if args.quick else Sizes()
    sys.exit(main(replace(sizes, repeats=args.repeats or sizes.repeats), args.part or list(PARTS)))
