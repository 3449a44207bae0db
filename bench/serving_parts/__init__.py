"""The parts of bench/serving.py: its models, deployments, plain server, load and report."""
