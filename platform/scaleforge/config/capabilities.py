"""What a model family can do, told by its torch-free spec: the questions every layer asks of a model.

Config validation, compression pre-flight and the trainer ask a spec's :class:`Capabilities`
("is it a language model? can it split by tensor parallelism? does it take int8_static?") rather
than compare its name, so a new family states its answers once, on its spec
(:mod:`scaleforge.config.models`), and every check follows.
"""

from dataclasses import dataclass
from typing import Literal, Optional

SPLITS = ("dp", "fsdp", "tp", "pp", "ep")
"""The parallel degrees of ``parallel`` (``dp`` is always possible)."""
COMPRESS_STEPS = ("distill", "prune", "low_rank", "quantize", "export")
"""The built-in compression steps, in the order a message lists them (a registered step of
``scaleforge.compress.steps`` that is not here is listed after them)."""
QUANT_SCHEMES = ("int8_static", "int8_dynamic", "fp16", "bf16")


@dataclass(frozen=True)
class Capabilities:
    """A model family's answers, checked before anything is built."""

    task: Literal["classify", "language_model"] = "classify"
    """``classify``: ``[batch, input_dim]`` arrays to class logits; ``language_model``: token ids
    to next-token logits at every position (trains on ``data.kind: text``)."""
    splits: frozenset[str] = frozenset({"dp", "fsdp"})
    """Parallel degrees the family splits over (its parallel plan supplies how)."""
    compress_steps: Optional[frozenset[str]] = None
    """Compression steps its recipe may take (None: every registered step, so a new step file
    applies to the families that do not list theirs)."""
    quant_schemes: frozenset[str] = frozenset({"int8_dynamic", "fp16", "bf16"})
    """Quantization schemes it accepts (``int8_static`` needs fusable Conv/Linear blocks)."""
    exits: int = 1
    """Exits (heads) the network answers from; more than one: servable as a cascade of its own exits."""
    recomputes: bool = False
    """Its layers can recompute their activations in backward (``parallel.activation_checkpointing``)."""

    def __post_init__(self):
        for field, given, known in (
            ("splits", self.splits, SPLITS),
            ("quant_schemes", self.quant_schemes, QUANT_SCHEMES),
        ):
            if unknown := set(given) - set(known):
                raise ValueError(f"Capabilities.{field}: unknown {sorted(unknown)}; known: {known}")

    @property
    def language_model(self) -> bool:
        return self.task == "language_model"

    def refuses(self, step: str, scheme: Optional[str] = None) -> bool:
        """Whether compression ``step`` (a ``quantize`` with ``scheme``) does not apply to the family."""
        listed = self.compress_steps is None or step in self.compress_steps
        return not listed or (scheme is not None and scheme not in self.quant_schemes)

    def recipe(self) -> str:
        """The steps it accepts, for a message (``distill, quantize (int8_dynamic, fp16, bf16) and
        export``)."""
        steps = [
            f"quantize ({', '.join(s for s in QUANT_SCHEMES if s in self.quant_schemes)})"
            if step == "quantize"
            else step
            for step in sorted(
                self.compress_steps or COMPRESS_STEPS,
                key=lambda name: (
                    COMPRESS_STEPS.index(name) if name in COMPRESS_STEPS else len(COMPRESS_STEPS)
                ),
            )
        ]
        return either(steps, "and")


def either(names: list[str], word: str = "or") -> str:
    """``a``, ``a or b``, ``a, b or c``: a list of names in a message."""
    return f"{', '.join(names[:-1])} {word} {names[-1]}" if len(names) > 1 else "".join(names)


CLASSIFIER = Capabilities()
"""A dense classifier: data parallel and FSDP, every compression step (int8_static aside)."""
