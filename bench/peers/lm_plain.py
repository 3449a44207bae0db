"""The plain-PyTorch peers of ``bench/lm.py``: the same language model on the same bytes, no Ray.

    python bench/peers/lm_plain.py single --config configs/train_lm_small.yaml --seconds 540 --out single.json
    torchrun --standalone --nproc-per-node 2 bench/peers/lm_plain.py ddp --config ... --steps 1000 \
        --warmup 300 --out ddp.json

``single`` trains one process (every core's threads) and scores the validation windows within a
wall-clock budget (start-up and scoring included), its warm-up and cosine decay laid over the
training time that leaves rather than over a step count it cannot know in advance. ``ddp`` is data
parallelism the torchrun way: ``init_process_group`` from torchrun's environment (gloo),
``DistributedDataParallel``, a ``DistributedSampler`` per rank, one thread per process; it times every
step and reports steady-state tokens/s, every step's end and when the last ended. Model, tokens,
batch per rank, AdamW groups and gradient clipping are the config's, as the Ray Train job uses them.
"""

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, TensorDataset

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "platform")]

from scaleforge.config import TrainJobConfig, load_config  # noqa: E402
from scaleforge.models import build_model  # noqa: E402
from scaleforge.quickfit import bits_per_byte  # noqa: E402
from scaleforge.text.dataset import read_text  # noqa: E402
from scaleforge.train.optim import Schedule  # noqa: E402


def setup(config: str, overrides: list[str]):
    """The config's model (seeded), AdamW (no decay on norms and biases), both splits as tensors and the
    validation split's bytes per token (the config's tokenizer: bytes, or a BPE trained on the training
    bytes, the job's own from the same cache)."""
    cfg = load_config(TrainJobConfig, config, overrides)
    splits = read_text(cfg.data)
    torch.manual_seed(cfg.optim.seed)
    model = build_model(cfg.model, cfg.data.seq_len, splits.info.num_classes)
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(
        [
            {"params": [p for p in params if p.dim() >= 2]},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ],
        lr=cfg.optim.lr,
        weight_decay=cfg.optim.weight_decay,
    )
    tensors = {
        name: TensorDataset(torch.from_numpy(x).long(), torch.from_numpy(y).long())
        for name, (x, y) in (("train", splits.train), ("validation", splits.validation))
    }
    return cfg, model, optimizer, tensors, splits.info.bytes_per_token


def step(model, optimizer, x, y, clip: float) -> float:
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    optimizer.step()
    return loss.item()


SCORING_ROWS = 256
"""Validation windows per forward pass when ``single`` scores."""


def single(args) -> dict:
    """Score the validation split ``args.seconds`` after ``STARTED``, having trained until then: the
    scoring's own time is set aside first, estimated from a timed slice of the windows (the
    Ray job's wall-clock, which ``--seconds`` is given, ends with its workers' evaluation too). Without
    ``--seconds``: the config's epochs, step for step as the job takes them (``--set
    optim.batch_size=`` the job's global batch), on the job's own schedule over its steps."""
    torch.set_num_threads(args.threads)
    cfg, model, optimizer, data, bytes_per_token = setup(args.config, args.set)
    validation = [t.numpy() for t in data["validation"].tensors]
    if args.seconds is None:
        trained = _epochs(cfg, model, optimizer, data)
        return _scored(model, validation, bytes_per_token, cfg, *trained, args.threads)
    sliced = max(1, len(validation[0]) // 16)
    timed = time.perf_counter()
    with torch.no_grad():
        bits_per_byte(model, *(v[:sliced] for v in validation), bytes_per_token, SCORING_ROWS)
    scoring = (time.perf_counter() - timed) * len(validation[0]) / sliced
    began = time.perf_counter()
    budget = args.seconds - (began - STARTED) - scoring
    if budget <= 0:
        raise SystemExit(
            f"--seconds {args.seconds:.0f}: start-up and scoring alone take {args.seconds - budget:.0f} s"
        )
    warmup = cfg.optim.warmup_epochs / cfg.optim.epochs * budget  # the job's share of its training
    peak, clip = cfg.optim.lr, cfg.optim.clip_grad_norm
    steps, tokens, epoch = 0, 0, 0
    model.train()
    while time.perf_counter() - began < budget:
        for x, y in _shuffled(cfg, data, epoch):
            elapsed = time.perf_counter() - began
            if elapsed >= budget:
                break
            lr = (
                peak * elapsed / warmup
                if elapsed < warmup
                else 0.5 * peak * (1 + math.cos(math.pi * (elapsed - warmup) / (budget - warmup)))
            )
            for group in optimizer.param_groups:
                group["lr"] = lr
            step(model, optimizer, x, y, clip)
            steps, tokens = steps + 1, tokens + y.numel()
        epoch += 1
    result = _scored(model, validation, bytes_per_token, cfg, steps, tokens, began, args.threads)
    return {**result, "scoring_s_estimated": scoring}


def _shuffled(cfg, data, epoch: int) -> DataLoader:
    """One pass over the training windows in batches of ``optim.batch_size``, shuffled by its seed."""
    generator = torch.Generator().manual_seed(cfg.optim.seed + epoch)
    sampler = RandomSampler(data["train"], generator=generator)
    return DataLoader(data["train"], batch_size=cfg.optim.batch_size, drop_last=True, sampler=sampler)


def _epochs(cfg, model, optimizer, data) -> tuple[int, int, float]:
    """``cfg.optim.epochs`` passes, the lr of each step from the job's own ``Schedule`` (warm-up and
    cosine decay over the run's steps); the steps, tokens and when training began."""
    batches = len(data["train"]) // cfg.optim.batch_size
    schedule, steps, tokens, began = Schedule(cfg.optim, batches, 1), 0, 0, time.perf_counter()
    model.train()
    for epoch in range(cfg.optim.epochs):
        for x, y in _shuffled(cfg, data, epoch):
            for group in optimizer.param_groups:
                group["lr"] = schedule(steps)
            step(model, optimizer, x, y, cfg.optim.clip_grad_norm)
            steps, tokens = steps + 1, tokens + y.numel()
    return steps, tokens, began


def _scored(model, validation, bytes_per_token, cfg, steps: int, tokens: int, began: float, threads) -> dict:
    trained_s = time.perf_counter() - began
    with torch.no_grad():  # scored as the compression job scores a language model
        bits = bits_per_byte(model, *validation, bytes_per_token, SCORING_ROWS)
    return {
        "bits_per_byte": bits,
        "steps": steps,
        "batch_size": cfg.optim.batch_size,
        "tokens": tokens,
        "train_s": trained_s,
        "tokens_per_s": tokens / trained_s,
        "threads": threads,
        "total_s": time.perf_counter() - STARTED,
    }


def ddp(args) -> dict:
    """``args.steps`` DDP steps on torchrun's ranks; tokens/s over the steps after ``args.warmup``."""
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    cfg, model, optimizer, data, _ = setup(args.config, args.set)
    model = DistributedDataParallel(model)
    sampler = DistributedSampler(
        data["train"], num_replicas=world, rank=rank, shuffle=True, seed=cfg.optim.seed
    )
    loader = DataLoader(data["train"], batch_size=cfg.optim.batch_size, sampler=sampler, drop_last=True)
    if len(loader) < args.steps:
        raise SystemExit(f"{len(loader)} batches per rank, fewer than --steps {args.steps}")
    model.train()
    times, timed_tokens, warm_at = [], 0, None
    for index, (x, y) in enumerate(loader):
        if index == args.steps:
            break
        if index == args.warmup:
            warm_at = time.time()
        for group in optimizer.param_groups:
            group["lr"] = cfg.optim.lr
        step(model, optimizer, x, y, cfg.optim.clip_grad_norm)
        times.append(time.perf_counter())
        if index >= args.warmup:
            timed_tokens += y.numel() * world
    finished_at = time.time()
    dist.barrier()
    result = {
        "tokens_per_s": timed_tokens / (times[-1] - times[args.warmup - 1]),
        "steps": args.steps,
        "warmup": args.warmup,
        "world": world,
        "tokens_per_step": y.numel() * world,
        "step_ends_s": [round(t - STARTED, 5) for t in times],
        "finished_at": finished_at,
        "startup_s": times[args.warmup - 1] - STARTED,
        "warm_at": warm_at,
        "rss_mib": peak_rss_mib(),
    }
    rss = [None] * world
    dist.all_gather_object(rss, result["rss_mib"])
    result["rss_mib_per_rank"] = rss
    dist.destroy_process_group()
    return result if rank == 0 else {}


def peak_rss_mib() -> float:
    """This process's peak resident memory (VmHWM), MiB."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM")) / 1024


STARTED = time.perf_counter()
"""After the imports: ``single``'s budget counts from here, as the Ray job's wall-clock counts from its
``ensure_ray`` call in an interpreter that has imported the same libraries."""

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["single", "ddp"])
    parser.add_argument("--config", required=True)
    parser.add_argument("--set", action="append", default=[], help="config override KEY=VALUE")
    parser.add_argument(
        "--seconds",
        type=float,
        help="single: wall-clock budget to the scored result, start-up included (none: the config's epochs)",
    )
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    result = single(args) if args.mode == "single" else ddp(args)
    if result:
        Path(args.out).write_text(json.dumps(result, indent=1))
