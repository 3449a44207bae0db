"""The table every benchmark ends with: each bar beside what was measured, met or missed."""

Row = tuple[str, str, str, bool]
"""(what, measured, bar, met)."""


def print_bars(rows: list[Row], first_column: str = "config") -> int:
    """Print ``rows`` as aligned columns and a last line naming any missed bar.

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
        print(f"{name:{widths[0]}s} {measured:{widths[1]}s} {bar:{widths[2]}s} {'yes' if met else 'NO'}")
    missed = [name for name, *_, met in rows if not met]
    print("every bar met" if not missed else f"missed: {', '.join(missed)}")
    return 1 if missed else 0
