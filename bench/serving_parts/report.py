"""The tables and bars of bench/serving.py, from every run's measurements."""

import math

import numpy as np
from bars import print_bars

from serving_parts.common import BATCH


def report(results: dict[str, list[dict]], args) -> int:
    med = {name: {k: float(np.median([r[k] for r in rs])) for k in rs[0]} for name, rs in results.items()}
    print(f"\nrequests of {BATCH} inputs, {args.seconds:g} s x {args.rounds} rounds (medians)")
    print(
        f"{'configuration':30s} {'clients':>7s} {'inputs/s':>9s} {'p50 ms':>8s} {'p99 ms':>8s} "
        f"{'accuracy':>9s} {'failed':>7s}"
    )
    for name, m in med.items():
        print(
            f"{name:30s} {int(m['clients']):7d} {m['throughput']:9,.0f} {m['p50']:8.1f} {m['p99']:8.1f} "
            f"{m['accuracy']:9.4f} {int(m['failures']):7d}"
        )
    print()

    def ratio(key: str, ours: str, theirs: str, bar: float, at_least: bool) -> tuple:
        a, b = med[ours][key], med[theirs][key]
        shown = f"{a:,.0f} / {b:,.0f} inputs/s" if key == "throughput" else f"{a:.1f} / {b:.1f} ms"
        met = a / b >= bar if at_least else a / b <= bar
        return f"{a / b:.2f}x ({shown})", f"{'>=' if at_least else '<='} {bar}x", met

    cascade, teacher = med["cascade, direct"]["accuracy"], med["teacher-only Serve"]["accuracy"]
    failed = sum(int(r["failures"]) for rs in results.values() for r in rs)
    c = args.concurrency
    rows = [
        (
            f"cascade, direct / uvicorn teacher, c={c}",
            *ratio("throughput", "cascade, direct", "uvicorn teacher", 2.0, True),
        ),
        (
            f"cascade, direct / uvicorn teacher, binary tensors, c={c}",
            *ratio("throughput", "cascade, direct, binary", "uvicorn, binary tensors", 2.0, True),
        ),
        (
            "stage 0, direct / uvicorn stage 0, p50 c=1",
            *ratio("p50", "stage 0, direct", "uvicorn stage 0", 2.0, False),
        ),
        (
            f"cascade via proxy / teacher-only Serve, c={c}",
            *ratio("throughput", "cascade via proxy", "teacher-only Serve", 1.5, True),
        ),
        (
            "stage 0 via proxy / bare stage-0 Serve, p50 c=1",
            *ratio("p50", "stage 0 via proxy", "bare stage-0 Serve", 1.3, False),
        ),
        (
            "accuracy, cascade vs teacher (held out)",
            f"{cascade:.4f} vs {teacher:.4f} ({cascade - teacher:+.4f})",
            ">= teacher - 0.005",
            cascade >= teacher - 0.005,
        ),
        ("failed requests, every run", str(failed), "0", failed == 0),
    ]
    # Reported without a bar: what the proxy's hop and the split into deployments cost.
    for ours in ("cascade via proxy", "cascade, 2 deployments, direct", "early exit, direct"):
        shown = ratio("throughput", ours, "uvicorn teacher", 0, True)[0]
        print(f"{ours} / uvicorn teacher, c={c}: {shown}, no bar")
    shown = ratio("throughput", "early exit, direct", "cascade, direct", 0, True)[0]
    print(
        f"early exit, direct / cascade, direct, c={c}: {shown}, accuracy "
        f"{med['early exit, direct']['accuracy']:.4f} against {cascade:.4f}, no bar"
    )
    shown = ratio("p50", "stage 0 via proxy", "uvicorn stage 0", 0, False)[0]
    print(f"stage 0 via proxy / uvicorn stage 0, p50 c=1: {shown}, no bar\n")
    # Where a request's time goes on Serve, from the ingress's Server-Timing header (medians per request):
    # the first hop (the HTTP server, the network and the proxy if any) is what the client waited
    # beyond the ingress's handler.
    print(
        "time per hop, 1 client (ms): HTTP server + network (+ proxy), ingress (parse, route, render), "
        "model (its call)"
    )
    for name, m in med.items():
        if m["clients"] == 1 and not math.isnan(m["ingress_ms"]):
            print(
                f"  {name:30s} {m['proxy_ms']:6.2f} {m['ingress_ms']:6.2f} {m['model_ms']:6.2f}   "
                f"of p50 {m['p50']:.2f}"
            )
    print()
    return print_bars(rows, "comparison")
