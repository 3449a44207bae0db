"""The serving contract: what a served name is, read from the config and the artifacts' manifests.

Deployment (:mod:`scaleforge.deployment.deploy`, checking an app before Ray starts) and the Serve
app (``serving/``, validating requests and answering metadata) both read the served names from
here; neither asks the other.
"""

from dataclasses import dataclass

from scaleforge.artifacts.servable import manifest_shapes
from scaleforge.artifacts.store import read_manifest
from scaleforge.config.routers import TensorSpec
from scaleforge.config.serve import ServeArgs


@dataclass(frozen=True)
class ModelInfo:
    """What the ingress knows about a served name before calling anything."""

    kind: str
    """``model``, or the router's kind."""
    input_dim: int
    num_classes: int
    trace: tuple[TensorSpec, ...] = ()
    """Outputs added when a request sets ``parameters.trace`` (the router's)."""

    @property
    def outputs(self) -> list[TensorSpec]:
        """Every output a request may ask for: the class, the probabilities, then the trace."""
        return [
            TensorSpec("class", "INT64", (-1,)),
            TensorSpec("probabilities", "FP32", (-1, self.num_classes)),
            *self.trace,
        ]


def model_infos(args: ServeArgs) -> dict[str, ModelInfo]:
    """Shapes of every served name, read from the artifacts' manifests (no weights loaded).

    Raises:
        scaleforge.artifacts.ArtifactError: a model's artifact is missing or malformed.
        ValueError: models that one router combines disagree on shapes, or a router refuses a
            model's artifact (its family, from the manifest).
    """
    manifests = {m.name: read_manifest(m.artifact) for m in args.models}
    shapes = {name: manifest_shapes(manifest) for name, manifest in manifests.items()}
    infos = {name: ModelInfo("model", *shape) for name, shape in shapes.items()}
    for router in args.routers:
        router.check_manifests({name: manifests[name] for name in router.models()})
        infos[router.name] = ModelInfo(router.kind, *router.served_shapes(shapes), trace=router.trace)
    return infos
