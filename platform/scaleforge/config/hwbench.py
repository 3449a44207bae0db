"""Schema of the hardware benchmark (``jobs.hwbench``)."""

from pydantic import Field, PositiveInt

from scaleforge.config.schema import _Section


class HWBenchConfig(_Section):
    """``python -m jobs.hwbench``: matmul throughput and memory bandwidth of every node's CPU and GPUs."""

    cpu_matmul_size: PositiveInt = 1024
    """Side of the square matrices multiplied on CPUs."""
    gpu_matmul_size: PositiveInt = 8192
    repeats: int = Field(default=5, ge=1, le=100)
    """Timed repeats per figure (the best is kept), after one warm-up; fewer once a figure has taken 2 s."""
    output: str = "~/scaleforge/hwbench.json"
    """Where the per-device figures are written (JSON, atomically), for placement decisions: a local path
    or a URI (``s3://bucket/scaleforge/hwbench.json``)."""
