"""The Open Inference Protocol (KServe V2) over JSON: request parsing, validation and responses.

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
from starlette.responses import Response

PROTOCOL = "v2"
INPUT_NAME = "input"
Scalar = Union[bool, int, float, str]


class ProtocolError(Exception):
    """A request the server refuses: ``status`` is the HTTP status, ``message`` says why."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


class RequestInput(BaseModel):
    """One input tensor of an infer request (JSON tensor data, row-major, flat or nested)."""

    model_config = ConfigDict(extra="allow")

    name: str
    shape: list[int]
    datatype: str
    data: Any = Field(json_schema_extra={"type": "array", "items": {}})
    parameters: dict[str, Any] = Field(default_factory=dict)


class RequestOutput(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    parameters: dict[str, Any] = Field(default_factory=dict)


class InferRequest(BaseModel):
    """``POST /v2/models/{name}/infer`` body. Routing options go in ``parameters``:
    ``trace`` (bool), ``min_confidence`` (float, cascades), ``max_stage`` (int, cascades),
    ``top_k`` (int, MoE routers)."""

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


def parse_infer_request(body: bytes, input_dim: int, max_batch_size: int) -> ParsedRequest:
    """Validate a JSON infer request against a model taking [batch, ``input_dim``] FP32.

    Raises:
        ProtocolError: 400 with the reason (not JSON, wrong shape or datatype, non-finite
            values, empty or oversized batch, malformed parameters).
    """
    request = _decode(body)
    if len(request.inputs) != 1:
        raise ProtocolError(400, f"expected exactly 1 input tensor, got {len(request.inputs)}")
    tensor = request.inputs[0]
    if tensor.datatype != "FP32":
        raise ProtocolError(400, f"input '{tensor.name}': datatype must be FP32, got {tensor.datatype!r}")
    if len(tensor.shape) != 2 or tensor.shape[1] != input_dim:
        raise ProtocolError(400, f"input '{tensor.name}': shape must be [batch, {input_dim}], got {tensor.shape}")
    batch = tensor.shape[0]
    if batch < 1:
        raise ProtocolError(400, f"input '{tensor.name}': empty batch (shape {tensor.shape})")
    if batch > max_batch_size:
        raise ProtocolError(400, f"input '{tensor.name}': batch of {batch} exceeds the limit of {max_batch_size}")
    x = _as_matrix(tensor, batch, input_dim)
    outputs = [o.name for o in request.outputs] or None
    return ParsedRequest(request.id, x, _check_parameters(request.parameters), outputs)


def _decode(body: bytes) -> InferRequest:
    try:
        raw = orjson.loads(body)
    except orjson.JSONDecodeError:
        # Strict JSON has no NaN or Infinity, but Python's json module (and so many clients) writes
        # them: read such a body the lenient way, so that the check of the values can name them.
        try:
            raw = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
            raise ProtocolError(400, f"request body is not valid JSON ({err}); the binary tensor extension "
                                     "is not supported, send JSON tensor data") from None
    try:
        return InferRequest.model_validate(raw)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "body"
        raise ProtocolError(400, f"invalid infer request: {where}: {first['msg']}") from None


def _as_matrix(tensor: RequestInput, batch: int, input_dim: int) -> np.ndarray:
    if not isinstance(tensor.data, list):
        raise ProtocolError(400, f"input '{tensor.name}': data must be a JSON array of numbers")
    try:
        values = np.asarray(tensor.data, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        raise ProtocolError(400, f"input '{tensor.name}': data must be numbers (flat or nested "
                                 "row-major arrays)") from None
    if values.size != batch * input_dim:
        raise ProtocolError(400, f"input '{tensor.name}': shape {tensor.shape} needs {batch * input_dim} values, "
                                 f"data has {values.size}")
    if not np.isfinite(values).all():
        bad = int((~np.isfinite(values)).sum())
        raise ProtocolError(400, f"input '{tensor.name}': {bad} value(s) are NaN or infinite")
    if np.abs(values).max() > np.finfo(np.float32).max:
        raise ProtocolError(400, f"input '{tensor.name}': values overflow FP32")
    return values.reshape(batch, input_dim).astype(np.float32)


_PARAMETER_TYPES = {"trace": bool, "min_confidence": float, "max_stage": int, "top_k": int}


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


class V2Response(Response):
    """A JSON response whose numpy arrays are written by orjson directly (float32 in its shortest
    form), several times faster than ``json.dumps`` over ``tolist()`` for the probabilities."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)


def tensor(name: str, values: np.ndarray) -> dict[str, Any]:
    """A V2 output tensor (JSON data, row-major flat; the array is rendered by :class:`V2Response`)."""
    datatype = {"int64": "INT64", "float32": "FP32", "bool": "BOOL"}[values.dtype.name]
    return {"name": name, "shape": list(values.shape), "datatype": datatype,
            "data": np.ascontiguousarray(values).ravel()}


def infer_response(model: str, request_id: Optional[str], outputs: dict[str, np.ndarray],
                   wanted: Optional[list[str]], parameters: Optional[dict[str, Scalar]] = None) -> dict[str, Any]:
    """The V2 infer response, with only the outputs the client asked for (all when it named none).

    Raises:
        ProtocolError: 400 when the client asked for an output the model does not have.
    """
    if wanted:
        unknown = [name for name in wanted if name not in outputs]
        if unknown:
            raise ProtocolError(400, f"unknown output(s) {', '.join(unknown)}; this model has "
                                     f"{', '.join(outputs)}")
        outputs = {name: outputs[name] for name in wanted}
    response = {"model_name": model, "model_version": "1",
                "outputs": [tensor(name, values) for name, values in outputs.items()]}
    if request_id is not None:
        response["id"] = request_id
    if parameters:
        response["parameters"] = parameters
    return response


def model_metadata(name: str, kind: str, input_dim: int, num_classes: int, outputs: list[str]) -> dict[str, Any]:
    """``GET /v2/models/{name}``: the tensors a client sends and gets back."""
    shapes = {"class": ([-1], "INT64"), "probabilities": ([-1, num_classes], "FP32"), "stage": ([-1], "INT64"),
              "confidence": ([-1], "FP32"), "experts": ([-1, -1], "INT64"), "fallback": ([-1, -1], "BOOL")}
    return {
        "name": name, "versions": ["1"], "platform": f"scaleforge-{kind}",
        "inputs": [{"name": INPUT_NAME, "datatype": "FP32", "shape": [-1, input_dim]}],
        "outputs": [{"name": out, "datatype": shapes[out][1], "shape": shapes[out][0]} for out in outputs],
    }
