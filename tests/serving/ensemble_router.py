"""A router kind the library does not register, written the way a new kind is: one file holding its
runtime class and its entry, nothing else; ``test_router_plugins`` registers it (``EnsembleArgs``) and
serves it through the unchanged ingress.

It lives in a module of its own (not the test file) so that Serve's replicas, which import it by name
(``tests.serving.ensemble_router``, from the driver's working directory), find it.
"""

import asyncio
from typing import Annotated, Any, Literal, Union

import numpy as np
from pydantic import Field

from scaleforge.config.serve import ServeArgs
from scaleforge.routers import ROUTER_ENTRIES, RouterEntry, TensorSpec
from scaleforge.serving_contract import ModelInfo, logits_tensor


class EnsembleRouter:
    """Averages its members' probabilities; ``trace`` says whether every member picked the same class."""

    def __init__(self, entry: "EnsembleEntry", models: Any, info: ModelInfo, metrics: Any):
        self.members = [models.client(name) for name in entry.models()]

    async def infer(
        self, x: np.ndarray, parameters: dict[str, Any]
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        logits = await asyncio.gather(*(member.predict(x) for member in self.members))
        probs = np.stack([logits_tensor(rows).softmax(dim=-1).numpy() for rows in logits])
        mean = probs.mean(axis=0).astype(np.float32)
        outputs = {"class": mean.argmax(axis=1).astype(np.int64), "probabilities": mean}
        if parameters.get("trace"):
            votes = probs.argmax(axis=2)
            outputs["agreement"] = (votes == votes[0]).all(axis=0)
        return outputs, {"members": len(self.members)}


class EnsembleEntry(RouterEntry):
    """Serves the mean of its members' probabilities."""

    kind: Literal["ensemble"]
    members: list[str] = Field(min_length=2)

    router = EnsembleRouter
    trace = (TensorSpec("agreement", "BOOL", (-1,)),)

    def models(self) -> list[str]:
        return self.members


class EnsembleArgs(ServeArgs):
    """The serve args with the ensemble registered beside the library's kinds (what one registration
    line in ``scaleforge.routers.ROUTER_ENTRIES`` does for a kind of the library)."""

    routers: list[Annotated[Union[(*ROUTER_ENTRIES, EnsembleEntry)], Field(discriminator="kind")]] = Field(
        default_factory=list
    )
