"""Held-out prompts for generation: starts of lines from the validation files of a corpus (files the
models never trained on), spread over the files, the same ones on every call."""

from scaleforge.text.corpus import STDLIB, load_corpus


def held_out_prompts(
    count: int, length: int, source: str = STDLIB, validation_fraction: float = 0.05
) -> list[bytes]:
    """``count`` prompts of ``length`` bytes, each the start of a line of valid UTF-8: first the line at a
    third of each validation file (past the licence and imports), then at two thirds, then at a half.

    Raises:
        ValueError: the validation files hold fewer than ``count`` such prompts.
    """
    prompts = []
    files = [text.read() for text in load_corpus(source, validation_fraction).validation]
    for fraction in (1 / 3, 2 / 3, 1 / 2):
        for data in files:
            start = data.find(b"\n", int(len(data) * fraction)) + 1
            piece = data[start : start + length]
            if (
                start > 0
                and len(piece) == length
                and _whole_utf8(piece)
                and piece.strip()
                and piece not in prompts
            ):
                prompts.append(piece)
            if len(prompts) == count:
                return prompts
    raise ValueError(f"the validation files hold {len(prompts)} prompts of {length} bytes, not {count}")


def _whole_utf8(piece: bytes) -> bool:
    try:
        piece.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
