"""Thin entry points: ``python -m jobs.<name> --config configs/<file>.yaml [--set key=value ...]``."""
