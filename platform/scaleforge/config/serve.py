"""Schema of the serving config (``configs/serve.yaml``).

``configs/serve.yaml`` is in Ray Serve's own config-file format (``serve run`` / ``serve deploy``
read it unchanged); :class:`ServeConfig` types it, and :class:`ServeArgs` types the ``args`` that
Ray passes to the app builder ``serving.app:build_app``.
"""

import math
from typing import Literal, Optional, TypeVar

from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt, model_validator

from scaleforge.config.deployment import DeploymentSpec
from scaleforge.config.schema import _Section
from scaleforge.routers import NAME_PATTERN, RouterEntries, RouterEntry

Entry = TypeVar("Entry", bound=RouterEntry)


class ModelEntry(DeploymentSpec):
    """A model artifact served with dynamic batching, as its own deployment or inside the ingress."""

    name: str = Field(pattern=NAME_PATTERN)
    """Model name in the URL: ``/v2/models/{name}``."""
    artifact: str
    """Artifact folder (``manifest.json`` + ``model.safetensors``), or its URI (read through the node's
    cache)."""
    max_batch_size: PositiveInt = 8
    """Requests that ``@serve.batch`` merges into one forward pass (at most ``max_ongoing_requests``:
    a replica never holds more requests than that at once)."""
    batch_wait_timeout_s: NonNegativeFloat = 0.002
    """How long a partial batch waits for more requests."""
    threads: PositiveInt = 1
    """torch intra-op threads per replica."""
    in_ingress: bool = False
    """Run the model inside the ingress replica instead of a deployment of its own: no hop between
    them, and it scales with the ingress (its ``replicas``, ``autoscaling`` and ``num_cpus`` apply only
    where the main job's placement moves it out, to a kind of node on a mixed cluster). On CPU: a
    cascade's stages (``configs/serve.yaml`` runs both in each ingress replica); not for MoE gates or
    experts. Its forward pass runs on the replica's event loop, as a plain server's would."""

    @property
    def cpus_asked(self) -> float:
        return 0.0 if self.in_ingress else super().cpus_asked

    @property
    def deployment_name(self) -> str:
        """The Serve deployment that runs this model (none when it runs ``in_ingress``)."""
        return f"model-{self.name}"

    @model_validator(mode="after")
    def _batch_fits(self) -> "ModelEntry":
        if self.max_batch_size > self.max_ongoing_requests:
            raise ValueError(
                f"model {self.name!r}: max_batch_size ({self.max_batch_size}) exceeds max_ongoing_requests "
                f"({self.max_ongoing_requests}); a replica never holds that many requests, raise "
                "max_ongoing_requests or lower max_batch_size"
            )
        return self


class AuthSpec(_Section):
    """Bearer-token auth on the model routes (health routes stay open for probes)."""

    token_env: Optional[str] = None
    """Environment variable (in the replica's environment) holding the token."""
    token_file: Optional[str] = None
    """File holding the token."""

    @model_validator(mode="after")
    def _one_source(self) -> "AuthSpec":
        if self.token_env and self.token_file:
            raise ValueError("auth: give token_env or token_file, not both")
        return self

    @property
    def enabled(self) -> bool:
        return bool(self.token_env or self.token_file)


class LimitsSpec(_Section):
    """Request validation limits (a request beyond them gets a 4xx naming the limit)."""

    max_batch_size: PositiveInt = 1024
    """Inputs per request."""
    max_body_bytes: PositiveInt = 4 * 1024 * 1024
    """Request body size (HTTP 413 above it)."""


class ServeArgs(_Section):
    """Args of ``serving.app:build_app``: what one V2 endpoint serves."""

    models: list[ModelEntry] = Field(min_length=1)
    routers: list[RouterEntries] = Field(default_factory=list)
    """Served names that answer by calling the models: each entry's ``kind`` says which router (one of
    the kinds registered in ``scaleforge.routers``)."""
    ingress: DeploymentSpec = Field(default_factory=lambda: DeploymentSpec(max_ongoing_requests=64))
    auth: AuthSpec = Field(default_factory=AuthSpec)
    limits: LimitsSpec = Field(default_factory=LimitsSpec)

    @model_validator(mode="after")
    def _references(self) -> "ServeArgs":
        names = [m.name for m in self.models] + [r.name for r in self.routers]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"names must be unique across models and routers: {', '.join(duplicates)}")
        served = {m.name: m for m in self.models}
        for router in self.routers:
            missing = [name for name in router.models() if name not in served]
            if missing:
                raise ValueError(
                    f"{router.describe()} names models that are not served: {', '.join(missing)} "
                    f"(served: {', '.join(sorted(served))})"
                )
            router.check_models(served)
        for model in self.models:
            if model.in_ingress and model.num_gpus:
                raise ValueError(
                    f"model {model.name!r}: in_ingress runs it in the ingress replica on CPU; it cannot "
                    f"also reserve num_gpus ({model.num_gpus:g})"
                )
        return self

    def model(self, name: str) -> ModelEntry:
        return next(m for m in self.models if m.name == name)

    def router(self, name: str) -> Optional[RouterEntry]:
        """The router served as ``name`` (None: ``name`` is a model, or nothing)."""
        return next((r for r in self.routers if r.name == name), None)

    def routers_of(self, kind: type[Entry]) -> list[Entry]:
        """The routers of one kind (its entry class), in config order."""
        return [r for r in self.routers if isinstance(r, kind)]

    @property
    def cpus_asked(self) -> float:
        """Logical CPUs the app's deployments (every model and the ingress) reserve at start."""
        return sum(m.cpus_asked for m in self.models) + self.ingress.cpus_asked


class HttpOptions(_Section):
    host: str = "127.0.0.1"
    """Bind address; 127.0.0.1 keeps the endpoint local unless you choose otherwise."""
    port: int = Field(default=8000, ge=0, le=65535)
    request_timeout_s: Optional[PositiveFloat] = None


KSERVE_V2_SERVICER = "serving.grpc_v2.add_servicer_to_server"
"""KServe V2's ``inference.GRPCInferenceService`` (as compiled in ``tritonclient``, Triton's superset)."""


class GrpcOptions(_Section):
    port: int = Field(default=9000, ge=1, le=65535)
    """Port of Serve's gRPC proxy. Ray 2.60 binds it on every interface ([::]), not only 127.0.0.1: turn
    gRPC on where the node's firewall keeps the port private, or with ``auth`` set."""
    grpc_servicer_functions: list[str] = Field(default_factory=lambda: [KSERVE_V2_SERVICER], min_length=1)
    """Import paths of the ``add_*Servicer_to_server`` functions Serve serves; the ingress answers
    KServe V2's."""


class ServeApplication(_Section):
    name: str = Field(pattern=NAME_PATTERN)
    route_prefix: str = "/"
    import_path: Literal["serving.app:build_app"] = "serving.app:build_app"
    args: ServeArgs
    runtime_env: dict = Field(default_factory=dict)


class ServeConfig(_Section):
    """``configs/serve.yaml``: Ray Serve's config file, with typed app args."""

    proxy_location: Literal["EveryNode", "HeadOnly", "Disabled"] = "EveryNode"
    http_options: HttpOptions = Field(default_factory=HttpOptions)
    grpc_options: Optional[GrpcOptions] = None
    """Set to serve the Open Inference Protocol over gRPC as well (off by default: see ``port``)."""
    applications: list[ServeApplication] = Field(min_length=1)


def finite_or_inf(value: float) -> float:
    """Thresholds as YAML writes them: finite values rounded, infinity kept (``.inf``)."""
    return value if math.isinf(value) else round(float(value), 6)
