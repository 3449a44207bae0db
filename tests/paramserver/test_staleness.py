"""The staleness simulator of bench/paramserver.py part c: one process, no Ray, exact staleness."""

from conftest import REPO

from scaleforge.config import AsyncSGDConfig, load_config
from scaleforge.paramserver.staleness import stale_updates


def _cfg():
    return load_config(
        AsyncSGDConfig, REPO / "configs/async_sgd.yaml", ["data.num_samples=3000", "workers.num_workers=3"]
    )


def test_with_no_staleness_weight_prediction_changes_no_update():
    """The predictor moves a read by the staleness it was told times the change per update: told 0, it
    leaves every read as it is, so both runs reach the target at the same update."""
    plain = stale_updates(_cfg(), 0.003, 0, 0.6, limit=400)
    assert plain > 0
    assert stale_updates(_cfg(), 0.003, 0, 0.6, predict=True, limit=400) == plain


def test_a_target_not_reached_within_the_limit_gives_0():
    assert stale_updates(_cfg(), 0.003, 2, 1.01, predict=True, limit=40) == 0
