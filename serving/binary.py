"""The V2 binary tensor extension (KServe's and Triton's): raw little-endian tensor bytes after a JSON header.

A request that uses it carries the header ``Inference-Header-Content-Length: N``: the body's first N
bytes are the JSON infer request, and each input whose ``parameters`` name a ``binary_data_size``
takes that many of the bytes after it, in the order of ``inputs``. An output asked for with
``parameters: {"binary_data": true}`` (or every output, with the request's ``parameters:
{"binary_data_output": true}``) comes back the same way: its JSON entry names its
``binary_data_size`` instead of holding ``data``, its bytes follow the JSON, and the response's
``Inference-Header-Content-Length`` says where the JSON ends. This is what ``tritonclient`` sends
and reads with ``binary_data=True``: 4 bytes a float instead of ~10 characters to write and parse.

Pure bytes handling; a malformed payload raises ``ValueError`` with the reason, which the protocol
module answers with 400.
"""

from typing import Optional

import numpy as np

HEADER = "Inference-Header-Content-Length"
DTYPES = {"FP32": np.dtype("<f4"), "INT64": np.dtype("<i8"), "BOOL": np.dtype("?")}
"""The datatypes this server sends or takes, as their little-endian wire layout (BOOL: one byte)."""


def split_body(body: bytes, header_length: Optional[str]) -> tuple[bytes, bytes]:
    """The JSON part and the binary part of a request body (``header_length``: the header's value, if
    sent)."""
    if header_length is None:
        return body, b""
    try:
        length = int(header_length)
    except ValueError:
        raise ValueError(f"{HEADER} must be an integer, got {header_length!r}") from None
    if not 0 < length <= len(body):
        raise ValueError(f"{HEADER} is {length}, but the body has {len(body)} bytes")
    return body[:length], body[length:]


def split_inputs(sizes: list[Optional[object]], names: list[str], blob: bytes) -> list[Optional[bytes]]:
    """Each input's bytes (None for an input sent as JSON data), cut from ``blob`` in order.

    ``sizes``: each input's ``parameters.binary_data_size`` as sent (None when absent).
    """
    chunks, offset = [], 0
    for name, size in zip(names, sizes):
        if size is None:
            chunks.append(None)
            continue
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ValueError(
                f"input '{name}': parameters.binary_data_size must be a byte count, got {size!r}"
            )
        if offset + size > len(blob):
            raise ValueError(
                f"input '{name}': binary_data_size {size} runs past the {len(blob)} bytes "
                "after the JSON header"
            )
        chunks.append(blob[offset : offset + size])
        offset += size
    if offset != len(blob):
        raise ValueError(
            f"{len(blob) - offset} byte(s) after the JSON header belong to no input "
            "(the binary_data_size of the inputs add up to less)"
        )
    return chunks


def decode(chunk: bytes, datatype: str, count: int, name: str) -> np.ndarray:
    """``count`` values of ``datatype`` from one input's bytes (a flat, read-only view)."""
    expected = count * DTYPES[datatype].itemsize
    if len(chunk) != expected:
        raise ValueError(
            f"input '{name}': {len(chunk)} bytes of binary data, but its shape needs "
            f"{count} {datatype} values ({expected} bytes)"
        )
    return np.frombuffer(chunk, dtype=DTYPES[datatype])


def encode(values: np.ndarray, datatype: str) -> bytes:
    """An output tensor's bytes, row-major and little-endian."""
    return np.ascontiguousarray(values, dtype=DTYPES[datatype]).tobytes()
