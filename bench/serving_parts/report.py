"""The tables and bars of bench/serving.py, from every round's measurements.

A ratio is taken within each round (ours and the plain server measured minutes apart, with nothing of
the other running) and printed as the median over rounds with its range; a bar holds only when the
worst round meets it."""

import math

import numpy as np
from bars import print_bars

from serving_parts.common import BATCH

MEDIAN_KEYS = (
    "clients",
    "throughput",
    "p50",
    "p99",
    "accuracy",
    "failures",
    "proxy_ms",
    "ingress_ms",
    "model_ms",
    "cpu_server_ms",
    "cpu_rest_ms",
    "cpu_client_ms",
)


def report(results: dict[str, list[dict]], args) -> int:
    med = {
        name: {k: float(np.median([r[k] for r in rs])) for k in MEDIAN_KEYS} for name, rs in results.items()
    }
    print(f"\nrequests of {BATCH} inputs, {args.seconds:g} s x {args.rounds} rounds (medians)")
    print(
        f"{'configuration':24s} {'clients':>7s} {'inputs/s':>9s} {'p50 ms':>8s} {'p99 ms':>8s} "
        f"{'accuracy':>9s} {'failed':>7s}"
    )
    for name, m in med.items():
        print(
            f"{name:24s} {int(m['clients']):7d} {m['throughput']:9,.0f} {m['p50']:8.1f} {m['p99']:8.1f} "
            f"{m['accuracy']:9.4f} {int(m['failures']):7d}"
        )
    print()
    _print_hops(med)
    _print_cpu(med)

    def ratio(key: str, ours: str, theirs: str, bar: float, at_least: bool) -> tuple:
        """(what, measured, bar, met): the per-round ratios' median and range, met if the worst meets."""
        per_round = [a[key] / b[key] for a, b in zip(results[ours], results[theirs])]
        worst = min(per_round) if at_least else max(per_round)
        unit = "inputs/s" if key == "throughput" else "ms p50"
        shown = (
            f"{np.median(per_round):.2f}x [{min(per_round):.2f}-{max(per_round):.2f}] "
            f"({med[ours][key]:,.1f} / {med[theirs][key]:,.1f} {unit})"
        )
        met = worst >= bar if at_least else worst <= bar
        if not met and (np.median(per_round) >= bar if at_least else np.median(per_round) <= bar):
            shown += ", bar inside the range"  # not held: some round missed it
        return shown, f"{'>=' if at_least else '<='} {bar}x", met

    c = args.concurrency
    cascade, teacher = med["cascade, direct"]["accuracy"], med["plain teacher"]["accuracy"]
    failed = sum(int(r["failures"]) for rs in results.values() for r in rs)
    rows = [
        (
            f"cascade, direct / plain cascade, c={c}",
            *ratio("throughput", "cascade, direct", "plain cascade", 0.9, True),
        ),
        (
            f"cascade via proxy / plain cascade, c={c}",
            *ratio("throughput", "cascade via proxy", "plain cascade", 0.5, True),
        ),
        (
            f"algorithm's gain: cascade, direct / plain teacher, c={c}",
            *ratio("throughput", "cascade, direct", "plain teacher", 2.0, True),
        ),
        (
            "stage 0, direct / plain stage 0, p50 c=1",
            *ratio("p50", "stage 0, direct", "plain stage 0", 1.5, False),
        ),
        (
            "accuracy, cascade vs teacher (held out)",
            f"{cascade:.4f} vs {teacher:.4f} ({cascade - teacher:+.4f})",
            ">= teacher - 0.005",
            cascade >= teacher - 0.005,
        ),
        ("failed requests, every run", str(failed), "0", failed == 0),
    ]
    # The bars before this comparison (issue 18's): printed with this run's figures, not held. They put
    # the cascade against the teacher served plainly or by Serve, not against the same cascade.
    old = [
        (
            f"cascade, direct / plain teacher, binary tensors, c={c}",
            *ratio("throughput", "cascade, direct, binary", "plain teacher, binary", 2.0, True),
        ),
        (
            "stage 0, direct / plain stage 0, p50 c=1",
            *ratio("p50", "stage 0, direct", "plain stage 0", 2.0, False),
        ),
        (
            f"cascade via proxy / teacher via proxy, c={c}",
            *ratio("throughput", "cascade via proxy", "teacher via proxy", 1.5, True),
        ),
        (
            "stage 0 via proxy / bare stage-0 Serve, p50 c=1",
            *ratio("p50", "stage 0 via proxy", "bare stage-0 Serve", 1.3, False),
        ),
    ]
    print(
        "old bars, no longer held (this run's figures; the cascade against the teacher, not the same cascade)"
    )
    for name, measured, bar, met in old:
        print(f"  {name:52s} {measured:44s} {bar:8s} {'yes' if met else 'no'}")
    shown = ratio("p50", "stage 0 via proxy", "plain stage 0", 0, False)[0]
    print(f"  stage 0 via proxy / plain stage 0, p50 c=1: {shown}, no bar")
    if "cascade via Serve's Python proxy" in med:  # the default path's bar, on the path it was set on
        python = ratio("throughput", "cascade via Serve's Python proxy", "plain cascade", 0.5, True)[0]
        print(f"  cascade via Serve's Python proxy (HAProxy's fallback) / plain cascade: {python}, no bar")
    print()
    return print_bars(rows, f"comparison, median [range] of {args.rounds} round(s)")


def _print_hops(med: dict[str, dict]) -> None:
    """Where a request's time goes on Serve, from the ingress's Server-Timing header (medians per
    request): the first hop (the HTTP server, the network and the proxy if any) is what the client
    waited beyond the ingress's handler."""
    print(
        "time per hop, 1 client (ms): HTTP server + network (+ proxy), ingress (parse, route, render), "
        "model (its call)"
    )
    for name, m in med.items():
        if m["clients"] == 1 and not math.isnan(m["ingress_ms"]):
            print(
                f"  {name:24s} {m['proxy_ms']:6.2f} {m['ingress_ms']:6.2f} {m['model_ms']:6.2f}   "
                f"of p50 {m['p50']:.2f}"
            )
    print()


def _print_cpu(med: dict[str, dict]) -> None:
    """The CPU each request took at several clients (:mod:`serving_parts.cpu`): what separates the
    served cascade from the plain one on the same cores."""
    print(
        "CPU per request, several clients (ms; medians): the serving processes (Serve's replicas or "
        "uvicorn's workers), the rest of the machine (Ray's other processes, the kernel), the load generator"
    )
    for name, m in med.items():
        if m["clients"] > 1:
            print(
                f"  {name:40s} {m['cpu_server_ms']:6.2f} {m['cpu_rest_ms']:6.2f} {m['cpu_client_ms']:6.2f}   "
                f"{m['throughput'] / BATCH:6.0f} requests/s"
            )
    print()
