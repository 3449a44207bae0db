"""Drafters for speculative decoding: what proposes the next k tokens that the target then checks in one pass.

- :class:`ModelDrafter`: a small language model (the distilled student) with a cache of its own slots,
  decoding k tokens ahead of the target, batched across the running sequences; its distributions go
  to the acceptance rule, so sampling stays exact.
- :class:`LookupDrafter`: prompt lookup (n-gram drafting): the tokens that followed the latest earlier
  occurrence of the sequence's last n tokens, n from ``max_n`` down to 1. No model and no cost: code
  and text that repeat themselves (identifiers, indentation, boilerplate) are proposed for free.

A drafter sees each sequence's *window*, the tokens the target attends over (see
:mod:`scaleforge.generate.engine`), and is told after each check how much of what it fed was kept.
"""

from typing import Optional, Protocol

import torch
from torch import nn

from scaleforge.generate.kv import KVCache, extend
from scaleforge.generate.sampling import Sampling

Draft = tuple[list[int], Optional[torch.Tensor]]
"""k proposed tokens and the ``[k, vocab]`` distributions they were drawn from (None: one-hot)."""


class Drafter(Protocol):
    """Proposes tokens for several sequences at once."""

    name: str

    def propose(
        self, slots: list[int], windows: list[list[int]], ks: list[int], samplings: list[Sampling]
    ) -> list[Draft]:
        """``ks[i]`` tokens to follow ``windows[i]`` (slot ``slots[i]``), drawn with ``samplings[i]``."""
        ...

    def keep(self, slot: int, length: int) -> None:
        """Only the first ``length`` tokens of the slot's window are still right (the rest were rejected)."""
        ...

    def reset(self, slot: int) -> None:
        """The slot holds a new window (a new sequence, or the old one slid): forget what it cached."""
        ...


class LookupDrafter:
    """Prompt lookup: continue the latest earlier match of the window's last ``n`` tokens."""

    name = "lookup"

    def __init__(self, max_n: int = 3):
        self.max_n = max_n

    def propose(self, slots, windows, ks, samplings) -> list[Draft]:
        return [(self.lookup(window, k), None) for window, k in zip(windows, ks)]

    def lookup(self, window: list[int], k: int) -> list[int]:
        """Up to ``k`` tokens (none: no earlier match of even the last token)."""
        for n in range(min(self.max_n, len(window) - 1), 0, -1):
            tail = window[-n:]
            for start in range(len(window) - n - 1, -1, -1):
                if window[start : start + n] == tail:
                    return window[start + n : start + n + k]
        return []

    def keep(self, slot: int, length: int) -> None:
        pass

    def reset(self, slot: int) -> None:
        pass


class ModelDrafter:
    """A small language model that decodes ahead: its own cache, one slot per target slot."""

    name = "model"

    def __init__(self, model: nn.Module, slots: int):
        self.model = model.eval()
        self.cache = KVCache.allocate(self.model, slots)

    def propose(self, slots, windows, ks, samplings) -> list[Draft]:
        drafted: list[list[int]] = [[] for _ in slots]
        probs: list[list[torch.Tensor]] = [[] for _ in slots]
        # First pass: whatever of each window the drafter has not seen yet (usually the target's last token).
        rows = [window[int(self.cache.lengths[slot]) :] for slot, window in zip(slots, windows)]
        active = list(range(len(slots)))
        while active:
            logits = extend(self.model, self.cache, [slots[i] for i in active], [rows[i] for i in active])
            for i, row_logits in zip(active, logits):
                if samplings[i].greedy:  # the check compares tokens only: no distribution needed
                    drafted[i].append(int(row_logits[-1].argmax()))
                else:
                    q = samplings[i].distribution(row_logits[-1])
                    drafted[i].append(samplings[i].draw(q))
                    probs[i].append(q)
                rows[i] = drafted[i][-1:]
            # The k-th token is drafted but never fed: the target checks it.
            active = [i for i in active if len(drafted[i]) < ks[i]]
        return [(d, torch.stack(p) if p else None) for d, p in zip(drafted, probs)]

    def keep(self, slot: int, length: int) -> None:
        self.cache.lengths[slot] = min(int(self.cache.lengths[slot]), length)

    def reset(self, slot: int) -> None:
        self.cache.lengths[slot] = 0
