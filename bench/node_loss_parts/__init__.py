"""The parts of bench/node_loss.py: finding and removing a node, and the Serve drill."""
