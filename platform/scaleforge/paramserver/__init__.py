"""Parameter servers on Ray actors: sharded flat parameters, async workers, sync/async/SSP consistency."""

from scaleforge.lazy import lazy_exports

__all__ = ["ParamLayout", "AsyncSGDResult", "run_async_sgd", "worker_shards"]
__getattr__ = lazy_exports(
    __name__,
    {
        "ParamLayout": "scaleforge.paramserver.layout",
        "AsyncSGDResult": "scaleforge.paramserver.report",
        "run_async_sgd": "scaleforge.paramserver.run",
        "worker_shards": "scaleforge.paramserver.plan",
    },
)
