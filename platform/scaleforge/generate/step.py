"""One iteration of the engine: every running sequence one step, drafts checked in the target's pass."""

from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn

from scaleforge.generate.drafters import Draft, Drafter
from scaleforge.generate.kv import KVCache, context_of, extend
from scaleforge.generate.sampling import Sampling, accept, accept_greedy


@dataclass
class Row:
    """A running sequence as an iteration sees it: its slot, its window, how it samples, how far to draft."""

    slot: int
    window: list[int]
    sampling: Sampling
    draft_tokens: int


def run_iteration(
    target: nn.Module, cache: KVCache, drafter: Optional[Drafter], rows: list[Row], stats: Any
) -> list[list[int]]:
    """The tokens each row emits this iteration (one, or with a drafter up to ``draft_tokens + 1``).

    A check never runs past the context: a row whose window is near it drafts fewer tokens. ``stats``
    (an ``EngineStats``) counts the drafted and accepted tokens.
    """
    drafts = _drafts(target, drafter, rows)
    pending = [row.window[int(cache.lengths[row.slot]) :] for row in rows]
    fed = [tokens + drafted for tokens, (drafted, _) in zip(pending, drafts)]
    logits: list[Optional[torch.Tensor]] = [None] * len(rows)
    # Prompts (and windows refilled after a slide) in a pass of their own: they would pad every decoding row.
    filling = [i for i, tokens in enumerate(pending) if len(tokens) > 1]
    decoding = [i for i, tokens in enumerate(pending) if len(tokens) <= 1]
    for group in (filling, decoding):
        if group:
            out = extend(target, cache, [rows[i].slot for i in group], [fed[i] for i in group])
            for i, row_logits in zip(group, out):
                logits[i] = row_logits
    emitted = []
    for row, (drafted, draft_probs), row_logits in zip(rows, drafts, logits):
        checked = row_logits[-(len(drafted) + 1) :]
        if row.sampling.greedy:
            tokens = accept_greedy(drafted, checked.argmax(-1).tolist())
        else:
            tokens = accept(row.sampling, drafted, draft_probs, row.sampling.distribution(checked))
        kept = len(row.window) + len(tokens) - 1  # the window and the accepted drafts; the last token is new
        cache.lengths[row.slot] = kept
        if drafter is not None:
            drafter.keep(row.slot, kept)
        stats.drafted += len(drafted)
        stats.accepted += len(tokens) - 1
        emitted.append(tokens)
    return emitted


def _drafts(target: nn.Module, drafter: Optional[Drafter], rows: list[Row]) -> list[Draft]:
    """Each row's proposals (none for a row that does not speculate or has no room before the context)."""
    drafts: list[Draft] = [([], None) for _ in rows]
    if drafter is None:
        return drafts
    room = [min(row.draft_tokens, context_of(target) - len(row.window)) for row in rows]
    asked = [i for i, k in enumerate(room) if k > 0]
    if asked:
        proposed = drafter.propose(
            [rows[i].slot for i in asked],
            [rows[i].window for i in asked],
            [room[i] for i in asked],
            [rows[i].sampling for i in asked],
        )
        for i, draft in zip(asked, proposed):
            drafts[i] = draft
    return drafts
