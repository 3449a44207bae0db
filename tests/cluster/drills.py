"""Run a drill script (its own driver process, its own multi-node cluster) and read its RESULT line."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_drill(script: Path, *args: str, timeout: float = 900) -> dict:
    out = subprocess.run([sys.executable, str(script), *map(str, args)], cwd=REPO, capture_output=True, text=True,
                         timeout=timeout)
    results = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and results, out.stdout[-3000:] + out.stderr[-3000:]
    return json.loads(results[-1].removeprefix("RESULT "))
