"""No Ray on the machine while a plain peer is measured: find Ray's processes, wait for them to go.

Each Ray run of bench/lm.py happens in a process of its own whose embedded cluster goes with it when it
exits; its GCS, raylet and workers take a few seconds more. A plain side measured in those seconds (or
beside anyone else's cluster) shares the cores with them, so :func:`wait_for_no_ray` waits until no Ray
process is left and refuses to go on after ``timeout_s``.
"""

import os
import time
from pathlib import Path

MARKER = "SCALEFORGE_BENCH_LM"
"""Set in this bench's environment; every process it starts (Ray's daemons and workers included)
inherits it, which tells them from the Ray processes of anyone else on the machine."""

RAY_DAEMONS = {"gcs_server", "raylet"}


def mark_this_bench() -> None:
    os.environ.setdefault(MARKER, str(os.getpid()))


def ray_processes(only_this_bench: bool) -> list[str]:
    """``pid name`` of every Ray process on the machine (GCS, raylet, ``ray::`` workers, Ray's own
    Python daemons: dashboard, agents, log monitor), or only of those this bench started."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            comm = (proc / "comm").read_text().strip()
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
            if not _is_ray(comm, argv):
                continue
            if only_this_bench and f"{MARKER}={os.environ[MARKER]}".encode() not in (
                proc / "environ"
            ).read_bytes().split(b"\0"):
                continue
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue  # gone meanwhile, or another user's (its environment unreadable)
        found.append(f"{proc.name} {comm}: {' '.join(argv[:2])[-70:]}")
    return found


def _is_ray(comm: str, argv: list[str]) -> bool:
    return (
        comm in RAY_DAEMONS
        or argv[0].startswith("ray::")
        or any(arg.endswith(".py") and f"{os.sep}ray{os.sep}" in arg for arg in argv[:3])
    )


def wait_for_no_ray(only_this_bench: bool = False, timeout_s: float = 120) -> None:
    """Return once no Ray process is left on the machine (or, with ``only_this_bench``, none that this
    bench started: for smoke runs on a machine shared with other people's clusters).

    Raises:
        RuntimeError: naming the processes still there after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while left := ray_processes(only_this_bench):
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"a plain peer is measured with no Ray on the machine, but {len(left)} Ray processes are "
                f"still there after {timeout_s:.0f} s ({'; '.join(left[:4])}); stop that cluster, or for "
                "a smoke run on a shared machine pass --other-ray-ok"
            )
        time.sleep(1)
