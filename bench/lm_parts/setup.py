"""What the parts of bench/lm.py share: the config, the sizes of the runs, the layouts and where the
tables go."""

import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "train_lm_small.yaml"
OUT = sys.stdout
"""The tables and bars; the jobs' own progress goes to stderr (``make bench`` keeps stdout)."""


@dataclass(frozen=True)
class Sizes:
    """Optimiser steps of each throughput run and how many of them are start-up rather than steady
    state (the same window on both sides), and the same for each layout's run; rounds of the
    throughput comparison; runs a side of the quality comparison; ``cut``: overrides that slice the
    bytes (``--quick``); ``other_ray_ok``: wait only for this bench's own Ray processes to go before a
    plain peer runs, not for every Ray on the machine (``--other-ray-ok``, smoke runs on a shared
    machine); ``config``: see below.

    DDP's tokens/s is flat after 50 steps, Ray Train's after its first ~100 (its progress lines, every
    100 steps, on 1-6 MB slices of the corpus): both sides are timed over steps 300 to 1,000, the window
    the later of the two to settle needs."""

    steps: int = 1000
    warmup: int = 300
    layout_steps: int = 60
    layout_warmup: int = 10
    repeats: int = 3
    quality_runs: int = 3
    cut: tuple[str, ...] = ()
    other_ray_ok: bool = False
    config: str = CONFIG.name
    """The config under ``configs/`` that the quality and layouts parts train (``bench/lm_speedrun.py``
    gives its own); the throughput part's is always :data:`CONFIG`."""

    @property
    def config_path(self) -> Path:
        return ROOT / "configs" / self.config


QUICK = Sizes(40, 10, 12, 4, 1, 3, ("data.max_train_bytes=400000", "data.max_validation_bytes=100000"))
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


def mib(values, decimals: int = 0) -> str:
    return "/".join(f"{v:.{decimals}f}" for v in values)
