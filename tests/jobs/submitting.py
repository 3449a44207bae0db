"""``ray job submit`` as a user runs it, submitted again on Ray's own races."""

import re
import secrets
import subprocess
import time

from conftest import REPO

from scaleforge.cluster.local import RAY

RACES = ("No available agent to submit job", "prematurely been deleted")
"""Consoles of a submission Ray refused on a race of its own, not on the job: a head whose dashboard
answers may not have its job agent yet; and the working_dir package of the job before, which this
submission found in the GCS and did not upload, deleted once that job ended (ray-project/ray#46625;
"re-run" is Ray's own advice)."""


def submit(
    address: str, env: dict[str, str], name: str, runtime_env: str, *entrypoint: str, timeout: float = 900
) -> tuple[str, str]:
    """``ray job submit --working-dir .`` of ``entrypoint``, waiting for the job and tailing its logs:
    its submission id and console (ANSI colours removed), which ends with "Job '<id>' succeeded" or
    the reason it did not."""
    for _ in range(30):
        submission_id = f"{name}-{secrets.token_hex(3)}"
        try:
            out = subprocess.run(
                [
                    RAY,
                    "job",
                    "submit",
                    "--address",
                    address,
                    "--submission-id",
                    submission_id,
                    "--working-dir",
                    ".",
                    "--runtime-env-json",
                    runtime_env,
                    "--",
                    *entrypoint,
                ],
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=timeout,
                env=env,
            )
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"job {submission_id} still running after {timeout:.0f} s; its logs so far:\n"
                + _logs_and_stop(address, env, submission_id)[-6000:]
            ) from None
        console = re.sub(r"\x1b\[[0-9;]*m", "", out.stdout + out.stderr)
        if not any(race in console for race in RACES):
            break
        time.sleep(2)
    return submission_id, console


def _logs_and_stop(address: str, env: dict[str, str], submission_id: str) -> str:
    """A job's console so far (``ray job logs``), then ``ray job stop``: what a hung job was doing."""
    logs = subprocess.run(
        [RAY, "job", "logs", "--address", address, submission_id],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    subprocess.run(
        [RAY, "job", "stop", "--address", address, "--no-wait", submission_id],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    return logs.stdout + logs.stderr
