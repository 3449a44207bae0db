"""Ray Serve apps: the KServe V2 ingress over plain models, cascades and MoE routers (``serving.app:build_app``)."""
