"""The parts of bench/generate.py: the models, each side's server, the load, the cache comparison."""
