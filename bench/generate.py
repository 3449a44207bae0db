"""Serving the language model, the same work on both sides: configs/serve_lm.yaml's generator against the
server a user would stand up instead, a plain FastAPI + uvicorn server running the exported model with
Hugging Face ``transformers`` ``generate`` (bench/peers/hf_generate.py), each measured with nothing of
the other running.

    .venv/bin/python bench/generate.py [--artifacts ~/scaleforge/artifacts] [--quick]
    (about 15 minutes on 2 idle cores, plus training the teacher and the student once into
    ~/.cache/scaleforge/generate-bench when no --artifacts folder holds them, about 25 minutes)

Both sides run the teacher of configs/train_lm_small.yaml (ours from its artifact, the peer from its
Hugging Face export) on one torch thread per process, two processes a side (our 2 ingress replicas as
shipped; 2 uvicorn workers), greedy, on the same held-out prompts (32 bytes from the standard
library's validation files) and the same number of new tokens. Ours decodes as shipped: the generator
``lm``, the teacher drafted by prompt lookup, ``draft_tokens`` as configs/serve_lm.yaml holds it
(``jobs.calibrate --config configs/calibrate_lm.yaml`` writes it), every request of every client in one
continuous batch per replica. The peer: ``generate`` with its KV cache, a request at a time per thread;
its assisted generation with the same student beside.

A round measures one side, shuts it down (``ray.shutdown()``), then the other; the side that goes first
alternates. Each ratio is taken within a round and printed as the median over rounds with its range; a
bar is met only when its worst round meets it. Bars at Serve's HTTP port (the URL configs/serve_lm.yaml
documents: on an embedded Ray, HAProxy in front of the ingress replicas); the ingress replicas' own
ports and Serve's Python proxy (HAProxy's fallback, the default path before it) printed beside. Exit
status 1 if a bar is missed.
"""

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "platform"), str(ROOT)]

from bars import print_bars  # noqa: E402
from generate_parts.measure import cache_against_recompute, completions, first_token_ms, generated  # noqa: E402
from generate_parts.setup import QUICK, Sizes, artifacts, hf_exports, ours  # noqa: E402
from generate_parts.sides import our_server, peer_server  # noqa: E402
from provenance import check_and_print  # noqa: E402

from scaleforge.artifacts.servable import load_servable  # noqa: E402
from scaleforge.deployment.deploy import python_proxy_url  # noqa: E402
from scaleforge.generate.prompts import held_out_prompts  # noqa: E402


def measure_ours(paths, prompts, sizes: Sizes) -> dict:
    long, one = completions(prompts, sizes.new_tokens), completions(prompts[:4], sizes.new_tokens)
    alone = completions(prompts[:4], sizes.new_tokens, draft_tokens=0)
    with our_server(paths) as (proxy, direct):
        figures = {
            "many clients": generated([proxy], long, sizes.clients, sizes.requests_per_client)[0],
            "many clients, direct": generated(direct, long, sizes.clients, sizes.requests_per_client)[0],
            "many clients, draft_tokens 0": generated(
                [proxy], completions(prompts, sizes.new_tokens, draft_tokens=0), sizes.clients, 1
            )[0],
        }
        figures["1 client"], figures["text"] = generated([proxy], one, 1, 1)
        figures["1 client, draft_tokens 0"], figures["text alone"] = generated([proxy], alone, 1, 1)
        figures["ttft"] = first_token_ms([proxy], prompts[:4])
        figures["ttft, direct"] = first_token_ms(direct, prompts[:4])
        if python_proxy := python_proxy_url():  # the default path before HAProxy took Serve's port
            figures["many clients, Python proxy"] = generated(
                [python_proxy], long, sizes.clients, sizes.requests_per_client
            )[0]
            figures["ttft, Python proxy"] = first_token_ms([python_proxy], prompts[:4])
        figures["engine"] = httpx.get(f"{proxy}/v1/models/lm", timeout=30).json()
    return figures


def measure_peer(exports, prompts, sizes: Sizes) -> dict:
    long, one = completions(prompts, sizes.new_tokens), completions(prompts[:4], sizes.new_tokens)
    with peer_server(exports) as base:
        figures = {"many clients": generated([base], long, sizes.clients, sizes.requests_per_client)[0]}
        figures["1 client"], figures["text"] = generated([base], one, 1, 1)
        figures["1 client, assisted"] = generated(
            [base], completions(prompts[:4], sizes.new_tokens, assisted=True), 1, 1
        )[0]
        figures["ttft"] = first_token_ms([base], prompts[:4])
        past = httpx.post(
            f"{base}/v1/completions", json={"prompt": prompts[0].decode(), "max_tokens": 256}, timeout=120
        )
        figures["256 tokens"] = f"HTTP {past.status_code}" + (
            f" ({len(past.json()['choices'][0]['text'])} characters)" if past.status_code == 200 else ""
        )
    return figures


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}x [{min(values):.2f}-{max(values):.2f}]"


def bars(rounds: list[tuple[dict, dict]], clients: int) -> list[tuple[str, str, str, bool]]:
    ratio = lambda key, peer_key=None: [o[key] / p[peer_key or key] for o, p in rounds]  # noqa: E731
    throughput, single = ratio("many clients"), ratio("1 client")
    ttft = [o["ttft"] / p["ttft"] for o, p in rounds]
    same = all(o["text"] == o["text alone"] for o, _ in rounds)
    return [
        (
            f"generated tokens/s, {clients} clients, ours / peer",
            spread(throughput),
            ">= 3x",
            min(throughput) >= 3.0,
        ),
        (
            "tokens/s, 1 client, ours as shipped (drafted) / peer greedy",
            spread(single)
            + (", the same text as ours undrafted" if same else ", TEXT DIFFERS from ours undrafted"),
            ">= 1.5x, same text",
            min(single) >= 1.5 and same,
        ),
        ("time to first token p50, 1 client, ours / peer", spread(ttft), "<= 1.5x", max(ttft) <= 1.5),
    ]


def main() -> int:
    check_and_print()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--artifacts",
        type=Path,
        help="a folder holding lm_small and compressed_lm/ (default: trained once into the cache)",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: 4 prompts, 4 clients, 1 round")
    args = parser.parse_args()
    sizes = QUICK if args.quick else Sizes()
    paths = artifacts(args.artifacts.expanduser() if args.artifacts else None)
    prompts = held_out_prompts(sizes.prompts, sizes.prompt_bytes)
    rounds = []
    with tempfile.TemporaryDirectory(prefix="scaleforge-generate-bench-") as folder:
        exports = hf_exports(paths, Path(folder))
        for index in range(sizes.rounds):
            if index % 2 == 0:
                o = measure_ours(paths, prompts, sizes)
                p = measure_peer(exports, prompts, sizes)
            else:
                p = measure_peer(exports, prompts, sizes)
                o = measure_ours(paths, prompts, sizes)
            rounds.append((o, p))
            print(
                f"round {index + 1}: tokens/s at {sizes.clients} clients, ours {o['many clients']:,.0f} / "
                f"peer {p['many clients']:,.0f}",
                file=sys.stderr,
            )
    report(paths, prompts, sizes, rounds)
    return print_bars(bars(rounds, sizes.clients), "target")


def report(paths, prompts, sizes: Sizes, rounds) -> None:
    cfg, lm = ours(paths, 0)
    med = lambda side, key: statistics.median(r[side][key] for r in rounds)  # noqa: E731
    o, p, n = 0, 1, sizes.clients
    print(
        f"teacher {paths['teacher']}, student {paths['student']}; generator 'lm' drafted by {lm.drafter}, "
        f"draft_tokens {lm.draft_tokens}, {cfg.applications[0].args.ingress.replicas} ingress replicas; "
        f"{sizes.prompts} held-out prompts of {sizes.prompt_bytes} bytes, {sizes.new_tokens} new tokens, "
        f"greedy; medians of {len(rounds)} round(s):"
    )
    rows = [
        (f"{n} clients, Serve's HTTP port (HAProxy)", med(o, "many clients"), med(p, "many clients")),
        (f"{n} clients, the replicas' own ports", med(o, "many clients, direct"), None),
        *(
            [(f"{n} clients, Serve's Python proxy", med(o, "many clients, Python proxy"), None)]
            if "many clients, Python proxy" in rounds[0][o]
            else []
        ),
        (f"{n} clients, draft_tokens 0 (no drafter)", med(o, "many clients, draft_tokens 0"), None),
        ("1 client, as shipped / peer greedy", med(o, "1 client"), med(p, "1 client")),
        (
            "1 client, draft_tokens 0 / peer assisted",
            med(o, "1 client, draft_tokens 0"),
            med(p, "1 client, assisted"),
        ),
    ]
    print(f"  {'tokens/s':42s} {'ours':>10s} {'peer':>10s}")
    for name, ours_value, peer_value in rows:
        peer_text = "" if peer_value is None else f"{peer_value:,.0f}"
        print(f"  {name:42s} {ours_value:>10,.0f} {peer_text:>10}")
    python = (
        f", {med(o, 'ttft, Python proxy'):.1f} ms via Serve's Python proxy"
        if "ttft, Python proxy" in rounds[0][o]
        else ""
    )
    print(
        f"  time to first token p50: ours {med(o, 'ttft'):.1f} ms at Serve's HTTP port, "
        f"{med(o, 'ttft, direct'):.1f} ms direct{python}; peer {med(p, 'ttft'):.1f} ms"
    )
    engine = rounds[-1][o]["engine"]
    batches = engine["batch_sizes"]
    mean = sum(int(k) * v for k, v in batches.items()) / max(1, sum(batches.values()))
    print(
        f"  our engine (one replica, last round): {engine['generated_tokens']:,} tokens, acceptance "
        f"{engine['accepted_tokens'] / max(1, engine['drafted_tokens']):.2f}, rows per decode step: mean "
        f"{mean:.1f}, largest {max(int(k) for k in batches)}"
    )
    same_as_peer = sum(a == b for a, b in zip(rounds[-1][o]["text"], rounds[-1][p]["text"]))
    print(
        f"  greedy text, ours = transformers' on {same_as_peer} of {len(rounds[-1][o]['text'])} prompts; "
        f"the peer asked for 256 new tokens: {rounds[-1][p]['256 tokens']}"
    )
    import torch

    from scaleforge.calibrate.drafts import calibrate_drafts
    from scaleforge.config import CalibrateConfig, load_config

    search = load_config(CalibrateConfig, ROOT / "configs" / "calibrate_lm.yaml").draft.model_copy(
        update={"loads": []}
    )
    for drafter, name in ((paths["student"], "the distilled student"), ("lookup", "prompt lookup")):
        print(f"  draft lengths timed as configs/calibrate_lm.yaml times them, drafted by {name}:")
        print("    " + calibrate_drafts(paths["teacher"], drafter, search).summary().replace("\n", "\n    "))
    torch.set_num_threads(1)
    kv = cache_against_recompute(load_servable(paths["teacher"]).module, prompts[0], sizes.new_tokens)
    print(
        f"  one sequence in-process: KV cache {kv['cached']:,.0f} tokens/s, the window recomputed every "
        f"token {kv['recomputed']:,.0f} tokens/s ({kv['cached'] / kv['recomputed']:.1f}x)"
    )


if __name__ == "__main__":
    sys.exit(main())
