"""``jobs.calibrate`` with ``generator:``: each draft length timed on held-out prompts, the fastest written
into the serve config as the generator's ``draft_tokens``; a drafter that is the target itself has every
draft accepted."""

import sys
from pathlib import Path

import pytest
import yaml

import jobs.calibrate
from scaleforge.calibrate.drafts import calibrate_drafts
from scaleforge.config.calibrate import DraftSearchSpec

sys.path.insert(0, str(Path(__file__).parents[1] / "serving"))
from lm_env import trained_lms  # noqa: E402

SEARCH = {"candidates": [0, 2, 4], "prompts": 2, "prompt_bytes": 16, "new_tokens": 40, "loads": [2]}


@pytest.fixture(scope="module")
def lms(tmp_path_factory) -> dict[str, str]:
    return trained_lms(tmp_path_factory)


def test_the_fastest_draft_length_is_written_into_the_serve_config(lms, tmp_path, capsys):
    serve = {
        "applications": [
            {
                "name": "lm-app",
                "args": {
                    "models": [{"name": n, "artifact": a, "in_ingress": True} for n, a in lms.items()],
                    "routers": [{"kind": "generator", "name": "lm", "model": "target", "drafter": "drafter"}],
                },
            }
        ]
    }
    serve_path = tmp_path / "serve_lm.yaml"
    serve_path.write_text("# python -m jobs.serve --config serve_lm.yaml\n" + yaml.safe_dump(serve))
    calibrate = {"serve_config": str(serve_path), "generator": "lm", "draft": SEARCH}
    config = tmp_path / "calibrate_lm.yaml"
    config.write_text("# python -m jobs.calibrate --config calibrate_lm.yaml\n" + yaml.safe_dump(calibrate))
    assert jobs.calibrate.main(["--config", str(config)]) == 0
    out = capsys.readouterr().out
    chosen = int(out.split("draft_tokens ")[1].split()[0])
    written = yaml.safe_load(serve_path.read_text())["applications"][0]["args"]["routers"][0]
    assert written["draft_tokens"] == chosen and chosen in SEARCH["candidates"]
    # The load at which the chosen length was timed against none, and what followed from it.
    if chosen:
        assert "at 2 clients: " in out
        assert written.get("draft_max_running") in (None, 1, 2) and "draft_max_running: " in out
    assert serve_path.read_text().startswith("# python -m jobs.serve")
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert [int(row[0]) for row in rows] == SEARCH["candidates"]


def test_a_drafter_that_is_the_target_has_every_draft_accepted(lms):
    calibration = calibrate_drafts(lms["target"], lms["target"], DraftSearchSpec(**SEARCH))
    drafted = [p for p in calibration.points if p.draft_tokens]
    assert all(p.acceptance == 1.0 for p in drafted), calibration.summary()
    # Each check emits k + 1 tokens, save where a window nears the context or a request its last tokens.
    assert drafted[-1].tokens_per_check > 3.0


def test_a_generator_without_a_drafter_is_refused_before_measuring(lms, tmp_path, capsys):
    serve = {
        "applications": [
            {
                "name": "a",
                "args": {
                    "models": [{"name": "target", "artifact": lms["target"], "in_ingress": True}],
                    "routers": [{"kind": "generator", "name": "lm", "model": "target"}],
                },
            }
        ]
    }
    serve_path = tmp_path / "serve.yaml"
    serve_path.write_text(yaml.safe_dump(serve))
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"serve_config": str(serve_path), "generator": "lm"}))
    assert jobs.calibrate.main(["--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "generator: 'lm' in " in err and "has no drafter, so no draft length to calibrate" in err
