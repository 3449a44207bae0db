"""Matplotlib for jobs that run headless, imported when a figure is drawn: its import costs about 0.3 s
of CPU, which every process that imports a report module would otherwise pay (Ray workers included)."""


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
