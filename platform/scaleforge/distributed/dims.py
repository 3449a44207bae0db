"""The parallel layout of a training run, resolved and checked in one place (torchtitan's ``ParallelDims``).

Pure Python: the config schemas validate layouts with this class before anything imports torch,
and the workers build their device mesh from the same object.
"""

import math
from dataclasses import asdict, dataclass
from typing import Optional

MESH_DIMS = ("dp", "fsdp", "pp", "tp")
"""Device-mesh dimensions, outermost first (tp innermost: its ranks are neighbours)."""


@dataclass(frozen=True)
class ParallelDims:
    """Degrees of every parallelism; their product (``ep`` aside) is the number of workers.

    ``ep`` splits the experts of MoE layers inside each group of ``ep`` data-parallel workers, so
    it does not multiply the world size.
    """

    dp: int
    fsdp: int = 1
    tp: int = 1
    pp: int = 1
    ep: int = 1
    pp_schedule: str = "1f1b"
    microbatches: int = 1

    @classmethod
    def resolve(
        cls,
        workers: int,
        *,
        dp: Optional[int] = None,
        fsdp: int = 1,
        tp: int = 1,
        pp: int = 1,
        ep: int = 1,
        pp_schedule: str = "1f1b",
        microbatches: int = 1,
    ) -> "ParallelDims":
        """The layout for ``workers`` ranks; ``dp`` defaults to the workers left after ``fsdp * tp * pp``.

        Raises:
            ValueError: naming every factor when the degrees do not fit the workers or do not combine.
        """
        split = fsdp * tp * pp
        if dp is None:
            if workers % split:
                raise ValueError(
                    f"parallel.fsdp ({fsdp}) * tp ({tp}) * pp ({pp}) = {split} "
                    f"must divide scaling.num_workers ({workers})"
                )
            dp = workers // split
        elif dp * split != workers:
            raise ValueError(
                f"parallel.dp ({dp}) * fsdp ({fsdp}) * tp ({tp}) * pp ({pp}) = {dp * split} "
                f"must equal scaling.num_workers ({workers})"
            )
        dims = cls(dp, fsdp, tp, pp, ep, pp_schedule, microbatches)
        dims._check_combinations()
        return dims

    def _check_combinations(self) -> None:
        split = {name: getattr(self, name) for name in ("fsdp", "tp", "pp") if getattr(self, name) > 1}
        if len(split) > 1 and set(split) != {"fsdp", "tp"}:
            raise ValueError(
                f"parallel: {' and '.join(f'{k} ({v})' for k, v in split.items())} do not combine; "
                "supported: each of fsdp, tp, pp with dp, and fsdp with tp"
            )
        if self.ep > 1:
            if split:
                raise ValueError(
                    f"parallel.ep ({self.ep}) combines with data parallelism only, "
                    "not with parallel.fsdp, tp or pp"
                )
            if self.world_size % self.ep:
                raise ValueError(
                    f"parallel.ep ({self.ep}) must divide scaling.num_workers ({self.world_size})"
                )
        if self.pp > 1 and self.pp_schedule == "1f1b" and self.microbatches < self.pp:
            raise ValueError(
                f"parallel.pp_schedule=1f1b needs parallel.microbatches ({self.microbatches}) "
                f">= parallel.pp ({self.pp})"
            )

    @property
    def world_size(self) -> int:
        return self.dp * self.fsdp * self.tp * self.pp

    @property
    def fsdp_enabled(self) -> bool:
        return self.fsdp > 1

    @property
    def tp_enabled(self) -> bool:
        return self.tp > 1

    @property
    def pp_enabled(self) -> bool:
        return self.pp > 1

    @property
    def ep_enabled(self) -> bool:
        return self.ep > 1

    @property
    def model_split(self) -> bool:
        """The model itself is split over ranks (fsdp, tp or pp): trained on a device mesh."""
        return self.fsdp_enabled or self.tp_enabled or self.pp_enabled

    @property
    def data_world(self) -> int:
        """Different slices of each global batch: ``dp * fsdp`` (tp and pp ranks share a slice)."""
        return self.dp * self.fsdp

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        return tuple(getattr(self, name) for name in MESH_DIMS)

    def describe(self) -> str:
        """``dp=2 x tp=2`` (every degree above 1; ``dp=1`` for one worker)."""
        parts = [f"{name}={getattr(self, name)}" for name in (*MESH_DIMS, "ep") if getattr(self, name) > 1]
        return " x ".join(parts) or "dp=1"

    def to_dict(self) -> dict:
        return asdict(self)

    def build_mesh(self, device_type: str):
        """The ``dp x fsdp x pp x tp`` device mesh over every rank of the initialised process group."""
        # Imported here: the config schemas use this class and must not import torch.
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        if math.prod(self.mesh_shape) != dist.get_world_size():
            raise ValueError(
                f"parallel layout {self.describe()} needs {self.world_size} ranks, "
                f"the process group has {dist.get_world_size()}"
            )
        return init_device_mesh(device_type, self.mesh_shape, mesh_dim_names=MESH_DIMS)
