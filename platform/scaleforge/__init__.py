"""scaleforge: large-scale deep learning on Ray.

The library behind the jobs in ``jobs/`` and the Serve apps in ``serving/``: typed configs,
datasets fed through Ray Data, a model registry, safetensors artifacts and data-parallel
training on Ray Train.
"""

__version__ = "0.1.0"
