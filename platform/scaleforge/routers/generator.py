"""The generator router: a language model served as text, ``POST /v1/completions`` (OpenAI's API).

Its model (and its drafter, when the drafter is a model) run in the ingress replica: the engine keeps
their key/value caches there and decodes every running request together, a step per iteration
(:class:`scaleforge.generate.engine.Engine`). Decoding is the chapter's cascade per token when
``draft_tokens`` > 0: the drafter (the distilled student, or prompt lookup over the context)
proposes that many tokens and the model checks them in one pass, keeping its own output exactly
(greedy: the same tokens; sampling: the same distribution). A request may ask for its own
``draft_tokens`` (0: the model alone). Over the Open Inference Protocol the name answers the next
token after each row of token ids.
"""

from typing import TYPE_CHECKING, Any, Literal, Optional

import numpy as np
from pydantic import Field, NonNegativeInt, PositiveInt, model_validator

from scaleforge.routers.base import RouterEntry, Shapes

if TYPE_CHECKING:
    from scaleforge.config.serve import ModelEntry
    from scaleforge.serving_contract import ModelInfo

LOOKUP = "lookup"
"""``drafter:`` value for prompt lookup (n-gram drafting) instead of a model."""


class GeneratorRouter:
    """The engine over the entry's model and drafter, with the tokenizer its manifest records."""

    def __init__(self, entry: "GeneratorEntry", models: Any, info: "ModelInfo", metrics: Any):
        from scaleforge.artifacts.store import read_manifest
        from scaleforge.generate.drafters import LookupDrafter, ModelDrafter
        from scaleforge.generate.engine import Engine
        from scaleforge.text.tokenizer import tokenizer_from_json

        self.entry, self.metrics = entry, metrics
        self.network = models.network(entry.model)
        self.tokenizer = tokenizer_from_json(
            read_manifest(models.client(entry.model).entry.artifact)["tokenizer"]
        )
        drafter = None
        if entry.drafter == LOOKUP:
            drafter = LookupDrafter()
        elif entry.drafter is not None:
            drafter = ModelDrafter(models.network(entry.drafter), entry.max_running)
        self.engine = Engine(
            self.network, drafter, entry.max_running, entry.max_waiting, entry.draft_max_running
        )

    async def infer(
        self, x: np.ndarray, parameters: dict[str, Any]
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The next token after each row of token ids (FP32 holding integers below the vocabulary)."""
        import torch

        from scaleforge.serving_contract import ProtocolError

        vocab = self.network.vocab_size
        if not np.all((x >= 0) & (x < vocab) & (x == np.round(x))):
            raise ProtocolError(400, f"inputs must be token ids, whole numbers from 0 to {vocab - 1}")
        with torch.inference_mode():
            probs = self.network(torch.from_numpy(x).long())[:, -1].softmax(-1).numpy()
        return {"class": probs.argmax(axis=1).astype(np.int64), "probabilities": probs}, {}


class GeneratorEntry(RouterEntry):
    """``kind: generator``: text from a language model artifact, optionally decoded speculatively."""

    kind: Literal["generator"] = "generator"
    model: str
    """The language model whose text is served (a model entry with ``in_ingress: true``)."""
    drafter: Optional[str] = None
    """What proposes tokens for speculative decoding: a smaller language model's entry (``in_ingress``,
    the same tokenizer), or ``lookup`` (prompt lookup: n-grams of the context); none: plain decoding."""
    draft_tokens: NonNegativeInt = 0
    """Tokens drafted per check when a request does not say (0: the model alone; ``jobs.calibrate``
    picks it from measured acceptance and costs)."""
    max_draft_tokens: PositiveInt = 16
    """The most a request may ask for."""
    draft_max_running: Optional[PositiveInt] = None
    """Draft only while at most this many sequences run in the replica (none: always); beyond it every
    sequence decodes plainly, its output the same. ``jobs.calibrate`` picks it: the load up to which
    drafting still paid."""
    max_running: PositiveInt = 16
    """Sequences decoded together in each ingress replica: the cache's slots, fixed at start."""
    max_waiting: NonNegativeInt = 64
    """Requests that may wait for a slot in each replica; beyond them a request gets 503 with Retry-After."""
    max_tokens: PositiveInt = 1024
    """The most new tokens a request may ask for."""
    default_max_tokens: PositiveInt = 16
    """New tokens when a request does not say (OpenAI's default)."""
    max_stop: PositiveInt = Field(default=4)
    """Stop strings a request may give (OpenAI's limit)."""

    router = GeneratorRouter

    @model_validator(mode="after")
    def _draft_within_cap(self) -> "GeneratorEntry":
        if self.draft_tokens > self.max_draft_tokens:
            raise ValueError(
                f"generator {self.name!r}: draft_tokens ({self.draft_tokens}) exceeds max_draft_tokens "
                f"({self.max_draft_tokens})"
            )
        if self.draft_tokens and self.drafter is None:
            raise ValueError(
                f"generator {self.name!r}: draft_tokens is {self.draft_tokens} but no drafter is set"
            )
        if self.default_max_tokens > self.max_tokens:
            raise ValueError(
                f"generator {self.name!r}: default_max_tokens exceeds max_tokens ({self.max_tokens})"
            )
        return self

    def models(self) -> list[str]:
        return [self.model] + ([self.drafter] if self.drafter not in (None, LOOKUP) else [])

    def check_models(self, served: dict[str, "ModelEntry"]) -> None:
        outside = [name for name in self.models() if not served[name].in_ingress]
        if outside:
            raise ValueError(
                f"{self.describe()}: model {', '.join(map(repr, outside))} must set in_ingress: true "
                "(the engine keeps its cache in the ingress replica)"
            )

    def check_manifests(self, manifests: dict[str, dict[str, Any]]) -> None:
        from scaleforge.config.models import capabilities_of

        for name, manifest in manifests.items():
            family = manifest["model"]["name"]
            if not capabilities_of(family).language_model or "tokenizer" not in manifest:
                raise ValueError(f"{self.describe()}: model '{name}' is a {family}, not a language model")
        if len(manifests) == 2:
            target, drafter = (manifests[name] for name in self.models())
            if drafter["tokenizer"] != target["tokenizer"]:
                raise ValueError(
                    f"{self.describe()}: drafter '{self.drafter}' has another tokenizer than '{self.model}'"
                )
            short, long = drafter["model"]["context"], target["model"]["context"]
            if short < long:
                raise ValueError(
                    f"{self.describe()}: drafter '{self.drafter}' has a context of {short}, shorter than "
                    f"'{self.model}''s {long}"
                )

    def served_shapes(self, shapes: dict[str, Shapes]) -> Shapes:
        return shapes[self.model]
