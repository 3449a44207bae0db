"""App builder for ``serve run configs/serve.yaml``: one V2 endpoint over models and the routers over them.

Every model is its own deployment (replicas, autoscaling and admission limits from config), except
those marked ``in_ingress``, which run inside the ingress; the ingress holds the routers and a
handle to each model deployment (router kinds: ``scaleforge/routers/``, one file each).
"""

from ray.serve import Application

from scaleforge.config.serve import ServeArgs
from scaleforge.serving_contract import model_infos
from serving.ingress import V2Ingress
from serving.models import ModelServer


def build_app(args: ServeArgs) -> Application:
    """Bind the ingress and one :class:`ModelServer` per model entry (but those run in the ingress).

    Args:
        args: The app's ``args`` from the Serve config (Ray validates them into ``ServeArgs``
            from the annotation; a plain dict is validated here).

    Raises:
        pydantic.ValidationError: malformed args.
        scaleforge.artifacts.ArtifactError: a model's artifact is missing or malformed.
        ValueError: models that one router combines disagree on shapes.
    """
    args = ServeArgs.model_validate(args)
    infos = model_infos(args)
    handles = {
        m.name: ModelServer.options(name=m.deployment_name, **m.options()).bind(m)
        for m in args.models
        if not m.in_ingress
    }
    return V2Ingress.options(name="ingress", **args.ingress.options()).bind(args, handles, infos)
