"""The parts of bench/lm.py: quality, throughput and layouts, and the runs they share."""
