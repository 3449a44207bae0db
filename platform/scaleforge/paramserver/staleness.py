"""Staleness alone, with no Ray and no clock: a parameter server's updates simulated in one process, each
gradient computed on the parameters of exactly ``tau`` updates before.

What staleness costs a run, apart from everything else a real run varies (delays, the order pushes
land in, the cores): ``bench/paramserver.py`` part c sets it against the gradients its SSP runs needed,
with and without the workers' weight prediction (:class:`~scaleforge.paramserver.worker.WeightPredictor`).
"""

import torch

from scaleforge.config import AsyncSGDConfig
from scaleforge.data.in_memory import load_in_memory
from scaleforge.models import build_model
from scaleforge.paramserver.layout import ParamLayout
from scaleforge.paramserver.run import worker_shards
from scaleforge.paramserver.update import SliceOptimizer
from scaleforge.paramserver.worker import WeightPredictor, batches, gradient


def stale_updates(
    cfg: AsyncSGDConfig,
    lr: float,
    tau: int,
    target: float,
    *,
    predict: bool = False,
    limit: int = 3000,
    every: int = 20,
) -> int:
    """Updates to ``target`` held-out accuracy of ``cfg``'s model, data and workers (its seed, batch size
    and worker count): Adam at ``lr`` on the flat parameters, as a shard applies it, the workers'
    batches taken in turn, each gradient computed on the parameters of exactly ``tau`` updates before,
    or with ``predict`` on those the worker's weight prediction makes of them (told the staleness is
    ``tau``).

    Args:
        every: accuracy is measured every this many updates.

    Returns:
        The update at which the accuracy was first measured at or above ``target``; 0 if not within
        ``limit`` updates.
    """
    workers, seed = cfg.workers.num_workers, cfg.workers.seed
    data = load_in_memory(cfg.data)
    torch.manual_seed(seed)
    model = build_model(cfg.model, data.info.input_dim, data.info.num_classes)
    layout = ParamLayout.of(model)
    flat = torch.from_numpy(layout.flatten(model).copy())
    optimizer = SliceOptimizer(flat, "adam")  # a shard's rule
    streams = [
        batches(data.x[rows], data.y[rows], cfg.workers.batch_size, seed + i)
        for i, rows in enumerate(worker_shards(len(data.y), workers, seed))
    ]
    predictors = [WeightPredictor([(0, layout.total)]) for _ in range(workers)]
    for predictor in predictors:
        predictor.staleness = [float(tau)]
    read = [flat.detach().clone()] * (tau + 1)  # the parameters after each of the last tau + 1 updates
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for update in range(1, limit + 1):
            params = read[0].numpy().copy()
            if predict:  # the worker whose turn it is reads version update - 1 - tau
                predictors[update % workers].predict(params, [(max(0, update - 1 - tau), 0)])
            layout.assign(model, params)
            grad, _ = gradient(model, layout, *next(streams[update % workers]))
            optimizer.step(torch.from_numpy(grad), lr)
            read = read[1:] + [flat.detach().clone()]
            if update % every == 0:
                layout.assign(model, flat.detach().numpy())
                if data.score(model) >= target:
                    return update
    finally:
        torch.set_num_threads(threads)
    return 0
