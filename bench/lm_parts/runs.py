"""The runs every part of bench/lm.py makes: the job's config cut to size, a Ray Train run timed by a
hook, and the plain-PyTorch peer (``bench/peers/lm_plain.py``) in a process of its own."""

import json
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch.distributed as dist
from peers.lm_plain import peak_rss_mib

from lm_parts.setup import CONFIG, ROOT, Sizes
from scaleforge.config import TrainJobConfig, load_config
from scaleforge.distributed.memory import local_bytes
from scaleforge.train import run_training
from scaleforge.train.hooks import TrainHook
from scaleforge.train.preflight import check_runnable


class Meter(TrainHook):
    """Steady-state tokens/s (rank 0's clock, steps after ``warmup``), the steps run and when the last
    ended (for tokens/s end to end), and every worker's peak RSS."""

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
            "tokens": len(self.starts) * self.tokens_per_step,
            "finished_at": time.time(),  # hooks' epoch metrics come right after the last step
            "rss_mib_per_worker": [g[0] for g in gathered],
            "param_mib_per_worker": [g[1] for g in gathered],
        }


def job(tmp: Path, name: str, *overrides: str, config: Path = CONFIG) -> TrainJobConfig:
    return load_config(
        TrainJobConfig,
        config,
        [*overrides, f"artifact.dir={tmp / name}", f"run.storage_path={tmp / 'runs'}"],
        check_runnable,
    )


def short_job(
    tmp: Path, name: str, workers: int, steps: int, *overrides: str, config: Path = CONFIG
) -> TrainJobConfig:
    """The config cut to ``steps`` optimiser steps of one epoch (and a token validation split); a BPE's
    tokens take about 4 bytes each here (3.7 on the standard library), so a few more steps than that."""
    cfg = job(tmp, name, f"scaling.num_workers={workers}", *overrides, config=config)
    seq, batch = cfg.data.seq_len * (1 if cfg.data.tokenizer == "bytes" else 4), cfg.optim.batch_size
    return job(
        tmp,
        name,
        f"scaling.num_workers={workers}",
        *overrides,
        "run.log_every_steps=null",
        f"data.max_train_bytes={steps * cfg.dims.data_world * batch * seq + 1}",
        f"data.max_validation_bytes={batch * cfg.dims.data_world * seq + 1}",
        config=config,
    )


def timed(cfg: TrainJobConfig, warmup: int) -> tuple[dict, float]:
    """Metrics of ``cfg`` trained with a :class:`Meter` (``called_at`` added: when ``run_training`` was
    called), and its start-up: call to the first steady step."""
    called = time.time()
    meter = Meter(warmup, cfg.optim.batch_size * cfg.dims.data_world * cfg.data.seq_len)
    metrics = run_training(cfg, hooks=[meter]).metrics
    return {**metrics, "called_at": called}, metrics["warm_at"] - called


def plain(mode: str, tmp: Path, *args: str, ranks: int = 2, config: Path = CONFIG) -> tuple[dict, float]:
    """``bench/peers/lm_plain.py`` (under torchrun with ``ranks`` processes for ``ddp``): its result and
    when it was launched."""
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
            str(config),
            "--out",
            str(out),
            *args,
        ],
        check=True,
        cwd=ROOT,
        stdout=sys.stderr,
    )
    return json.loads(out.read_text()), began


def in_own_process(tmp: Path, role: str, sizes: Sizes, index: int) -> dict:
    """``role`` (a function of ``bench/lm.py``'s ``OWN_PROCESS``) run by ``bench/lm.py`` in a process of
    its own, whose embedded Ray goes when it exits (a second ``ray.init`` after ``ray.shutdown`` in one
    process can crash on actor handles that Ray Data keeps): its result, with ``launched_at`` added."""
    out = tmp / f"{role}_{index}.json"
    launched = time.time()
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "lm.py"),
            "--own-process",
            role,
            str(out),
            "--sizes",
            json.dumps(asdict(sizes)),
        ],
        check=True,
        cwd=ROOT,
        stdout=sys.stderr,
    )
    return {**json.loads(out.read_text()), "launched_at": launched}
