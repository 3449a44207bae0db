"""The Open Inference Protocol (KServe V2) over HTTP: request parsing and validation (the responses:
:mod:`serving.responses`).

Tensors travel as JSON data or, with the binary tensor extension (:mod:`serving.binary`), as raw
bytes after a JSON header; a request may mix the two, and each output comes back as it was asked for.

Everything a client can get wrong is caught here and raised as :class:`ProtocolError` with the
HTTP status and a message naming the problem, so the ingress never answers 500 for bad input.
"""

import json
import math
from dataclasses import dataclass
from typing import Any, Optional, Union

import numpy as np
import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from scaleforge.routers import request_parameters
from scaleforge.serving_contract import ProtocolError
from serving import binary

PROTOCOL = "v2"
INPUT_NAME = "input"
Scalar = Union[bool, int, float, str]


class RequestInput(BaseModel):
    """One input tensor of an infer request: JSON ``data`` (row-major, flat or nested), or with the
    binary extension ``parameters.binary_data_size`` bytes after the JSON header."""

    model_config = ConfigDict(extra="allow")

    name: str
    shape: list[int]
    datatype: str
    data: Any = Field(default=None, json_schema_extra={"type": "array", "items": {}})
    parameters: dict[str, Any] = Field(default_factory=dict)


class RequestOutput(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    parameters: dict[str, Any] = Field(default_factory=dict)


class InferRequest(BaseModel):
    """``POST /v2/models/{name}/infer`` body. Routing options go in ``parameters``: ``trace`` (bool)
    and each router's own (``scaleforge.routers``: ``min_confidence`` and ``max_stage`` of a
    cascade, ``top_k`` of an MoE router)."""

    model_config = ConfigDict(extra="allow")

    id: Optional[str] = None
    parameters: dict[str, Any] = Field(default_factory=dict)
    inputs: list[RequestInput] = Field(min_length=1)
    outputs: list[RequestOutput] = Field(default_factory=list)


@dataclass(frozen=True)
class ParsedRequest:
    """A validated infer request: the FP32 features and the routing parameters."""

    id: Optional[str]
    x: np.ndarray
    parameters: dict[str, Any]
    outputs: Optional[list[str]]
    binary_outputs: frozenset[str] = frozenset()
    """Outputs to send as binary data (``parameters.binary_data``)."""
    all_binary: bool = False
    """Every output as binary data (the request's ``parameters.binary_data_output``)."""

    def sends_binary(self, output: str) -> bool:
        return self.all_binary or output in self.binary_outputs


def parse_infer_request(
    body: bytes, input_dim: int, max_batch_size: int, header_length: Optional[str] = None
) -> ParsedRequest:
    """Validate an infer request against a model taking [batch, ``input_dim``] FP32.

    ``header_length``: the request's ``Inference-Header-Content-Length`` (binary tensors follow
    that many bytes of JSON), None when it sent none.

    Raises:
        ProtocolError: 400 with the reason (not JSON, wrong shape or datatype, non-finite
            values, empty or oversized batch, malformed parameters, binary data that does not
            match the header or the shape).
    """
    try:
        header, blob = binary.split_body(body, header_length)
    except ValueError as err:
        raise ProtocolError(400, str(err)) from None
    request = _decode(header)
    tensor, batch = check_input(request, input_dim, max_batch_size)
    sizes = [t.parameters.get("binary_data_size") for t in request.inputs]
    if header_length is None and sizes[0] is not None:
        raise ProtocolError(
            400,
            f"input '{tensor.name}': binary_data_size without the {binary.HEADER} "
            "header (it says where the JSON ends and the binary data begins)",
        )
    try:
        chunk = binary.split_inputs(sizes, [tensor.name], blob)[0]
    except ValueError as err:
        raise ProtocolError(400, str(err)) from None
    return parsed_request(request, batch, input_dim, chunk)


def check_input(request: InferRequest, input_dim: int, max_batch_size: int) -> tuple[RequestInput, int]:
    """The request's one input tensor and its batch size, if its datatype and shape fit the model."""
    if len(request.inputs) != 1:
        raise ProtocolError(400, f"expected exactly 1 input tensor, got {len(request.inputs)}")
    tensor = request.inputs[0]
    if tensor.datatype != "FP32":
        raise ProtocolError(400, f"input '{tensor.name}': datatype must be FP32, got {tensor.datatype!r}")
    if len(tensor.shape) != 2 or tensor.shape[1] != input_dim:
        raise ProtocolError(
            400, f"input '{tensor.name}': shape must be [batch, {input_dim}], got {tensor.shape}"
        )
    batch = tensor.shape[0]
    if batch < 1:
        raise ProtocolError(400, f"input '{tensor.name}': empty batch (shape {tensor.shape})")
    if batch > max_batch_size:
        raise ProtocolError(
            400, f"input '{tensor.name}': batch of {batch} exceeds the limit of {max_batch_size}"
        )
    return tensor, batch


def parsed_request(request: InferRequest, batch: int, input_dim: int, raw: Optional[bytes]) -> ParsedRequest:
    """The checked request's features (from JSON ``data``, or ``raw`` little-endian bytes) and options."""
    tensor = request.inputs[0]
    try:
        x = _as_matrix(tensor, batch, input_dim, raw)
    except ValueError as err:
        raise ProtocolError(400, str(err)) from None
    outputs = [o.name for o in request.outputs] or None
    return ParsedRequest(
        request.id,
        x,
        _check_parameters(request.parameters),
        outputs,
        frozenset(o.name for o in request.outputs if o.parameters.get("binary_data") is True),
        request.parameters.get("binary_data_output") is True,
    )


def _decode(body: bytes) -> InferRequest:
    try:
        raw = orjson.loads(body)
    except orjson.JSONDecodeError:
        # Strict JSON has no NaN or Infinity, but Python's json module (and so many clients) writes
        # them: read such a body the lenient way, so that the check of the values can name them.
        try:
            raw = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
            raise ProtocolError(
                400,
                f"request body is not valid JSON ({err}); a body with binary tensors "
                f"needs the {binary.HEADER} header",
            ) from None
    try:
        return InferRequest.model_validate(raw)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "body"
        raise ProtocolError(400, f"invalid infer request: {where}: {first['msg']}") from None


def _as_matrix(tensor: RequestInput, batch: int, input_dim: int, chunk: Optional[bytes]) -> np.ndarray:
    if chunk is not None:
        if tensor.data is not None:
            raise ProtocolError(400, f"input '{tensor.name}': both JSON data and binary_data_size; send one")
        values = binary.decode(chunk, "FP32", batch * input_dim, tensor.name)  # float32 cannot overflow FP32
    else:
        values = _json_values(tensor)
    if values.size != batch * input_dim:
        raise ProtocolError(
            400,
            f"input '{tensor.name}': shape {tensor.shape} needs {batch * input_dim} values, "
            f"data has {values.size}",
        )
    if not np.isfinite(values).all():
        bad = int((~np.isfinite(values)).sum())
        raise ProtocolError(400, f"input '{tensor.name}': {bad} value(s) are NaN or infinite")
    if np.abs(values).max() > np.finfo(np.float32).max:
        raise ProtocolError(400, f"input '{tensor.name}': values overflow FP32")
    return values.reshape(batch, input_dim).astype(np.float32)


def _json_values(tensor: RequestInput) -> np.ndarray:
    if not isinstance(tensor.data, list):
        raise ProtocolError(
            400,
            f"input '{tensor.name}': data must be a JSON array of numbers (or, with the "
            "binary tensor extension, parameters.binary_data_size)",
        )
    try:
        return np.asarray(tensor.data, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        raise ProtocolError(
            400, f"input '{tensor.name}': data must be numbers (flat or nested row-major arrays)"
        ) from None


_PARAMETER_TYPES = request_parameters()


def _check_parameters(parameters: dict[str, Any]) -> dict[str, Any]:
    """Type-check the routing parameters; others (e.g. a client's own) pass through untouched."""
    checked = dict(parameters)
    for key, kind in _PARAMETER_TYPES.items():
        if key not in parameters:
            continue
        value = parameters[key]
        numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
        if kind is bool and not isinstance(value, bool):
            raise ProtocolError(400, f"parameters.{key} must be true or false, got {value!r}")
        if kind is int and not (isinstance(value, int) and not isinstance(value, bool)):
            raise ProtocolError(400, f"parameters.{key} must be an integer, got {value!r}")
        if kind is float and not (numeric and math.isfinite(value)):
            raise ProtocolError(400, f"parameters.{key} must be a finite number, got {value!r}")
    return checked
