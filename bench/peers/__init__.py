"""The peers the benchmarks measure ours against, each in a file of its own, set up the way its own
docs set it up."""
