"""Continuous batching (iteration-level scheduling: Orca, Yu et al. OSDI 2022): every iteration, the
sequences that arrived take free slots and the ones that finished or were abandoned leave, so a short
request never waits for a long one.

One iteration runs every running sequence one step: a token each, or with speculative decoding a
drafter's proposals checked by the target in the same pass (:mod:`scaleforge.generate.sampling`).
New sequences' prompts run in a pass of their own, so a long prompt does not pad every decoding row.
Memory is fixed when the engine starts: ``max_running`` slots of the model's context in each cache;
beyond them requests wait, and beyond ``max_waiting`` waiting they are refused (:class:`EngineFull`).

Past the context, a sequence's *window* slides: when it would hold ``context + 1`` tokens, it keeps the
last half and the slot is refilled from them (positions are learned, so a cache cannot be shifted).
The slide happens at the same lengths with and without speculation (a check never runs past the
context), so speculative greedy decoding gives the target's own tokens at every length.
"""

import asyncio
from dataclasses import dataclass, field
from typing import AsyncIterator, Optional

from torch import nn

from scaleforge.generate.drafters import Drafter
from scaleforge.generate.kv import KVCache, context_of
from scaleforge.generate.sampling import Sampling
from scaleforge.generate.step import Row, run_iteration


class EngineFull(Exception):
    """Every slot is taken and the waiting line is full: retry later."""


class EngineFailed(RuntimeError):
    """An iteration raised: every sequence it held ends with this error (none is left waiting forever),
    and the next request starts afresh."""


@dataclass
class Sequence:
    """One request's generation: its tokens so far, where its window starts, and what it still may add."""

    prompt: list[int]
    max_tokens: int
    sampling: Sampling
    draft_tokens: int
    tokens: list[int] = field(default_factory=list)
    offset: int = 0
    slot: Optional[int] = None
    generated: int = 0
    finish_reason: Optional[str] = None
    runs: asyncio.Queue = field(default_factory=asyncio.Queue)

    def __post_init__(self):
        self.tokens = list(self.prompt)


@dataclass
class EngineStats:
    """What the engine has done since it started (``batch_sizes``: rows of each decode iteration)."""

    iterations: int = 0
    tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    batch_sizes: dict[int, int] = field(default_factory=dict)


class Engine:
    """Generates for many requests at once from one target model, optionally with a drafter.

    Args:
        target: The language model whose output is served (eval mode).
        drafter: Proposes tokens for speculative decoding (None: plain decoding only).
        max_running: Sequences decoded together (cache slots).
        max_waiting: Requests that may wait for a slot before new ones are refused.
        draft_max_running: Draft only in iterations that run at most this many sequences (None: always).
            Drafting spends the target's pass on tokens that may be rejected to save passes; once enough
            sequences share each pass, the pass is busy anyway and drafts only add work.
    """

    def __init__(
        self,
        target: nn.Module,
        drafter: Optional[Drafter],
        max_running: int,
        max_waiting: int,
        draft_max_running: Optional[int] = None,
    ):
        self.target, self.drafter, self.draft_max_running = target.eval(), drafter, draft_max_running
        self.context = context_of(target)
        self.cache = KVCache.allocate(self.target, max_running)
        self.max_waiting = max_waiting
        self.free = list(range(max_running))
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.stats = EngineStats()
        self._wake = asyncio.Event()
        self._loop_task: Optional[asyncio.Task] = None

    def submit(
        self, prompt: list[int], max_tokens: int, sampling: Sampling, draft_tokens: int = 0
    ) -> Sequence:
        """Queue a request; its runs of new tokens arrive through :meth:`stream`.

        Raises:
            ValueError: an empty prompt, or one longer than the context.
            EngineFull: ``max_waiting`` requests already wait.
        """
        if not prompt or len(prompt) > self.context:
            raise ValueError(
                f"the prompt is {len(prompt)} tokens; it must be 1 to {self.context} (the context)"
            )
        if draft_tokens and self.drafter is None:
            raise ValueError("speculative decoding asked for, but this generator has no drafter")
        if len(self.waiting) >= self.max_waiting:
            raise EngineFull(f"{len(self.running)} sequences running and {len(self.waiting)} waiting")
        sequence = Sequence(prompt, max_tokens, sampling, draft_tokens)
        self.waiting.append(sequence)
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.get_running_loop().create_task(self._loop())
        self._wake.set()
        return sequence

    async def stream(self, sequence: Sequence) -> AsyncIterator[list[int]]:
        """The sequence's new tokens, a run per iteration, until it finishes; leaving early (a client
        that went away) frees its slot at the next iteration."""
        try:
            while True:
                run = await sequence.runs.get()
                if run is None:
                    return
                if isinstance(run, BaseException):
                    raise EngineFailed(f"generation failed: {run!r}") from run
                yield run
        finally:
            if sequence.finish_reason is None:
                sequence.finish_reason = "cancelled"
                self._wake.set()

    async def _loop(self) -> None:
        try:
            await self._iterations()
        except Exception as err:
            self._fail(err)
            raise

    def _fail(self, err: Exception) -> None:
        """End every sequence with ``err`` and free every slot."""
        for sequence in self.running + self.waiting:
            sequence.finish_reason = "error"
            sequence.runs.put_nowait(err)
        self.free, self.running, self.waiting = list(range(self.cache.slots)), [], []

    async def _iterations(self) -> None:
        while True:
            self._admit()
            if not self.running:
                self._wake.clear()
                await self._wake.wait()
                continue
            rows = [Row(s.slot, s.tokens[s.offset :], s.sampling, s.draft_tokens) for s in self.running]
            # On the event loop, as a plain server's forward pass: a thread of its own measured about 1 ms
            # of hand-over per iteration, as much as a decode step of train_lm_small.yaml's model.
            emitted = self._iterate(rows)
            for sequence, tokens in zip(list(self.running), emitted):
                self._deliver(sequence, tokens)
            self._retire()
            await asyncio.sleep(0)  # requests that arrived meanwhile are read and submitted

    def _iterate(self, rows: list[Row]) -> list[list[int]]:
        self.stats.iterations += 1
        self.stats.batch_sizes[len(rows)] = self.stats.batch_sizes.get(len(rows), 0) + 1
        drafting = self.draft_max_running is None or len(rows) <= self.draft_max_running
        return run_iteration(self.target, self.cache, self.drafter if drafting else None, rows, self.stats)

    def _admit(self) -> None:
        self.waiting = [s for s in self.waiting if s.finish_reason is None]
        while self.free and self.waiting:
            sequence = self.waiting.pop(0)
            sequence.slot = self.free.pop(0)
            self.cache.lengths[sequence.slot] = 0
            if self.drafter is not None:
                self.drafter.reset(sequence.slot)
            self.running.append(sequence)

    def _deliver(self, sequence: Sequence, tokens: list[int]) -> None:
        if sequence.finish_reason is not None:
            return
        tokens = tokens[: sequence.max_tokens - sequence.generated]
        sequence.tokens += tokens
        sequence.generated += len(tokens)
        self.stats.tokens += len(tokens)
        sequence.runs.put_nowait(tokens)
        if sequence.generated >= sequence.max_tokens:
            sequence.finish_reason = "length"
        elif len(sequence.tokens) - sequence.offset > self.context:
            self._slide(sequence)

    def _slide(self, sequence: Sequence) -> None:
        """Keep the window's last half; the slot is refilled from it at the next iteration."""
        sequence.offset = len(sequence.tokens) - self.context // 2
        self.cache.lengths[sequence.slot] = 0
        if self.drafter is not None:
            self.drafter.reset(sequence.slot)

    def _retire(self) -> None:
        for sequence in [s for s in self.running if s.finish_reason is not None]:
            self.running.remove(sequence)
            self.free.append(sequence.slot)
            sequence.runs.put_nowait(None)

    def shutdown(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
