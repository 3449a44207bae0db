"""Deployment: hardware measurement (``hardware``), placement of served models (``placement``), and
deploying a checked Serve config (``deploy``).

Import the modules themselves (``from scaleforge.deployment.deploy import deploy``): this package
imports none of them, so reading a hardware report or a placement does not import Ray Serve.
"""
