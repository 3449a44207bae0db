"""Compression of the language model: int8 Linear layers and a distilled student, measured in one run.

    .venv/bin/python bench/compress_lm.py      (40 minutes here on 2 cores shared with other jobs, about half
                                                of it training the teacher)

Trains the teacher with ``configs/train_lm_small.yaml`` (Ray Train, 2 workers, one pass over the
standard-library corpus) into a temporary folder, then runs ``configs/compress_lm.yaml`` on it
(distill to a student at least 4x smaller on the teacher's token distributions, with the same student
trained on the text alone beside it, then int8_dynamic, then export; int8_dynamic of the teacher
itself as a sweep). Each bar is read from the job's own ``report.json``: int8 weights at least 3.5x
smaller with bits per byte within 0.05 of fp32, for the teacher and the student; the distilled
student at least 4x smaller than the teacher and better (fewer bits per byte) than the hard-label
one. The slim artifact is also loaded through serving's loader and scored on the validation text,
which must reproduce the reported bits per byte. Exit status 1 if a bar was missed.

The teacher and the compression output are kept in bench/generate.py's cache
(``~/.cache/scaleforge/generate-bench``), which serves them next (``make bench`` runs it after this).
"""

import json
import shutil
import sys
import tempfile
from contextlib import redirect_stdout
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "platform"), str(ROOT)]

from bars import print_bars  # noqa: E402
from provenance import check_and_print  # noqa: E402
from training import train  # noqa: E402

from scaleforge.artifacts.servable import load_servable  # noqa: E402
from scaleforge.compress import run_compression  # noqa: E402
from scaleforge.compress.preflight import check_runnable  # noqa: E402
from scaleforge.config import CompressJobConfig, load_config  # noqa: E402
from scaleforge.data.in_memory import load_in_memory  # noqa: E402

CONFIG = ROOT / "configs/compress_lm.yaml"


def main() -> int:
    check_and_print()
    # The jobs' own progress goes to stderr; the table alone to stdout (make bench keeps it).
    with (
        tempfile.TemporaryDirectory(prefix="scaleforge-bench-compress-lm-") as folder,
        redirect_stdout(sys.stderr),
    ):
        tmp = Path(folder)
        teacher, cfg, result = train_and_compress(tmp, tmp / "out")
        report = json.loads((tmp / "out" / "report.json").read_text())
        torch.set_num_threads(cfg.measure.threads)
        served = load_in_memory(cfg.data).score(load_servable(tmp / "out" / "model").module)
        keep_for_generate(tmp / "lm_small", tmp / "out")
    print(
        f"teacher (train_lm_small.yaml) {teacher.num_parameters:,} parameters, validation bits/byte "
        f"{teacher.metrics['bits_per_byte']:.3f} after {teacher.wall_s:.0f} s; "
        f"compress_lm.yaml: job wall-clock {result.wall_s:.0f} s, "
        f"bits/byte on {cfg.data.max_validation_bytes or 'all'} bytes of validation text"
    )
    return print_bars(bars(report, served), "must show")


def train_and_compress(root: Path, output: Path):
    """The teacher by configs/train_lm_small.yaml into ``root/lm_small``, then configs/compress_lm.yaml
    on it into ``output``: (the training result, the compression config, the compression result)."""
    teacher = train(root, "lm_small", "train_lm_small.yaml")
    cfg = load_config(
        CompressJobConfig,
        CONFIG,
        [f"teacher={teacher.artifact}", f"output={output}", f"run.storage_path={root / 'runs'}"],
        check_runnable,
    )
    return teacher, cfg, run_compression(cfg)


def keep_for_generate(teacher: Path, compressed: Path) -> None:
    """Both into bench/generate.py's cache, each replacing what was there (moved in whole)."""
    from generate_parts.setup import CACHE, STUDENT, TEACHER

    CACHE.mkdir(parents=True, exist_ok=True)
    for source, name in ((teacher, TEACHER), (compressed, STUDENT.split("/")[0])):
        shutil.rmtree(CACHE / name, ignore_errors=True)
        shutil.copytree(source, CACHE / f".{name}.partial", dirs_exist_ok=True)
        (CACHE / f".{name}.partial").rename(CACHE / name)


def bars(report: dict, served_bits: float) -> list[tuple[str, str, str, bool]]:
    """(item, what this run measured, the bar, met) for must-show 6 of the language-model issue."""
    by_step = {row["step"]: row for row in report["recipe"]}
    rows = []
    teacher_int8 = report["sweeps"]["int8"][0]
    for name, fp32, int8 in (
        ("teacher", report["teacher"], teacher_int8),
        ("distilled student", by_step["distill"], by_step["quantize"]),
    ):
        shrink = int8["details"]["weight_bytes_before"] / int8["details"]["weight_bytes_after"]
        change = int8["bits_per_byte"] - fp32["bits_per_byte"]
        rows.append(
            (
                f"6. int8_dynamic Linear layers, {name}",
                f"weights {shrink:.2f}x smaller, bits/byte {fp32['bits_per_byte']:.4f} -> "
                f"{int8['bits_per_byte']:.4f} ({change:+.4f})",
                ">= 3.5x, within 0.05",
                shrink >= 3.5 and abs(change) <= 0.05,
            )
        )
    distilled, hard = by_step["distill"], by_step["distill_baseline"]
    fewer = distilled["vs_teacher"]["fewer_parameters"]
    rows.append(
        (
            "6. distilled student vs the same on text alone",
            f"{fewer:.1f}x fewer parameters ({distilled['parameters']:,}); bits/byte "
            f"{distilled['bits_per_byte']:.4f} vs {hard['bits_per_byte']:.4f} (teacher "
            f"{report['teacher']['bits_per_byte']:.4f})",
            ">= 4x, lower",
            fewer >= 4 and distilled["bits_per_byte"] < hard["bits_per_byte"],
        )
    )
    slim = report["recipe"][-1]
    rows.append(
        (
            "6. slim artifact through serving's loader",
            f"bits/byte {served_bits:.4f} (report: {slim['bits_per_byte']:.4f})",
            "equal",
            served_bits == slim["bits_per_byte"],
        )
    )
    return rows


if __name__ == "__main__":
    sys.exit(main())
