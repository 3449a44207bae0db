"""Ray Serve apps: the KServe V2 ingress over plain models and routers (``serving.app:build_app``)."""
