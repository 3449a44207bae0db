"""How many tokens a generator's drafter proposes per check (``draft_tokens``), from measured speed.

Each candidate k decodes the same held-out prompts greedily through the engine, as the served
generator would (one torch thread, ``clients`` requests at a time), and is timed; the fastest k is
chosen. The acceptance rate (accepted / drafted) and the tokens each check emits are printed beside,
so the choice can be read against Leviathan et al.'s expectation ``(1 - a^(k+1)) / (1 - a)`` tokens per
check at acceptance ``a``: longer drafts pay only while the target's pass over k + 1 tokens costs
little more than over one and the drafter is cheap.
"""

import asyncio
import time
from dataclasses import dataclass
from typing import Optional

import torch

from scaleforge.config.calibrate import DraftSearchSpec


@dataclass(frozen=True)
class DraftPoint:
    draft_tokens: int
    tokens_per_s: float
    acceptance: float
    """Drafted tokens the target kept (0 for k = 0)."""
    tokens_per_check: float
    """Tokens each target pass emitted."""


@dataclass(frozen=True)
class LoadPoint:
    clients: int
    drafted: float
    """Tokens/s with the chosen draft length."""
    plain: float
    """Tokens/s with none."""


@dataclass(frozen=True)
class DraftCalibration:
    points: list[DraftPoint]
    chosen: int
    loads: list[LoadPoint]
    draft_max_running: Optional[int]
    """The most sequences at which drafting still paid (None: at every load measured)."""

    def summary(self) -> str:
        lines = [f"{'draft_tokens':>12} {'tokens/s':>10} {'acceptance':>10} {'tokens/check':>12}"]
        for p in self.points:
            mark = "  <- chosen" if p.draft_tokens == self.chosen else ""
            lines.append(
                f"{p.draft_tokens:>12} {p.tokens_per_s:>10,.0f} {p.acceptance:>10.2f} "
                f"{p.tokens_per_check:>12.2f}{mark}"
            )
        for load in self.loads:
            lines.append(
                f"at {load.clients} clients: {load.drafted:,.0f} tokens/s drafting, {load.plain:,.0f} without"
            )
        if self.loads:
            lines.append(
                f"draft_max_running: {self.draft_max_running or 'none (drafting paid at every load)'}"
            )
        return "\n".join(lines)


def calibrate_drafts(target: str, drafter: str, spec: DraftSearchSpec) -> DraftCalibration:
    """Time each of ``spec.candidates`` on ``target`` (an artifact) drafted by ``drafter`` (an artifact,
    or ``lookup``); the fastest is chosen. Then, at each of ``spec.loads`` clients, the chosen length
    against none: drafting is kept up to the load below the first at which it lost."""
    from scaleforge.artifacts.servable import load_servable
    from scaleforge.generate.drafters import LookupDrafter, ModelDrafter
    from scaleforge.generate.prompts import held_out_prompts
    from scaleforge.routers.generator import LOOKUP

    torch.set_num_threads(1)
    model = load_servable(target).module
    proposer = (
        LookupDrafter()
        if drafter == LOOKUP
        else ModelDrafter(load_servable(drafter).module, max([spec.clients, *spec.loads]))
    )
    prompts = [list(p) for p in held_out_prompts(max([spec.prompts, *spec.loads]), spec.prompt_bytes)]
    _measure(model, proposer, prompts[:1], spec, max(spec.candidates))  # warm-up
    points = [_measure(model, proposer, prompts, spec, k) for k in spec.candidates]
    chosen = max(points, key=lambda p: p.tokens_per_s).draft_tokens
    loads = [
        LoadPoint(
            clients,
            _measure(
                model, proposer, prompts, spec.model_copy(update={"clients": clients}), chosen
            ).tokens_per_s,
            _measure(model, proposer, prompts, spec.model_copy(update={"clients": clients}), 0).tokens_per_s,
        )
        for clients in (spec.loads if chosen else [])
    ]
    paid = [load.clients for load in loads if load.drafted >= load.plain]
    losing = [load.clients for load in loads if load.drafted < load.plain]
    limit = None if not losing else max([spec.clients] + [c for c in paid if c < min(losing)])
    return DraftCalibration(points, chosen, loads, limit)


def _measure(model, proposer, prompts: list[list[int]], spec: DraftSearchSpec, k: int) -> DraftPoint:
    from scaleforge.generate.engine import Engine
    from scaleforge.generate.sampling import Sampling

    prompts = prompts[: max(spec.prompts, spec.clients)]
    engine = Engine(model, proposer if k else None, max_running=spec.clients, max_waiting=len(prompts))

    async def run() -> None:
        gate = asyncio.Semaphore(spec.clients)

        async def one(prompt):
            async with gate:
                sequence = engine.submit(prompt, spec.new_tokens, Sampling(temperature=0.0), k)
                async for _ in engine.stream(sequence):
                    pass

        await asyncio.gather(*(one(p) for p in prompts))

    began = time.perf_counter()
    asyncio.run(run())
    elapsed = time.perf_counter() - began
    engine.shutdown()
    stats = engine.stats
    return DraftPoint(
        k,
        stats.tokens / elapsed,
        stats.accepted / stats.drafted if stats.drafted else 0.0,
        stats.tokens / max(1, sum(size * count for size, count in stats.batch_sizes.items())),
    )
