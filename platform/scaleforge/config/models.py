"""Model specs: the ``model`` section of a config, chosen by its ``name`` field (no torch here).

Each spec holds an architecture's fields and the rules among them; the ``nn.Module`` it describes
lives in ``scaleforge.models`` and is built by ``scaleforge.models.build_model``. ``ModelSpec`` is
the tagged union of every spec, so an unknown name fails validation with the names that exist.
Each spec class also states what its family can do (``capabilities``, and ``experts`` of an
instance), which every layer asks instead of comparing names; the family's torch half (builder,
plan, losses, exports) is registered in :mod:`scaleforge.models.families`.
"""

from typing import Annotated, Callable, ClassVar, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, TypeAdapter, model_validator

from scaleforge.config.capabilities import CLASSIFIER, QUANT_SCHEMES, SPLITS, Capabilities, either

_ANY_SCHEME = frozenset(QUANT_SCHEMES)


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    capabilities: ClassVar[Capabilities] = CLASSIFIER
    """What the family can do (:class:`~scaleforge.config.capabilities.Capabilities`)."""

    @property
    def experts(self) -> Optional["MoESpec"]:
        """The Mixture-of-Experts layers this model has (what ``parallel.ep`` splits), if any."""
        return None


class MLPSpec(_Spec):
    """Architecture of a :class:`~scaleforge.models.mlp.MLP`."""

    name: Literal["mlp"] = "mlp"
    capabilities = Capabilities(quant_schemes=_ANY_SCHEME)
    hidden: list[int] = Field(default=[256, 256], min_length=1)
    """Width of each hidden layer, input to output."""
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    """Dropout probability after each hidden activation."""


class CNN1dSpec(_Spec):
    """Architecture of a :class:`~scaleforge.models.cnn1d.CNN1d`."""

    name: Literal["cnn1d"] = "cnn1d"
    capabilities = Capabilities(quant_schemes=_ANY_SCHEME)
    channels: list[PositiveInt] = Field(default=[32, 64, 64], min_length=1)
    """Output channels of each Conv1d -> BatchNorm -> ReLU block."""
    kernel_size: int = Field(default=5, ge=1)
    """Convolution kernel width (odd sizes keep the sequence length)."""
    pool: bool = False
    """Halve the sequence with MaxPool1d(2) after every block but the first."""
    batch_norm: bool = True
    """BatchNorm after each convolution (off for parameter servers, which share parameters only)."""
    hidden: PositiveInt = 128
    """Width of the fully connected layer after the convolutions."""
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    """Dropout probability before the classifier."""


class CNN1dEarlyExitSpec(CNN1dSpec):
    """Architecture of a :class:`~scaleforge.models.early_exit.EarlyExitCNN1d`: a ``cnn1d`` with a
    side exit after its first ``exit_after`` blocks, both exits trained together (BranchyNet)."""

    name: Literal["cnn1d_early_exit"] = "cnn1d_early_exit"
    capabilities = Capabilities(
        splits=frozenset({"dp"}), compress_steps=frozenset({"quantize", "export"}), exits=2
    )
    exit_after: PositiveInt = 1
    """Conv blocks before the side exit (fewer than ``len(channels)``)."""
    exit_hidden: PositiveInt = 64
    """Width of the side exit's hidden layer."""

    @model_validator(mode="after")
    def _exit_inside(self) -> "CNN1dEarlyExitSpec":
        if self.exit_after >= len(self.channels):
            raise ValueError(
                f"model.exit_after ({self.exit_after}) must be below the number of conv blocks "
                f"(len(model.channels) = {len(self.channels)})"
            )
        return self


class MoESpec(_Spec):
    """Architecture of a :class:`~scaleforge.models.moe.MoEClassifier`."""

    name: Literal["moe"] = "moe"
    capabilities = Capabilities(splits=frozenset({"dp", "ep"}))
    stem_channels: list[PositiveInt] = Field(default=[32, 32], min_length=1)
    """Conv1d -> BN -> ReLU blocks (MaxPool after each but the first) before the experts."""
    d_model: PositiveInt = 64
    """Width of the representation that the gate routes and the experts transform."""
    num_experts: PositiveInt = 8
    """Expert MLPs per MoE block."""
    expert_hidden: PositiveInt = 64
    """Hidden width of each expert."""
    num_blocks: PositiveInt = 1
    """Residual MoE blocks."""
    top_k: PositiveInt = 2
    """Experts per input (1: Switch-style)."""
    gate: Literal["topk", "noisy_topk", "gumbel"] = "topk"
    """Softmax top-k, noisy top-k (Shazeer et al. 2017) or Gumbel-softmax straight-through."""
    gumbel_temperature: float = Field(default=1.0, gt=0.0)
    """Temperature of the Gumbel-softmax gate."""
    capacity_factor: float = 1.25
    """Training capacity per expert = capacity_factor * tokens * k / num_experts; overflow is dropped."""
    aux_loss_weight: float = Field(default=0.01, ge=0.0)
    """alpha of the load-balancing loss (Switch Transformer: 0.01)."""
    z_loss_weight: float = Field(default=0.0, ge=0.0)
    """Weight of the router z-loss (0 disables it)."""

    @model_validator(mode="after")
    def _consistent(self) -> "MoESpec":
        if self.top_k > self.num_experts:
            raise ValueError(
                f"model.top_k ({self.top_k}) must not exceed model.num_experts ({self.num_experts})"
            )
        if self.capacity_factor <= 0:
            raise ValueError(f"model.capacity_factor must be > 0, got {self.capacity_factor}")
        return self

    @property
    def experts(self) -> Optional["MoESpec"]:
        return self


class MoEGateSpec(MoESpec):
    """Architecture of a :class:`~scaleforge.models.moe_parts.MoEGate`: the gate of an ``moe`` model
    (its routing fields too)."""

    name: Literal["moe_gate"] = "moe_gate"
    capabilities = Capabilities(splits=frozenset({"dp"}))

    @property
    def experts(self) -> Optional[MoESpec]:
        return None  # the gate alone: its router has no experts behind it


class _TransformerLayers(_Spec):
    """The layer stack that the classifier and the language model share."""

    d_model: PositiveInt = 64
    """Token embedding width."""
    num_heads: PositiveInt = 4
    """Attention heads per layer; must divide d_model."""
    num_layers: PositiveInt = 2
    """Transformer layers."""
    ff_dim: PositiveInt = 128
    """Hidden width of each layer's feed-forward block."""
    dropout: float = Field(default=0.1, ge=0.0, lt=1.0)
    """Dropout inside the layers."""
    moe: Optional[MoESpec] = None
    """If set, every layer's feed-forward block is this Mixture of Experts, routed per token
    (its ``d_model`` is taken from this spec)."""

    @model_validator(mode="after")
    def _heads_divide_width(self):
        if self.d_model % self.num_heads:
            raise ValueError(
                f"model.d_model ({self.d_model}) must be divisible by model.num_heads ({self.num_heads})"
            )
        return self

    @property
    def experts(self) -> Optional[MoESpec]:
        return self.moe


class TransformerSpec(_TransformerLayers):
    """Architecture of a :class:`~scaleforge.models.transformer.TransformerClassifier` (pre-norm encoder
    layers, ReLU feed-forward)."""

    name: Literal["transformer"] = "transformer"
    capabilities = Capabilities(splits=frozenset(SPLITS), recomputes=True)
    patch_size: PositiveInt = 4
    """Consecutive sequence values embedded together as one token."""


class TransformerLMSpec(_TransformerLayers):
    """Architecture of a :class:`~scaleforge.models.transformer_lm.TransformerLM`: a decoder-only
    language model (GPT-2's shape: pre-norm, causal attention, GELU feed-forward, tied embeddings).

    Its vocabulary is the tokenizer's and its sequence length the data's (``data.seq_len``), which
    must not exceed ``context``.
    """

    name: Literal["transformer_lm"] = "transformer_lm"
    capabilities = Capabilities(
        task="language_model",
        splits=frozenset(SPLITS),
        compress_steps=frozenset({"distill", "quantize", "export"}),  # pruning fine-tunes a classifier
        recomputes=True,
    )
    context: PositiveInt = 256
    """Longest sequence the model attends over (rows of its learned position table)."""
    tie_embeddings: bool = True
    """The output projection is the token embedding, transposed (Press & Wolf 2017)."""


_SPECS = (MLPSpec, CNN1dSpec, TransformerSpec, MoESpec, MoEGateSpec, TransformerLMSpec, CNN1dEarlyExitSpec)
ModelSpec = Annotated[Union[_SPECS], Field(discriminator="name")]
"""Any registered model's spec, told apart by ``name``."""
MODEL_NAMES = tuple(spec.model_fields["name"].default for spec in _SPECS)
"""The registered model names, in the order a config error lists them."""
MODEL_SPEC: TypeAdapter = TypeAdapter(ModelSpec)
"""Validates a plain dict (a manifest's ``model``, a Ray task's argument) into its spec."""


def capabilities_of(name: str) -> Capabilities:
    """The capabilities of the family ``name`` (a manifest's ``model.name``)."""
    if name not in _BY_NAME:
        raise ValueError(f"unknown model {name!r}; registered models: {', '.join(MODEL_NAMES)}")
    return _BY_NAME[name].capabilities


def family_names(having: Callable[[Capabilities], bool]) -> list[str]:
    """The registered families whose capabilities satisfy ``having``, in registry order (for messages)."""
    return [name for name in MODEL_NAMES if having(_BY_NAME[name].capabilities)]


_BY_NAME = dict(zip(MODEL_NAMES, _SPECS))


def check_task(data, model) -> None:
    """A language model trains on text, and text trains a language model (any job's ``data`` and
    ``model``), as their capabilities tell."""
    text, language_model = data.kind == "text", model.capabilities.language_model
    if text != language_model:
        raise ValueError(
            f"model.name={model.name} (a language model) trains on data.kind=text"
            if language_model
            else f"data.kind=text trains a language model "
            f"(model.name={either(family_names(lambda c: c.language_model))}), not {model.name}"
        )
    if text and data.seq_len > model.context:
        raise ValueError(f"data.seq_len ({data.seq_len}) is above model.context ({model.context})")
