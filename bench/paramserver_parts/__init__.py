"""The parts of bench/paramserver.py, a to e, and what they share."""
