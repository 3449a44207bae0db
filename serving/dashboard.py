"""The platform's Grafana dashboard: requests, latency, cascades, experts and generators.

``python -m serving.dashboard [--out FILE]`` writes it as Grafana JSON. It is rendered by Ray's own
dashboard factory from Ray's Serve dashboard base, so that it imports beside the dashboards Ray writes
to ``/tmp/ray/session_latest/metrics/grafana`` with the same ``datasource``, ``Cluster`` and
``Application`` variables, and Ray's ``RAY_GRAFANA_SCALEFORGE_DASHBOARD_UID`` /
``RAY_GRAFANA_SCALEFORGE_DASHBOARD_GLOBAL_FILTERS`` overrides. Its queries read the metrics of
``serving/metrics.py`` (exported by every Ray node as ``ray_scaleforge_*``) and Serve's own latency.
The committed copy, ``serving/grafana_dashboard.json``, is checked against this module and every
metric name it queries against a served app's ``/metrics`` (``tests/serving/test_dashboard.py``).
"""

import argparse
import json
import sys
from pathlib import Path

from ray.dashboard.modules.metrics.dashboards.common import DashboardConfig, Panel, Row, Target

COMMITTED = Path(__file__).with_name("grafana_dashboard.json")
_APP = 'application=~"$Application",{global_filters}'


def _rate(metric: str, by: str, where: str = "") -> str:
    return f"sum(rate({metric}{{{{{where}{_APP}}}}}[5m])) by ({by})"


def _gauge(metric: str, by: str) -> str:
    return f"sum({metric}{{{{{_APP}}}}}) by ({by})"


def _quantiles(metric: str, by: str, legend: str, where: str = "") -> list[Target]:
    return [
        Target(
            expr=f"histogram_quantile({q}, {_rate(f'{metric}_bucket', f'{by}, le', where)})",
            legend=f"p{round(q * 100)} {legend}",
        )
        for q in (0.5, 0.9, 0.99)
    ]


def _panel(id: int, title: str, description: str, unit: str, *targets: Target, stack: bool = False) -> Panel:
    return Panel(id=id, title=title, description=description, unit=unit, targets=list(targets), stack=stack)


ROWS = [
    Row(
        title="Requests",
        id=100,
        panels=[
            _panel(
                1,
                "Requests by model and status",
                "Answers of the V2 and OpenAI endpoints per second, refusals included (400, 401, 503...).",
                "qps",
                Target(_rate("ray_scaleforge_requests_total", "model, status"), "{{model}} {{status}}"),
                stack=True,
            ),
            _panel(
                2,
                "HTTP latency percentiles",
                "Serve's proxy latency of the app's HTTP requests, arrival to last byte.",
                "ms",
                *_quantiles(
                    "ray_serve_http_request_latency_ms", "application", "{{application}}", 'route!~"/-/.*",'
                ),
            ),
        ],
    ),
    Row(
        title="Cascades",
        id=101,
        panels=[
            _panel(
                3,
                "Share of inputs reaching each stage",
                "Inputs that reached a stage over the inputs of stage 0: the cheap stage answers the rest.",
                "percentunit",
                Target(
                    _rate("ray_scaleforge_cascade_inputs_total", "model, stage")
                    + " / on (model) group_left "
                    + _rate("ray_scaleforge_cascade_inputs_total", "model", 'stage="0",'),
                    "{{model}} stage {{stage}}",
                ),
            ),
            _panel(
                4,
                "Escalation rate by stage",
                "Inputs a stage handed on to the next over the inputs it saw (its threshold at work).",
                "percentunit",
                Target(
                    _rate("ray_scaleforge_cascade_escalations_total", "model, stage")
                    + " / "
                    + _rate("ray_scaleforge_cascade_inputs_total", "model, stage"),
                    "{{model}} stage {{stage}}",
                ),
            ),
            _panel(
                5,
                "Stage latency percentiles",
                "One cascade stage's call, as the router waited for it.",
                "ms",
                *_quantiles("ray_scaleforge_stage_latency_ms", "model, stage", "{{model}} stage {{stage}}"),
            ),
        ],
    ),
    Row(
        title="Mixture of experts",
        id=102,
        panels=[
            _panel(
                6,
                "Expert load",
                "Inputs each expert computed per second: a skewed gate shows as one tall band.",
                "inputs/s",
                Target(
                    _rate("ray_scaleforge_expert_inputs_total", "model, expert"),
                    "{{model}} expert {{expert}}",
                ),
                stack=True,
            ),
            _panel(
                7,
                "Fallbacks and expert failures",
                "Inputs sent to a next-best expert (its preferred one saturated or down), and expert calls "
                "that failed or timed out.",
                "ops",
                Target(
                    _rate("ray_scaleforge_expert_fallbacks_total", "model, expert"), "fallback {{expert}}"
                ),
                Target(_rate("ray_scaleforge_expert_failures_total", "model, expert"), "failure {{expert}}"),
            ),
        ],
    ),
    Row(
        title="Language models",
        id=103,
        panels=[
            _panel(
                8,
                "Generated tokens/s",
                "New tokens per second of each generator, every replica together.",
                "tokens/s",
                Target(_rate("ray_scaleforge_generated_tokens_total", "model"), "{{model}}"),
                stack=True,
            ),
            _panel(
                9,
                "Time to first token",
                "From a completion request's arrival to its first new token.",
                "ms",
                *_quantiles("ray_scaleforge_time_to_first_token_ms", "model", "{{model}}"),
            ),
            _panel(
                10,
                "Inter-token latency",
                "Time per new token after the first.",
                "ms",
                *_quantiles("ray_scaleforge_inter_token_latency_ms", "model", "{{model}}"),
            ),
            _panel(
                11,
                "Running and waiting sequences",
                "Sequences decoded together (continuous batching) and requests queued for a slot.",
                "sequences",
                Target(_gauge("ray_scaleforge_running_sequences", "model"), "running {{model}}"),
                Target(_gauge("ray_scaleforge_waiting_sequences", "model"), "waiting {{model}}"),
            ),
        ],
    ),
]

CONFIG = DashboardConfig(
    name="SCALEFORGE",
    default_uid="scaleforgeServing",
    rows=ROWS,
    standard_global_filters=['ray_io_cluster=~"$Cluster"'],
    base_json_file_name="serve_grafana_dashboard_base.json",
)


def render() -> str:
    """The dashboard as Grafana JSON (Ray's factory fills in panels, grid and filters)."""
    from ray.dashboard.modules.metrics import grafana_dashboard_factory as factory

    # Ray's generate_*_dashboard functions each render one of Ray's configs; the renderer they share
    # takes any DashboardConfig (DeveloperAPI), so ours comes out in Ray's own form.
    dashboard = json.loads(factory._generate_grafana_dashboard(CONFIG)[0])
    dashboard["title"] = "scaleforge serving"
    dashboard["tags"] = ["scaleforge", *dashboard["tags"]]
    return json.dumps(dashboard, indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m serving.dashboard", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, help="write the JSON here (default: standard output)")
    args = parser.parse_args(argv)
    text = render()
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
