"""Serving tests share the session's cluster with every other test file on their xdist worker."""

import pytest


@pytest.fixture(scope="module", autouse=True)
def _serve_down_after_the_module():
    """Shut the session's Serve down once a test file is done with it. An idle Serve is not free: its
    controller, its proxy and each replica poll, about 18% of a core with one app of two replicas,
    which the rest of the suite would pay for minutes. The next file that needs Serve starts it
    again (``serving_env.running_serve``), on the same port."""
    yield
    import ray

    if ray.is_initialized():
        from ray import serve

        serve.shutdown()  # a no-op where the file started none
