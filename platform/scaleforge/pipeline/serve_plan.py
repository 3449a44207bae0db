"""The serve plan of one pipeline run: the Serve app's args, built from the stage records.

What is served comes from ``serve`` in ``configs/pipeline.yaml`` (served names, the cascade, the MoE
router); each served model's artifact from the stage that made it; the thresholds from the calibrate
record; the deployment settings by name from ``serve.config``. The serve stage places the result and
writes it as the run's one serve config.
"""

from scaleforge.config.pipeline import ServeStageSpec
from scaleforge.config.serve import ServeArgs
from scaleforge.pipeline.records import Records
from scaleforge.routers import CascadeEntry, MoEEntry, RouterEntry


def served_artifact(spec: ServeStageSpec, records: Records, name: str) -> str:
    """The artifact of this run that the served model ``name`` (a key of ``spec.models``) serves."""
    return getattr(records, spec.models[name]).artifact


def serve_args(template: ServeArgs, spec: ServeStageSpec, records: Records) -> ServeArgs:
    """``template`` (``serve.config``'s app args) serving this run's artifacts: its entries of the served
    models pointed at them, the calibrated cascade, and the MoE router over this run's gate and experts.
    Its other entries (models and routers that the pipeline config does not name) are not served.

    Raises:
        ValueError: ``serve.config`` has no model entry for a served name, or no MoE router ``spec.moe.name``.
    """
    parts = records.moe.parts
    experts = [f"{spec.moe.expert_prefix}{i}" for i in range(len(parts.experts))]
    artifacts = {name: served_artifact(spec, records, name) for name in spec.models}
    artifacts |= {spec.moe.gate: parts.gate, **dict(zip(experts, parts.experts))}
    missing = sorted(set(artifacts) - {m.name for m in template.models})
    if missing:
        raise ValueError(
            f"{spec.config}: no model entries named {missing} to serve this run's artifacts under"
        )
    router = next((r for r in template.routers_of(MoEEntry) if r.name == spec.moe.name), None)
    if router is None:
        raise ValueError(f"{spec.config}: no moe router named {spec.moe.name!r} (serve.moe.name)")
    calibrated = records.calibrate
    thresholds = [{"threshold": t} for t in calibrated.thresholds] + [{}]  # the last stage always answers
    cascade = CascadeEntry.model_validate(
        {
            "kind": "cascade",
            "name": calibrated.cascade,
            "measure": calibrated.measure,
            "stages": [{"model": m, **t} for m, t in zip(calibrated.stages, thresholds)],
        }
    )
    moe = router.model_copy(update={"gate": spec.moe.gate, "experts": experts, "combine": parts.combine})
    return serving(template, artifacts, [cascade, moe])


def serving(template: ServeArgs, artifacts: dict[str, str], routers: list[RouterEntry]) -> ServeArgs:
    """``template`` serving only the models named in ``artifacts`` (each pointed at its artifact), and
    ``routers``."""
    models = [
        m.model_copy(update={"artifact": artifacts[m.name]}) for m in template.models if m.name in artifacts
    ]
    return template.model_copy(update={"models": models, "routers": routers})
