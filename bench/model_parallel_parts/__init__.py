"""The parts of bench/model_parallel.py."""
