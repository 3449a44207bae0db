"""What bench/generate.py runs on: sizes, the language models (the user's artifacts, or trained once
into a cache), their Hugging Face exports, and our side's serve config."""

import sys
from dataclasses import dataclass
from pathlib import Path

from scaleforge.artifacts.hf import export_hf
from scaleforge.config.loader import load_config
from scaleforge.config.serve import ServeConfig
from scaleforge.routers import GeneratorEntry

REPO = Path(__file__).resolve().parents[2]
SERVE_CONFIG = REPO / "configs" / "serve_lm.yaml"
CACHE = Path("~/.cache/scaleforge/generate-bench").expanduser()
TEACHER, STUDENT = "lm_small", "compressed_lm/steps/00-distill"
"""Where ``jobs.train --config configs/train_lm_small.yaml`` and ``jobs.compress --config
configs/compress_lm.yaml`` put the teacher and the distilled (float) student, under an artifacts folder."""


@dataclass(frozen=True)
class Sizes:
    prompts: int = 16
    prompt_bytes: int = 32
    new_tokens: int = 96
    """Prompt and new tokens fill train_lm_small.yaml's context of 128 exactly: transformers' GPT-2 has no
    positions past it, so its ``generate`` cannot go on (the bench shows what it does at 256)."""
    clients: int = 16
    requests_per_client: int = 2
    rounds: int = 3


QUICK = Sizes(prompts=4, clients=4, requests_per_client=1, rounds=1)


def artifacts(folder: Path | None) -> dict[str, str]:
    """The teacher and the student: under ``folder`` (an artifacts folder of the user's), else in the
    cache, trained there first as bench/compress_lm.py trains them (about 25 minutes on 2 cores)."""
    root = folder or CACHE
    paths = {"teacher": root / TEACHER, "student": root / STUDENT}
    if not all((p / "manifest.json").is_file() for p in paths.values()):
        if folder is not None:
            raise SystemExit(f"{folder}: no {TEACHER} and {STUDENT} artifacts under it")
        _train(CACHE)
    return {name: str(path) for name, path in paths.items()}


def _train(root: Path) -> None:
    from compress_lm import train_and_compress

    print(f"training the teacher and the student into {root} (once)", file=sys.stderr)
    train_and_compress(root, root / "compressed_lm")


def hf_exports(paths: dict[str, str], folder: Path) -> dict[str, str]:
    """Each model exported to the Hugging Face format under ``folder``."""
    return {name: str(export_hf(path, folder / name)) for name, path in paths.items()}


def ours(paths: dict[str, str], port: int) -> tuple[ServeConfig, GeneratorEntry]:
    """configs/serve_lm.yaml serving the bench's teacher and student: its generator ``lm`` (the teacher
    drafted by prompt lookup, as shipped) and its deployment settings, on ``port``; the other models and
    generators, which need artifacts this bench does not make, left out."""
    cfg = load_config(ServeConfig, SERVE_CONFIG)
    app = cfg.applications[0]
    lm = next(r for r in app.args.routers if r.name == "lm")
    args = app.args.model_copy(
        update={
            "models": [app.args.model(n).model_copy(update={"artifact": paths[n]}) for n in lm.models()],
            "routers": [lm],
        }
    )
    cfg = cfg.model_copy(
        update={
            "http_options": cfg.http_options.model_copy(update={"port": port}),
            "applications": [app.model_copy(update={"args": args})],
        }
    )
    return cfg, lm
