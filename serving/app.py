"""App builder for ``serve run configs/serve.yaml``: one V2 endpoint over models, cascades and MoE routers.

Every model is its own deployment (replicas, autoscaling and admission limits from config); the
ingress holds the routers and a handle to each model.
"""

from ray.serve import Application

from scaleforge.artifacts.servable import servable_shapes
from scaleforge.config.serve import ServeArgs
from serving.ingress import ModelInfo, V2Ingress
from serving.models import ModelServer


def build_app(args: ServeArgs) -> Application:
    """Bind the ingress and one :class:`ModelServer` per model entry.

    Args:
        args: The app's ``args`` from the Serve config (Ray validates them into ``ServeArgs``
            from the annotation; a plain dict is validated here).

    Raises:
        pydantic.ValidationError: malformed args.
        scaleforge.artifacts.ArtifactError: a model's artifact is missing or malformed.
        ValueError: models that one cascade or MoE router combines disagree on shapes.
    """
    args = ServeArgs.model_validate(args)
    infos = model_infos(args)
    handles = {m.name: ModelServer.options(name=f"model-{m.name}", **m.options()).bind(m) for m in args.models}
    return V2Ingress.options(name="ingress", **args.ingress.options()).bind(args, handles, infos)


def model_infos(args: ServeArgs) -> dict[str, ModelInfo]:
    """Shapes of every served name, read from the artifacts' manifests (no weights loaded)."""
    infos = {m.name: ModelInfo("model", *servable_shapes(m.artifact)) for m in args.models}
    for cascade in args.cascades:
        stages = [infos[s.model] for s in cascade.stages]
        _same_shapes(f"cascade {cascade.name!r}", [s.model for s in cascade.stages], stages)
        infos[cascade.name] = ModelInfo("cascade", stages[0].input_dim, stages[0].num_classes)
    for router in args.moe:
        experts = [infos[e] for e in router.experts]
        _same_shapes(f"moe {router.name!r}", router.experts, experts)
        gate = infos[router.gate]
        if gate.num_classes != len(router.experts) or gate.input_dim != experts[0].input_dim:
            raise ValueError(f"moe {router.name!r}: gate '{router.gate}' maps {gate.input_dim} features to "
                             f"{gate.num_classes} scores; it needs {experts[0].input_dim} features and one score "
                             f"per expert ({len(router.experts)})")
        infos[router.name] = ModelInfo("moe", experts[0].input_dim, experts[0].num_classes)
    return infos


def _same_shapes(owner: str, names: list[str], infos: list[ModelInfo]) -> None:
    first = infos[0]
    for name, info in zip(names, infos):
        if (info.input_dim, info.num_classes) != (first.input_dim, first.num_classes):
            raise ValueError(f"{owner}: model '{name}' maps {info.input_dim} features to {info.num_classes} classes, "
                             f"'{names[0]}' maps {first.input_dim} to {first.num_classes}")
