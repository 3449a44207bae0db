"""The Grafana dashboard (serving/grafana_dashboard.json): the committed file is what
``python -m serving.dashboard`` renders, its queries are PromQL, and every row is scraped by a served
app's test (``DASHBOARD_ROWS``: the metric names against a live ``/metrics``)."""

import json
import re
from pathlib import Path

from serving_env import DASHBOARD_ROWS, dashboard_metrics

from serving.dashboard import COMMITTED, main, render

METRICS_SOURCE = Path(__file__).parents[2] / "serving" / "metrics.py"


def test_the_committed_dashboard_is_the_rendered_one(tmp_path):
    assert COMMITTED.read_text() == render(), (
        "run: python -m serving.dashboard --out serving/grafana_dashboard.json"
    )
    assert main(["--out", str(tmp_path / "d.json")]) == 0
    dashboard = json.loads((tmp_path / "d.json").read_text())
    assert dashboard["title"] == "scaleforge serving" and dashboard["uid"] == "scaleforgeServing"
    assert {v["name"] for v in dashboard["templating"]["list"]} >= {"datasource", "Application", "Cluster"}
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in panels}) == len(panels) >= 10
    assert all(p["targets"] and p["datasource"] == "${datasource}" for p in panels)


def test_every_row_is_scraped_and_every_platform_metric_has_a_panel():
    rows = {p["title"] for p in json.loads(COMMITTED.read_text())["panels"] if p["type"] == "row"}
    assert rows == {row for scraped in DASHBOARD_ROWS.values() for row in scraped}
    queried = dashboard_metrics()
    assert {n for n in queried if not n.startswith("ray_scaleforge_")} == {
        "ray_serve_http_request_latency_ms_bucket"
    }
    declared = set(re.findall(r'"(scaleforge_[a-z_]+)"', METRICS_SOURCE.read_text()))
    assert len(declared) == 12
    # counters export as <name>_total, histograms as <name>_bucket, gauges as they are
    assert {re.sub(r"_(total|bucket)$", "", n.removeprefix("ray_")) for n in queried} >= declared
