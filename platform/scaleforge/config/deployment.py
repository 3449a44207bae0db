"""How one Serve deployment runs: replicas or autoscaling, resources, admission limits."""

from typing import Optional

from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt, model_validator

from scaleforge.config.schema import _Section


class AutoscalingSpec(_Section):
    """Ray Serve ``autoscaling_config`` (replicas follow ongoing requests)."""

    min_replicas: int = Field(default=1, ge=0)
    max_replicas: PositiveInt = 2
    target_ongoing_requests: PositiveFloat = 2.0
    """Ongoing requests per replica that the autoscaler aims for."""
    upscale_delay_s: NonNegativeFloat = 30.0
    """Load must stay above target this long before replicas are added (Serve's default)."""
    downscale_delay_s: NonNegativeFloat = 600.0
    """Load must stay below target this long before replicas are removed (Serve's default)."""
    look_back_period_s: PositiveFloat = 30.0
    """Window over which ongoing requests are averaged."""
    metrics_interval_s: PositiveFloat = 10.0
    """How often replicas report their ongoing requests (below ``look_back_period_s``)."""

    @model_validator(mode="after")
    def _ordered(self) -> "AutoscalingSpec":
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"autoscaling.min_replicas ({self.min_replicas}) exceeds max_replicas ({self.max_replicas})"
            )
        return self


class DeploymentSpec(_Section):
    """How one deployment runs: replicas, resources and its admission limits."""

    replicas: PositiveInt = 1
    """Fixed replica count (ignored when ``autoscaling`` is set)."""
    autoscaling: Optional[AutoscalingSpec] = None
    num_cpus: NonNegativeFloat = 1.0
    """Logical CPUs each replica reserves (Ray's default is 1)."""
    num_gpus: NonNegativeFloat = 0.0
    """GPUs (or a share of one) each replica reserves; the model then runs on CUDA where present."""
    label_selector: Optional[dict[str, str]] = None
    """Ray label selector: the nodes a replica may run on (hardware-aware placement writes it)."""
    max_ongoing_requests: PositiveInt = 8
    """Requests a replica works on at once; more wait in the caller's queue."""
    max_queued_requests: int = Field(default=64, ge=-1)
    """Requests waiting for a replica before new ones are refused (HTTP 503); -1: unbounded."""
    max_replicas_per_node: Optional[PositiveInt] = None
    """At most this many replicas on one node (1: replicas on separate nodes survive a node's loss)."""

    @property
    def cpus_asked(self) -> float:
        """Logical CPUs its replicas reserve at start (``autoscaling.min_replicas`` when it autoscales)."""
        return (self.autoscaling.min_replicas if self.autoscaling else self.replicas) * self.num_cpus

    def options(self) -> dict:
        """Keyword arguments for ``Deployment.options``."""
        scaling = (
            {"autoscaling_config": self.autoscaling.model_dump()}
            if self.autoscaling
            else {"num_replicas": self.replicas}
        )
        spread = {"max_replicas_per_node": self.max_replicas_per_node} if self.max_replicas_per_node else {}
        actor = {
            "num_cpus": self.num_cpus,
            **({"num_gpus": self.num_gpus} if self.num_gpus else {}),
            **({"label_selector": self.label_selector} if self.label_selector else {}),
        }
        return {
            **scaling,
            **spread,
            "ray_actor_options": actor,
            "max_ongoing_requests": self.max_ongoing_requests,
            "max_queued_requests": self.max_queued_requests,
        }
