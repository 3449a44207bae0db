"""The Open Inference Protocol (KServe V2) over HTTP: the infer response, as JSON or with binary tensors
(:mod:`serving.binary`), the model metadata, and the ``Server-Timing`` header of the ingress's hops."""

from typing import TYPE_CHECKING, Any, Optional

import numpy as np
import orjson
from starlette.responses import Response

from scaleforge.serving_contract import ProtocolError
from serving import binary
from serving.protocol import INPUT_NAME, ParsedRequest, Scalar

if TYPE_CHECKING:
    from scaleforge.serving_contract import ModelInfo


class V2Response(Response):
    """A JSON response whose numpy arrays are written by orjson directly (float32 in its shortest
    form), several times faster than ``json.dumps`` over ``tolist()`` for the probabilities."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)


def render(response: dict[str, Any], request: ParsedRequest) -> Response:
    """The infer response as JSON, or with the outputs the request asked for as binary data after it."""
    chunks = []
    for output in response["outputs"]:
        if request.sends_binary(output["name"]):
            chunks.append(binary.encode(output.pop("data"), output["datatype"]))
            output["parameters"] = {"binary_data_size": len(chunks[-1])}
    if not chunks:
        return V2Response(response)
    header = orjson.dumps(response, option=orjson.OPT_SERIALIZE_NUMPY)
    return Response(
        header + b"".join(chunks),
        media_type="application/octet-stream",
        headers={binary.HEADER: str(len(header))},
    )


SERVER_TIMING = "Server-Timing"
"""The W3C response header where the ingress says where an infer request's time went on the server:
``ingress;dur=<ms>`` from the ingress's handler taking the request to its response (body read, checks,
parsing, the model, rendering), and ``model;dur=<ms>`` of that spent awaiting the model, cascade or
router (for a model deployment: the handle's hop and its replica). The rest of what a client waits is
the HTTP proxy's hop and the network."""


def server_timing(**durations_s: float) -> str:
    """``Server-Timing`` of ``name=seconds`` pairs, in milliseconds: ``ingress;dur=1.234,
    model;dur=0.567``."""
    return ", ".join(f"{name};dur={1e3 * seconds:.3f}" for name, seconds in durations_s.items())


def parse_server_timing(header: str) -> dict[str, float]:
    """``{name: milliseconds}`` of a ``Server-Timing`` header (entries without a duration are left out)."""
    timings = {}
    for entry in header.split(","):
        name, *params = (part.strip() for part in entry.split(";"))
        durations = [float(p.partition("=")[2]) for p in params if p.startswith("dur=")]
        if name and durations:
            timings[name] = durations[0]
    return timings


def tensor(name: str, values: np.ndarray) -> dict[str, Any]:
    """A V2 output tensor (JSON data, row-major flat; the array is rendered by :class:`V2Response`)."""
    datatype = {"int64": "INT64", "float32": "FP32", "bool": "BOOL"}[values.dtype.name]
    return {
        "name": name,
        "shape": list(values.shape),
        "datatype": datatype,
        "data": np.ascontiguousarray(values).ravel(),
    }


def infer_response(
    model: str,
    request_id: Optional[str],
    outputs: dict[str, np.ndarray],
    wanted: Optional[list[str]],
    parameters: Optional[dict[str, Scalar]] = None,
) -> dict[str, Any]:
    """The V2 infer response, with only the outputs the client asked for (all when it named none).

    Raises:
        ProtocolError: 400 when the client asked for an output the model does not have.
    """
    if wanted:
        unknown = [name for name in wanted if name not in outputs]
        if unknown:
            raise ProtocolError(
                400, f"unknown output(s) {', '.join(unknown)}; this model has {', '.join(outputs)}"
            )
        outputs = {name: outputs[name] for name in wanted}
    response = {
        "model_name": model,
        "model_version": "1",
        "outputs": [tensor(name, values) for name, values in outputs.items()],
    }
    if request_id is not None:
        response["id"] = request_id
    if parameters:
        response["parameters"] = parameters
    return response


def model_metadata(name: str, info: "ModelInfo") -> dict[str, Any]:
    """``GET /v2/models/{name}``: the tensors a client sends and gets back."""
    return {
        "name": name,
        "versions": ["1"],
        "platform": f"scaleforge-{info.kind}",
        "inputs": [{"name": INPUT_NAME, "datatype": "FP32", "shape": [-1, info.input_dim]}],
        "outputs": [{"name": o.name, "datatype": o.datatype, "shape": list(o.shape)} for o in info.outputs],
    }
