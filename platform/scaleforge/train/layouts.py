"""Every parallel layout of a job's workers that the trainer supports and its model allows: the rows
of ``jobs.train --plan``'s table."""

from pydantic import ValidationError

from scaleforge.config.schema import TrainJobConfig


def layouts(cfg: TrainJobConfig) -> list[TrainJobConfig]:
    """``cfg`` under every layout of its workers that the trainer supports and its model allows
    (dp; each of fsdp, tp and pp with dp; fsdp x tp), its own layout first."""
    workers, parallel = cfg.scaling.num_workers, cfg.parallel
    divisors = [d for d in range(2, workers + 1) if workers % d == 0]
    candidates = [{}] + [{name: d} for name in ("fsdp", "tp", "pp") for d in divisors]
    candidates += [{"fsdp": f, "tp": t} for f in divisors for t in divisors if workers % (f * t) == 0]
    found, seen = [cfg], {cfg.dims}
    for degrees in candidates:
        layout = {
            "dp": None,
            "fsdp": 1,
            "tp": 1,
            "pp": 1,
            "ep": 1,
            **degrees,
            "microbatches": max(parallel.microbatches, degrees.get("pp", 1)),
        }
        try:
            variant = TrainJobConfig.model_validate(
                {**cfg.model_dump(), "parallel": {**parallel.model_dump(), **layout}}
            )
        except ValidationError:  # the model or batch does not split this way (heads, layers, micro-batches)
            continue
        if variant.dims not in seen:
            found.append(variant)
            seen.add(variant.dims)
    return found
