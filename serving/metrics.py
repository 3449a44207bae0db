"""Routing metrics through Ray's metrics (exported for Prometheus by every Ray node).

Rates come out in PromQL: escalation rate = ``rate(scaleforge_cascade_escalations_total)`` /
``rate(scaleforge_cascade_inputs_total)`` by stage.
"""

from ray.serve import metrics

_LATENCY_MS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000]


class RoutingMetrics:
    """Counters and histograms of one ingress replica; created inside the replica."""

    def __init__(self):
        self.requests = metrics.Counter(
            "scaleforge_requests", "Infer requests by model and HTTP status.", tag_keys=("model", "status")
        )
        self.stage_inputs = metrics.Counter(
            "scaleforge_cascade_inputs",
            "Inputs that reached each cascade stage.",
            tag_keys=("model", "stage"),
        )
        self.escalations = metrics.Counter(
            "scaleforge_cascade_escalations",
            "Inputs a cascade stage handed on to the next.",
            tag_keys=("model", "stage"),
        )
        self.stage_latency = metrics.Histogram(
            "scaleforge_stage_latency_ms",
            "Latency of one cascade stage call.",
            boundaries=_LATENCY_MS,
            tag_keys=("model", "stage"),
        )
        self.expert_inputs = metrics.Counter(
            "scaleforge_expert_inputs", "Inputs each MoE expert computed.", tag_keys=("model", "expert")
        )
        self.fallbacks = metrics.Counter(
            "scaleforge_expert_fallbacks",
            "Inputs sent to a next-best expert because the preferred one was saturated or down.",
            tag_keys=("model", "expert"),
        )
        self.expert_failures = metrics.Counter(
            "scaleforge_expert_failures",
            "Expert calls that failed or timed out.",
            tag_keys=("model", "expert"),
        )

        self.generated_tokens = metrics.Counter(
            "scaleforge_generated_tokens", "Tokens a generator produced.", tag_keys=("model",)
        )
        self.time_to_first_token = metrics.Histogram(
            "scaleforge_time_to_first_token_ms",
            "From a completion request's arrival to its first new token.",
            boundaries=_LATENCY_MS,
            tag_keys=("model",),
        )
        self.inter_token_latency = metrics.Histogram(
            "scaleforge_inter_token_latency_ms",
            "Time per new token after the first (a run of accepted drafts shares its interval).",
            boundaries=_LATENCY_MS,
            tag_keys=("model",),
        )
        self.running_sequences = metrics.Gauge(
            "scaleforge_running_sequences",
            "Sequences a generator decodes in this replica.",
            tag_keys=("model",),
        )
        self.waiting_sequences = metrics.Gauge(
            "scaleforge_waiting_sequences", "Requests waiting for a generator's slot.", tag_keys=("model",)
        )

    @staticmethod
    def add(counter: metrics.Counter, amount: int, **tags: str) -> None:
        """Count ``amount`` (Ray counters refuse increments of zero)."""
        if amount > 0:
            counter.inc(amount, tags=tags)
