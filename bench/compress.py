"""Compression: every must-show of the stage, measured in one run of the shipped recipe.

    .venv/bin/python bench/compress.py
    (about 4 minutes on 2 idle cores; 1 more to train the teacher if missing)

Runs ``python -m jobs.compress --config configs/compress.yaml`` as a user would (the default
teacher from ``configs/train_teacher.yaml``, trained first if it is not there), then reads the
job's own ``report.json`` and prints each must-show with its bar and whether this run met it.
The slim artifact is also loaded through serving's loader (``load_servable``) and scored on the
test set, which must reproduce the reported accuracy. Exit status 1 if a bar was missed.
"""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "platform"), str(ROOT)]

from bars import print_bars  # noqa: E402
from provenance import check_and_print  # noqa: E402

from scaleforge.artifacts.servable import load_servable  # noqa: E402
from scaleforge.compress.finetune import accuracy  # noqa: E402
from scaleforge.config import CompressJobConfig, load_config  # noqa: E402
from scaleforge.data import load_arrays  # noqa: E402

CONFIG = ROOT / "configs/compress.yaml"


def run(*args: str) -> None:
    """A job in its own process, its progress on stderr (the table alone goes to stdout)."""
    subprocess.run([sys.executable, "-m", *args], cwd=ROOT, check=True, stdout=sys.stderr)


def main() -> int:
    check_and_print()
    cfg = load_config(CompressJobConfig, CONFIG, [])
    if not (Path(cfg.teacher).expanduser() / "manifest.json").is_file():
        run("jobs.train", "--config", "configs/train_teacher.yaml")
    with tempfile.TemporaryDirectory(prefix="scaleforge-bench-compress-") as tmp:
        out = Path(tmp) / "out"
        run(
            "jobs.compress",
            "--config",
            str(CONFIG),
            "--set",
            f"output={out}",
            "--set",
            f"run.storage_path={tmp}/runs",
        )
        report = json.loads((out / "report.json").read_text())
        arrays = load_arrays(cfg.data)
        torch.set_num_threads(cfg.measure.threads)
        with torch.inference_mode():
            served = accuracy(load_servable(out / "model").module, arrays.x_test, arrays.y_test)
    rows = must_shows(report, served)
    teacher = report["teacher"]
    print(
        f"teacher {teacher['parameters']:,} weights, {teacher['bytes']:,} bytes, "
        f"accuracy {teacher['accuracy']:.4f}; "
        f"latency: median of {report['measure']['repeats']} passes, {report['torch_threads']} thread; "
        f"job wall-clock {report['wall_s']:.0f} s"
    )
    return print_bars(rows, "must show")


def must_shows(report: dict, served_accuracy: float) -> list[tuple[str, str, str, bool]]:
    """(item, what this run measured, the bar, met) for must-shows 1-6."""

    def sweep(name: str, **details) -> dict:
        return next(
            r for r in report["sweeps"][name] if all(r["details"].get(k) == v for k, v in details.items())
        )

    def drop(row: dict) -> float:
        return row["vs_teacher"]["accuracy_drop_points"]

    def speedup(row: dict) -> float:
        return row["vs_teacher"]["speedup"]["64"]

    rows = []
    sparse = sweep("unstructured", sparsity=0.9)
    rows.append(
        ("1. unstructured 90% sparsity", f"drop {drop(sparse):.2f} pt", "drop <= 1", drop(sparse) <= 1)
    )
    narrow = sweep("structured", sparsity=0.5)
    rows.append(
        (
            "2. structured 50% width",
            f"{speedup(narrow):.2f}x at batch 64, drop {drop(narrow):.2f} pt",
            ">= 1.5x, drop <= 1.5",
            speedup(narrow) >= 1.5 and drop(narrow) <= 1.5,
        )
    )
    int8 = sweep("quantize", scheme="int8_static")
    shrink = int8["details"]["weight_bytes_before"] / int8["details"]["weight_bytes_after"]
    rows.append(
        (
            "3. int8 static",
            f"weights {shrink:.2f}x smaller, {speedup(int8):.2f}x at 64, drop {drop(int8):.2f} pt",
            ">= 3.5x, >= 2x, drop <= 0.5",
            shrink >= 3.5 and speedup(int8) >= 2 and drop(int8) <= 0.5,
        )
    )
    by_step = {r["step"]: r for r in report["recipe"]}
    distilled, hard = by_step["distill"], by_step["distill_baseline"]
    fewer, kept = distilled["vs_teacher"]["fewer_parameters"], distilled["vs_teacher"]["accuracy_retained"]
    rows.append(
        (
            "4. distillation vs hard labels",
            f"{fewer:.1f}x fewer; {distilled['accuracy']:.4f} vs {hard['accuracy']:.4f}; keeps {kept:.1%}",
            ">= 10x, better, >= 97%",
            fewer >= 10 and distilled["accuracy"] > hard["accuracy"] and kept >= 0.97,
        )
    )
    for factorized in report["sweeps"]["low_rank"]:
        ratio = (
            factorized["details"]["factorized_params_before"]
            / factorized["details"]["factorized_params_after"]
        )
        rank = ", ".join(f"{layer} rank {k}" for layer, k in factorized["details"]["ranks"].items())
        rows.append(
            (
                f"5. low rank, {rank}",
                f"{ratio:.1f}x fewer in the layer, drop {drop(factorized):.2f} pt",
                ">= 2x, drop <= 1",
                ratio >= 2 and drop(factorized) <= 1,
            )
        )
    slim = report["recipe"][-1]
    smaller = slim["vs_teacher"]["smaller"]
    rows.append(
        (
            "6. default recipe (distill, prune, int8)",
            f"{smaller:.1f}x smaller, {speedup(slim):.2f}x at 64, drop {drop(slim):.2f} pt",
            ">= 10x, >= 3x, drop <= 2",
            smaller >= 10 and speedup(slim) >= 3 and drop(slim) <= 2,
        )
    )
    rows.append(
        (
            "6. slim artifact through serving's loader",
            f"accuracy {served_accuracy:.4f} (report: {slim['accuracy']:.4f})",
            "equal",
            served_accuracy == slim["accuracy"],
        )
    )
    return rows


if __name__ == "__main__":
    sys.exit(main())
