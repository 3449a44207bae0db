"""Deploy every app of a validated Serve config and keep serving (``python -m jobs.serve``)."""

import sys
import time

from ray import serve

from scaleforge.artifacts import ArtifactError
from scaleforge.config.serve import ServeConfig
from scaleforge.runtime import ensure_ray
from serving.app import build_app, model_infos


def run_config(cfg: ServeConfig, block: bool = True) -> str:
    """Check every app's artifacts, then start Serve and deploy the apps.

    Returns:
        The base URL (after Ctrl-C when ``block``).
    """
    for app in cfg.applications:
        try:
            model_infos(app.args)  # artifacts and shapes, before any Ray resource is allocated
        except (ArtifactError, ValueError) as err:
            print(f"error: application {app.name!r}: {err}", file=sys.stderr)
            raise SystemExit(2) from None
    ensure_ray(min_cpus=4)
    http = cfg.http_options.model_dump(exclude_none=True)
    serve.start(proxy_location=cfg.proxy_location, http_options=http)
    for app in cfg.applications:
        serve.run(build_app(app.args), name=app.name, route_prefix=app.route_prefix)
    url = f"http://{cfg.http_options.host}:{cfg.http_options.port}"
    print(f"serving {', '.join(a.name for a in cfg.applications)} at {url}/v2 (Ctrl-C stops)", flush=True)
    if block:
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            serve.shutdown()
    return url
