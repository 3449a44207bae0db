"""A local cluster's processes find their own cluster, whichever cluster started last on the machine."""

import os
import subprocess
import sys

LATER_CLUSTER = """
import sys, ray
ray.init(address="local", num_cpus=0, include_dashboard=False)
print(ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.read()
"""
"""A local Ray started as plain ``ray.init`` starts one, which records itself as the machine's current
cluster (``/tmp/ray/ray_current_cluster``); it runs until its stdin closes."""


def test_a_worker_with_env_vars_of_its_own_resolves_its_own_cluster(ray_cluster):
    """The session cluster starts as every embedded Ray does (``scaleforge.runtime.init_local_ray``).
    A worker asks for its cluster's address as Ray's state API does with the address left out (as Ray
    Train's placement-group cleaner leaves it). Ray Train gives its controller a runtime environment with
    env_vars of its own: the cluster's address must survive that merge, or the lookup falls back to
    ``/tmp/ray/ray_current_cluster``, the last cluster started on the machine."""

    def own_address() -> tuple[str, str]:
        import ray
        from ray._private.services import canonicalize_bootstrap_address_or_die

        return canonicalize_bootstrap_address_or_die(None), ray.get_runtime_context().gcs_address

    later = subprocess.Popen(
        [sys.executable, "-c", LATER_CLUSTER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "RAY_ADDRESS": ""},
    )
    try:
        other = later.stdout.readline().strip()
        resolved, own = ray_cluster.get(ray_cluster.remote(own_address).remote(), timeout=120)
        assert other and other != own and resolved == own
        _controller_resolves_its_own(ray_cluster, own_address)
    finally:
        later.stdin.close()
        later.wait(timeout=120)


def _controller_resolves_its_own(ray_cluster, own_address) -> None:
    """An actor given env_vars of its own, as Ray Train gives its controller."""

    @ray_cluster.remote(num_cpus=0, runtime_env={"env_vars": {"SCALEFORGE_TEST_OWN": "1"}})
    class Controller:
        def ask(self):
            return own_address(), os.environ["SCALEFORGE_TEST_OWN"]

    controller = Controller.remote()
    (resolved, own), own_var = ray_cluster.get(controller.ask.remote(), timeout=120)
    assert resolved == own and own_var == "1"
    ray_cluster.kill(controller)
