"""Choosing tokens: greedy, temperature and nucleus (top-p) sampling, and the speculative rule that
accepts a drafter's tokens so that the output is distributed exactly as the target model's alone.

The rule is Leviathan et al. 2023 (Algorithm 1; Chen et al. 2023 the same): a drafted token ``x``
drawn from the drafter's ``q`` is kept with probability ``min(1, p(x) / q(x))`` under the target's
``p``; at the first rejection the token is drawn from ``max(0, p - q)`` renormalised, and when every
draft is kept one more token comes from the target's next distribution. Under greedy decoding ``p``
and ``q`` are one-hot, so a draft is kept exactly when it is the target's argmax: the output is the
target's own greedy output. A drafter that proposes without a distribution (n-gram lookup) has a
one-hot ``q``, for which the same rule holds.
"""

from dataclasses import dataclass, field
from typing import Optional

import torch


@dataclass
class Sampling:
    """How one request picks its tokens; ``temperature`` 0 is greedy. ``seed`` makes it repeatable."""

    temperature: float = 1.0
    top_p: float = 1.0
    seed: Optional[int] = None
    generator: torch.Generator = field(init=False, repr=False)

    def __post_init__(self):
        self.generator = torch.Generator()
        if self.seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(self.seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def distribution(self, logits: torch.Tensor) -> torch.Tensor:
        """What the request samples from, ``[..., vocab]`` logits to probabilities (one-hot if greedy)."""
        if self.greedy:
            return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(logits.dtype)
        probs = torch.softmax(logits.float() / self.temperature, dim=-1)
        if self.top_p < 1.0:
            ordered, order = probs.sort(dim=-1, descending=True)
            # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
            outside = ordered.cumsum(-1) - ordered >= self.top_p
            probs = probs.scatter(-1, order, ordered.masked_fill(outside, 0.0))
            probs = probs / probs.sum(-1, keepdim=True)
        return probs

    def draw(self, probs: torch.Tensor) -> int:
        """One token from a ``[vocab]`` distribution."""
        if self.greedy:
            return int(probs.argmax())
        return int(torch.multinomial(probs, 1, generator=self.generator))

    def uniform(self) -> float:
        return float(torch.rand((), generator=self.generator))


def accept(
    sampling: Sampling, drafted: list[int], draft_probs: Optional[torch.Tensor], target_probs: torch.Tensor
) -> list[int]:
    """The tokens a speculative step emits: the kept prefix of ``drafted`` and one token more.

    Args:
        sampling: The request's sampling (its generator draws the coins).
        drafted: The drafter's k proposals.
        draft_probs: ``[k, vocab]``, the distributions they were drawn from (None: one-hot, a lookup).
        target_probs: ``[k + 1, vocab]``, the target's distributions at each proposal and after the last.

    Returns:
        Between 1 and k + 1 tokens.
    """
    emitted = []
    for i, token in enumerate(drafted):
        p = target_probs[i]
        q = draft_probs[i] if draft_probs is not None else _one_hot(token, p)
        if sampling.greedy:
            kept = int(p.argmax()) == token
        else:
            kept = q[token] > 0 and sampling.uniform() < min(1.0, float(p[token] / q[token]))
        if not kept:
            residual = (p - q).clamp(min=0.0)
            total = float(residual.sum())
            emitted.append(sampling.draw(residual / total if total > 0 else p))
            return emitted
        emitted.append(token)
    emitted.append(sampling.draw(target_probs[len(drafted)]))
    return emitted


def accept_greedy(drafted: list[int], choices: list[int]) -> list[int]:
    """:func:`accept` under greedy decoding, from the target's argmax at each proposal and after the last
    (``choices``, one more than ``drafted``): the drafts up to the first the target would not have chosen,
    then the target's choice there. No distribution is built."""
    kept = 0
    while kept < len(drafted) and drafted[kept] == choices[kept]:
        kept += 1
    return drafted[:kept] + [choices[kept]]


def _one_hot(token: int, like: torch.Tensor) -> torch.Tensor:
    q = torch.zeros_like(like)
    q[token] = 1.0
    return q
