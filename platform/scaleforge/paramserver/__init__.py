"""Parameter servers on Ray actors: sharded flat parameters, async workers, sync/async/SSP consistency."""

from scaleforge.paramserver.layout import ParamLayout
from scaleforge.paramserver.report import AsyncSGDResult
from scaleforge.paramserver.run import run_async_sgd, worker_shards

__all__ = ["ParamLayout", "AsyncSGDResult", "run_async_sgd", "worker_shards"]
