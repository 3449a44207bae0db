"""The main job on text (``configs/pipeline_lm.yaml``), tiny: a 2-layer model trained data-parallel on
100 kB of the standard library's source, a distilled drafter and int8 versions, the draft length
calibrated, every generator served over HTTP on an embedded Ray as ``make demo`` runs a job, queried
with held-out prompts, streaming, and reported; then ``--from report`` rewrites the report from the
records alone.
"""

import json
import os
import subprocess
import sys

import pytest
import yaml
from conftest import REPO

from jobs.pipeline import main

TINY = [
    arg
    for override in (
        "teacher.config=configs/train_lm_tiny.yaml",
        "teacher.set=[optim.epochs=1, data.max_train_bytes=100000, data.max_validation_bytes=20000]",
        "compress.set=[data.seq_len=64, data.max_train_bytes=50000, data.max_validation_bytes=20000, "
        "recipe.0.student.context=64, recipe.0.student.d_model=32, recipe.0.student.num_layers=1, "
        "recipe.0.student.ff_dim=64, recipe.0.optim.epochs=1, recipe.0.compare_hard_labels=false, "
        "measure.repeats=2, scaling.num_workers=1]",
        "calibrate.set=['draft.candidates=[0, 2]', draft.prompts=2, draft.new_tokens=16, 'draft.loads=[2]']",
        "serve.set=[applications.0.args.ingress.replicas=1]",
        "query={prompts: 4, max_tokens: 16, clients: [1, 4], samples: 2}",
    )
    for arg in ("--set", override)
]
GENERATORS = {"lm", "lm-student-draft", "lm-int8", "lm-student", "lm-student-int8"}


def _pipeline(root, *extra) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"SCALEFORGE_RAY_DASHBOARD": "0"}
    command = ["-m", "jobs.pipeline", "--config", "configs/pipeline_lm.yaml", "--set", f"storage={root}"]
    return subprocess.run(
        [sys.executable, *command, *TINY, *extra],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


def test_the_language_model_is_trained_compressed_calibrated_served_queried_and_reported(tmp_path):
    run = _pipeline(tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    out = tmp_path / "pipeline_lm"
    records = {p.stem: json.loads(p.read_text()) for p in (out / "records").glob("*.json")}
    assert set(records) == {"teacher", "compress", "calibrate", "serve", "query", "report"}

    # The calibrated draft length is what the written serve config serves.
    calibrated = records["calibrate"]
    assert calibrated["generator"] == "lm" and calibrated["chosen"] in (0, 2)
    served = yaml.safe_load((out / "serve.yaml").read_text())["applications"][0]["args"]
    lm = next(r for r in served["routers"] if r["name"] == "lm")
    assert lm["draft_tokens"] == calibrated["chosen"]
    assert {m["name"]: m["artifact"] for m in served["models"]}["student-int8"] == records["compress"][
        "artifact"
    ]

    # Every generator answered every prompt in full at each load, streamed; continuous batching ran
    # decode steps of several sequences at 4 clients; the drafted generator reports its acceptance.
    query = records["query"]
    assert set(query["generators"]) == GENERATORS
    for result in query["generators"].values():
        assert [(load["clients"], load["tokens"]) for load in result["loads"]] == [(1, 4 * 16), (4, 4 * 16)]
        assert result["loads"][0]["first_token_p50_ms"] > 0
    assert max(r["loads"][-1]["largest_step"] for r in query["generators"].values()) >= 2
    acceptance = query["generators"]["lm"]["loads"][0]["acceptance"]
    # Undrafted, nothing is drafted; drafted by prompt lookup, a prompt without a repeated n-gram drafts
    # nothing either, so only the bounds are certain.
    assert acceptance is None if calibrated["chosen"] == 0 else acceptance is None or 0 <= acceptance <= 1
    assert len(query["samples"]) == 2 and all(s["completion"] for s in query["samples"])

    # The report: every model's bits/byte as the compression job scored it, the samples, the plots.
    report = (out / "report" / "report.md").read_text()
    table = run.stdout[run.stdout.index("generator        model") :]
    assert "n/a" not in table.split("\n16 new tokens")[0] and "tok/s @4" in table
    assert query["samples"][0]["prompt"] + query["samples"][0]["completion"] in report
    for plot in ("draft_lengths.png", "tokens_per_s.png", "compression_bits_per_byte_vs_size.png"):
        assert (out / "report" / plot).read_bytes()[:4] == b"\x89PNG"

    # --from report: the records alone, no Ray, the same table.
    again = _pipeline(tmp_path, "--from", "report")
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count(": reused (") == 5 and "ray" not in again.stderr.lower()
    assert table.split("\npipeline wall-clock")[0] in again.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--from", "moe"],
            "--from moe: not a stage of kind lm (teacher, compress, calibrate, serve, query, report)",
        ),
        (["--set", "kind=nope"], "kind: Input should be 'classifier' or 'lm'"),
        (
            ["--set", "serve.models.draft=compress/../x"],
            "serve.models: draft: 'compress/../x' must name a folder inside the compression output",
        ),
        (["--set", "fault.fail_at_stage=moe"], "fault.fail_at_stage: moe is not a stage of kind lm"),
    ],
)
def test_a_bad_lm_pipeline_run_is_refused_before_anything_starts(args, message, tmp_path, capsys):
    assert main(["--config", "configs/pipeline_lm.yaml", "--set", f"storage={tmp_path}", *args]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "pipeline_lm").exists()
