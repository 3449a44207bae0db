"""The table every benchmark ends with: each bar beside what was measured, met or missed."""

Row = tuple[str, str, str, bool | None]
"""(what, measured, bar, met): ``met`` is None for a tie, a gap inside the spread of repeated runs that
says neither side is ahead; a tie is printed as such and is no miss."""


def print_bars(rows: list[Row], first_column: str = "config") -> int:
    """Print ``rows`` as aligned columns and a last line naming any missed bar (and any tie).

    Returns 1 if a bar was missed, else 0.
    """
    if not rows:
        print("no bar in what ran")
        return 0
    widths = [
        max(len(header), *(len(row[i]) for row in rows))
        for i, header in enumerate((first_column, "measured", "bar"))
    ]
    print(f"{first_column:{widths[0]}s} {'measured':{widths[1]}s} {'bar':{widths[2]}s} met")
    for name, measured, bar, met in rows:
        verdict = "tie" if met is None else "yes" if met else "NO"
        print(f"{name:{widths[0]}s} {measured:{widths[1]}s} {bar:{widths[2]}s} {verdict}")
    # ``met`` may be a numpy bool (a comparison of numpy figures), which ``is False`` would not catch.
    missed = [name for name, *_, met in rows if met is not None and not met]
    ties = [name for name, *_, met in rows if met is None]
    tied = f" (a tie: {', '.join(ties)})" if ties else ""
    print(f"every bar met{tied}" if not missed else f"missed: {', '.join(missed)}{tied}")
    return 1 if missed else 0
