"""Schema of the main job on text (``kind: lm`` in ``configs/pipeline_lm.yaml``): train the language
model, compress it, calibrate the draft length, serve it as text over HTTP, query it streaming, report.

The stages are those of the classifier's main job less the parameter server and the MoE model; each
runs its own job's config file, as there.
"""

from pathlib import PurePosixPath
from typing import Literal, Optional

from pydantic import Field, NonNegativeInt, PositiveInt, field_validator, model_validator

from scaleforge.config.pipeline import PipelineJobConfig, StageSpec
from scaleforge.config.schema import _Section
from scaleforge.config.serve import NAME_PATTERN

LM_STAGES = ("teacher", "compress", "calibrate", "serve", "query", "report")
"""The stages of ``kind: lm``, in the order they run (a subset of the classifier's ``STAGES``)."""


class GeneratorServeSpec(StageSpec):
    """What the serve stage serves: ``config``'s first app (its generators, ingress and limits) with each
    model entry named in ``models`` pointed at this run's artifact. Model entries not named there, and
    the generators over them, are not served; the calibrate stage's draft length goes into its generator.
    """

    config: str = "configs/serve_lm.yaml"
    models: dict[str, str] = Field(
        default_factory=lambda: {
            "teacher": "teacher",
            "student": "compress/steps/00-distill",
            "teacher-int8": "compress/sweeps/int8-int8_dynamic",
            "student-int8": "compress",
        },
        min_length=1,
    )
    """Served model name -> this run's artifact: ``teacher`` (the trained model), ``compress`` (the
    compression recipe's slim model) or ``compress/<folder>`` (a folder of the compression output: each
    recipe step's model under ``steps/``, each sweep's under ``sweeps/``)."""

    @field_validator("models")
    @classmethod
    def _known_sources(cls, models: dict[str, str]) -> dict[str, str]:
        for name, source in models.items():
            stage, _, folder = source.partition("/")
            parts = PurePosixPath(folder).parts
            if stage not in ("teacher", "compress") or (stage == "teacher" and folder):
                raise ValueError(f"{name}: {source!r} is not teacher, compress or compress/<folder>")
            if ".." in parts or folder.startswith("/"):
                raise ValueError(f"{name}: {source!r} must name a folder inside the compression output")
        return models


class TextQuerySpec(_Section):
    """Held-out prompts (from the validation files) sent to each served generator over HTTP, streaming."""

    prompts: PositiveInt = 16
    """Prompts per load; each load sends every prompt once (at least one per client)."""
    prompt_bytes: PositiveInt = 32
    max_tokens: PositiveInt = 96
    """New tokens per request, greedy."""
    clients: list[PositiveInt] = Field(default_factory=lambda: [1, 16], min_length=1)
    """Concurrent streaming clients of each load; time to first token is read at the first."""
    generators: Optional[list[str]] = None
    """Generators to query (default: every generator served), each ``^[a-z0-9-]+$``."""
    samples: NonNegativeInt = 3
    """Completions of the calibrated generator shown in the report."""

    @field_validator("generators")
    @classmethod
    def _names(cls, names: Optional[list[str]]) -> Optional[list[str]]:
        import re

        bad = [n for n in names or [] if not re.fullmatch(NAME_PATTERN, n)]
        if bad:
            raise ValueError(f"not a served name: {', '.join(map(repr, bad))}")
        return names


class LMPipelineConfig(PipelineJobConfig):
    """``python -m jobs.pipeline`` with ``kind: lm``: train the language model (data parallel), compress
    it (a distilled drafter, int8), calibrate the draft length, serve it over OpenAI's completions API,
    query it with held-out prompts, streaming, and report."""

    kind: Literal["lm"] = "lm"
    teacher: StageSpec = Field(default_factory=lambda: StageSpec(config="configs/train_lm_small.yaml"))
    compress: StageSpec = Field(default_factory=lambda: StageSpec(config="configs/compress_lm.yaml"))
    calibrate: StageSpec = Field(default_factory=lambda: StageSpec(config="configs/calibrate_lm.yaml"))
    """A ``jobs.calibrate`` config with ``generator:``: the stage calibrates that generator's draft length
    over this run's artifacts with its ``draft`` search (its ``serve_config`` and ``output`` are not read)."""
    serve: GeneratorServeSpec = Field(default_factory=GeneratorServeSpec)
    query: TextQuerySpec = Field(default_factory=TextQuerySpec)

    @model_validator(mode="after")
    def _own_stage_fails(self) -> "LMPipelineConfig":
        stage = self.fault.fail_at_stage
        if stage is not None and stage not in LM_STAGES:
            raise ValueError(
                f"fault.fail_at_stage: {stage} is not a stage of kind lm ({', '.join(LM_STAGES)})"
            )
        return self
