"""The Open Inference Protocol (KServe V2) over gRPC: ``inference.GRPCInferenceService`` through
Serve's gRPC proxy, answered by the same ingress as HTTP.

The service and its messages are KServe's ``grpc_predict_v2.proto`` as Triton ships them (the same
package, service and field numbers, Triton adding RPCs of its own): the stubs come compiled with
``tritonclient``, so a Triton or KServe client talks to it unchanged. Serve starts the service when
its ``grpc_options`` name :data:`SERVICER` (:func:`add_servicer_to_server`); its proxy hands each
call to the app's ingress method of the RPC's name (``ModelInfer``, ``ModelMetadata``, ...), see
``serving.ingress``.

Tensors come in as ``raw_input_contents`` (little-endian bytes, what ``tritonclient.grpc`` sends) or
typed ``contents.fp32_contents``, and go out as ``raw_output_contents``. Requests are checked by the
rules of the HTTP protocol (:mod:`serving.protocol`); a refusal is the gRPC status that matches its
HTTP status, with the same message.
"""

import asyncio
import sys
from typing import Any, Optional

import grpc
import numpy as np
from tritonclient.grpc import model_config_pb2, service_pb2_grpc
from tritonclient.grpc import service_pb2 as pb

from scaleforge.serving_contract import ProtocolError
from serving import binary
from serving.protocol import (
    InferRequest,
    ParsedRequest,
    RequestInput,
    RequestOutput,
    check_input,
    parsed_request,
)
from serving.responses import model_metadata

SERVICER = "serving.grpc_v2.add_servicer_to_server"
"""The import path that Serve's ``grpc_options.grpc_servicer_functions`` takes for this service (the
default of ``scaleforge.config.serve.GrpcOptions``; its proxy imports this module, kept light)."""

# Serve's proxy and the ingress replica pass the request and response messages to each other through
# Ray, pickled, by their classes' module; tritonclient compiled its protos as top-level modules, so
# its message classes name modules that do not exist ('grpc_service_pb2'). Both processes import
# this module (the proxy for the servicer function, the replica with the ingress), which names them.
sys.modules.setdefault("grpc_service_pb2", pb)
sys.modules.setdefault("model_config_pb2", model_config_pb2)


def add_servicer_to_server(servicer, server) -> None:
    """KServe V2's ``inference.GRPCInferenceService`` on Serve's gRPC server (``grpc_servicer_functions``)."""
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)


STATUS = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    404: grpc.StatusCode.NOT_FOUND,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    503: grpc.StatusCode.UNAVAILABLE,
}
"""The gRPC status of each HTTP status the protocol refuses a request with."""


def refuse(grpc_context, err: ProtocolError, empty):
    """A call refused: the gRPC status that matches the HTTP one and the message as its details, on
    Serve's ``grpc_context``; ``empty`` (the RPC's response message) is what the method returns."""
    grpc_context.set_code(STATUS.get(err.status, grpc.StatusCode.INVALID_ARGUMENT))
    grpc_context.set_details(err.message)
    return empty


def bearer_token(metadata: list[tuple[str, Any]]) -> Optional[str]:
    """The ``authorization`` call metadata, as HTTP's header (``Bearer <token>``)."""
    return next((str(value) for key, value in metadata if key.lower() == "authorization"), None)


def parameter_value(parameter: pb.InferParameter) -> Any:
    """An ``InferParameter``'s value (bool, int, float or string, whichever is set)."""
    kind = parameter.WhichOneof("parameter_choice")
    return None if kind is None else getattr(parameter, kind)


def parse_model_infer(request: pb.ModelInferRequest, input_dim: int, max_batch_size: int) -> ParsedRequest:
    """A ``ModelInferRequest`` checked as an HTTP infer request is.

    Raises:
        ProtocolError: 400 with the reason (as over HTTP), or for raw contents that do not match the inputs.
    """
    inputs = [
        RequestInput(
            name=t.name,
            shape=list(t.shape),
            datatype=t.datatype,
            data=list(t.contents.fp32_contents) if t.HasField("contents") else None,
        )
        for t in request.inputs
    ]
    if not inputs:
        raise ProtocolError(400, "expected exactly 1 input tensor, got 0")
    parsed = InferRequest(
        id=request.id or None,
        inputs=inputs,
        parameters={k: parameter_value(v) for k, v in request.parameters.items()},
        outputs=[RequestOutput(name=o.name) for o in request.outputs],
    )
    tensor, batch = check_input(parsed, input_dim, max_batch_size)
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(inputs):
        raise ProtocolError(
            400, f"{len(raw)} raw_input_contents for {len(inputs)} input(s); send one per input"
        )
    if raw and tensor.data is not None:
        raise ProtocolError(400, f"input '{tensor.name}': both contents and raw_input_contents; send one")
    if not raw and tensor.data is None:
        raise ProtocolError(
            400, f"input '{tensor.name}': no data (contents.fp32_contents or raw_input_contents)"
        )
    return parsed_request(parsed, batch, input_dim, raw[0] if raw else None)


def _parameter(value: Any) -> pb.InferParameter:
    if isinstance(value, bool):
        return pb.InferParameter(bool_param=value)
    if isinstance(value, int):
        return pb.InferParameter(int64_param=value)
    if isinstance(value, float):
        return pb.InferParameter(double_param=value)
    return pb.InferParameter(string_param=str(value))


def model_infer_response(response: dict[str, Any]) -> pb.ModelInferResponse:
    """The infer response (as :func:`serving.responses.infer_response` builds it) with raw output bytes."""
    answer = pb.ModelInferResponse(
        model_name=response["model_name"], model_version=response["model_version"], id=response.get("id", "")
    )
    for key, value in response.get("parameters", {}).items():
        answer.parameters[key].CopyFrom(_parameter(value))
    for output in response["outputs"]:
        answer.outputs.add(name=output["name"], datatype=output["datatype"], shape=output["shape"])
        answer.raw_output_contents.append(binary.encode(np.asarray(output["data"]), output["datatype"]))
    return answer


def model_metadata_response(metadata: dict[str, Any]) -> pb.ModelMetadataResponse:
    """``GET /v2/models/{name}``'s answer as a ``ModelMetadataResponse``."""
    return pb.ModelMetadataResponse(
        name=metadata["name"],
        versions=metadata["versions"],
        platform=metadata["platform"],
        inputs=[pb.ModelMetadataResponse.TensorMetadata(**t) for t in metadata["inputs"]],
        outputs=[pb.ModelMetadataResponse.TensorMetadata(**t) for t in metadata["outputs"]],
    )


class GrpcV2Methods:
    """``inference.GRPCInferenceService``'s methods, named after its RPCs, that Serve's gRPC proxy calls on
    the ingress (``serving.ingress.V2Ingress`` inherits them): the same checks and answers as over HTTP."""

    async def ModelInfer(self, request, grpc_context):  # noqa: N802 - the RPC's name
        status = "500"
        try:
            self._authorize(bearer_token(grpc_context.invocation_metadata()))
            info = self._info(request.model_name)
            parsed = parse_model_infer(request, info.input_dim, self.args.limits.max_batch_size)
            answer = model_infer_response(await self._answer(request.model_name, parsed))
            status = "200"
            return answer
        except ProtocolError as err:
            status = str(err.status)
            return refuse(grpc_context, err, pb.ModelInferResponse())
        finally:
            name = request.model_name
            self.metrics.requests.inc(
                tags={"model": name if name in self.infos else "unknown", "status": status}
            )

    async def ModelMetadata(self, request, grpc_context):  # noqa: N802
        try:
            self._authorize(bearer_token(grpc_context.invocation_metadata()))
            info = self._info(request.name)
        except ProtocolError as err:
            return refuse(grpc_context, err, pb.ModelMetadataResponse())
        return model_metadata_response(model_metadata(request.name, info))

    async def ModelReady(self, request, grpc_context):  # noqa: N802
        try:
            self._authorize(bearer_token(grpc_context.invocation_metadata()))
            self._info(request.name)
        except ProtocolError as err:
            return refuse(grpc_context, err, pb.ModelReadyResponse())
        return pb.ModelReadyResponse(ready=await self._models_ready(request.name))

    def ServerLive(self, request):  # noqa: N802
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request):  # noqa: N802
        ready = all(await asyncio.gather(*(self._deployment_ready(h) for h in self.handles.values())))
        return pb.ServerReadyResponse(ready=ready)

    def ServerMetadata(self, request):  # noqa: N802
        return pb.ServerMetadataResponse(**self.server_metadata())
