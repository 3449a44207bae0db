"""The ingress: the Open Inference Protocol (KServe V2) over FastAPI, and over gRPC, in front of every
served model and router.

Routes: ``GET /v2``, ``/v2/health/live``, ``/v2/health/ready``, ``/v2/models/{name}``,
``/v2/models/{name}/ready``, ``POST /v2/models/{name}/infer``; OpenAPI at ``/openapi.json``.
Errors are ``{"error": message}`` with a 4xx (503 when a model is overloaded or down), never a 500
for anything a client sent. Where Serve runs its gRPC proxy with :data:`serving.grpc_v2.SERVICER`,
the same calls arrive as ``inference.GRPCInferenceService`` RPCs (the methods named after them
below), refused with the matching gRPC status and the same message.
"""

import asyncio
import time
from typing import Any, Optional

import numpy as np
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from ray import serve
from ray.exceptions import RayActorError
from ray.serve.exceptions import BackPressureError, ReplicaUnavailableError
from ray.serve.handle import DeploymentHandle

import scaleforge
from scaleforge.config.serve import ServeArgs
from scaleforge.serving_contract import ModelInfo, ProtocolError, logits_tensor, predict
from serving import binary, grpc_v2, http, openai
from serving.metrics import RoutingMetrics
from serving.models import CoalescingClient, InIngressModel
from serving.protocol import ParsedRequest, parse_infer_request
from serving.responses import SERVER_TIMING, infer_response, model_metadata, render, server_timing
from serving.routers import Answers, ServedModels, build_router


class PlainModel:
    """A single model behind the V2 API: a deployment of its own, or run in the ingress."""

    def __init__(self, client: "CoalescingClient | InIngressModel"):
        self.client = client

    async def infer(
        self, x: np.ndarray, parameters: dict[str, Any]
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        probs = logits_tensor(await self.client.predict(x)).softmax(dim=-1).numpy()
        return {"class": probs.argmax(axis=1).astype(np.int64), "probabilities": probs}, {}


@serve.deployment
@serve.ingress(http.app)
class V2Ingress(grpc_v2.GrpcV2Methods):
    """Validates requests, checks the token, and hands each to its model or router."""

    async def __init__(
        self, args: ServeArgs, handles: dict[str, DeploymentHandle], infos: dict[str, ModelInfo]
    ):
        self.args, self.infos = args, infos
        self.token = http.read_token(args.auth)
        self.handles = handles
        metrics = RoutingMetrics()
        self.metrics = metrics
        # One coalescing client per model deployment, shared by everything in this replica that calls
        # it; the models that run in this replica are called in place.
        clients = {
            name: CoalescingClient(handle, args.limits.max_batch_size) for name, handle in handles.items()
        }
        clients |= {m.name: InIngressModel(m) for m in args.models if m.in_ingress}
        self.answers: dict[str, Answers] = {m.name: PlainModel(clients[m.name]) for m in args.models}
        models = ServedModels(handles, clients, infos)
        self.answers |= {r.name: build_router(r, models, metrics) for r in args.routers}
        self.completers = {name: a for name, a in self.answers.items() if isinstance(a, openai.CompletesText)}
        http.document_served_names(sorted(infos))
        await self._first_calls()

    async def _first_calls(self) -> None:
        """One row through every model deployment this replica calls, before it takes requests.

        A handle's first call sets up its routing to the deployment's replicas, and a replica's first
        forward pass its kernels: seconds on a loaded node. Served requests would pay that, and an
        MoE router would count an expert slower than ``expert_timeout_s`` as down (CI once answered
        the first MoE request after ``serving`` with 503, every expert down). The replica is not
        running until these return, so neither the app's RUNNING status nor a request waits on them.
        """
        await asyncio.gather(
            *(
                predict(handle, np.zeros((1, self.infos[name].input_dim), np.float32))
                for name, handle in self.handles.items()
            )
        )

    @http.app.get("/v2")
    def server_metadata(self) -> dict:
        return {"name": "scaleforge", "version": scaleforge.__version__, "extensions": []}

    @http.app.get("/v2/health/live")
    def live(self) -> dict:
        return {"live": True}

    @http.app.get("/v2/health/ready")
    async def ready(self) -> JSONResponse:
        ready = all(await asyncio.gather(*(self._deployment_ready(h) for h in self.handles.values())))
        return JSONResponse({"ready": ready}, status_code=200 if ready else 503)

    @http.app.get("/v2/models/{name}")
    def metadata(self, name: str, request: Request) -> dict:
        self._authorize(request.headers.get("authorization"))
        info = self._info(name)
        return model_metadata(name, info)

    @http.app.get("/v2/models/{name}/ready")
    async def model_ready(self, name: str, request: Request) -> JSONResponse:
        self._authorize(request.headers.get("authorization"))
        self._info(name)
        ready = await self._models_ready(name)
        return JSONResponse({"name": name, "ready": ready}, status_code=200 if ready else 503)

    async def _models_ready(self, name: str) -> bool:
        return all(
            await asyncio.gather(
                *(self._deployment_ready(self.handles[m]) for m in self._models_of(name) if m in self.handles)
            )
        )  # the others run in this replica

    @http.app.post(
        "/v2/models/{name}/infer",
        openapi_extra={
            "requestBody": {"required": True, "content": {"application/json": {"schema": http.INFER_SCHEMA}}}
        },
    )
    async def infer(self, name: str, request: Request) -> Response:
        status = "500"
        try:
            response = await self._infer(name, request)
            status = "200"
            return response
        except ProtocolError as err:
            status = str(err.status)
            raise
        finally:  # every answer counts, refusals too (an unknown name is counted as "unknown": bounded tags)
            self.metrics.requests.inc(
                tags={"model": name if name in self.infos else "unknown", "status": status}
            )

    async def _infer(self, name: str, request: Request) -> Response:
        began = time.perf_counter()
        self._authorize(request.headers.get("authorization"))
        info = self._info(name)
        body = await http.read_body(request, self.args.limits.max_body_bytes)
        parsed = parse_infer_request(
            body, info.input_dim, self.args.limits.max_batch_size, request.headers.get(binary.HEADER)
        )
        called = time.perf_counter()
        answer = await self._answer(name, parsed)
        answered = time.perf_counter()
        response = render(answer, parsed)
        response.headers[SERVER_TIMING] = server_timing(
            ingress=time.perf_counter() - began, model=answered - called
        )
        return response

    async def _answer(self, name: str, parsed: ParsedRequest) -> dict[str, Any]:
        """The infer response of the model or router ``name`` to a checked request."""
        try:
            outputs, summary = await self.answers[name].infer(parsed.x, parsed.parameters)
        except (BackPressureError, RayActorError, ReplicaUnavailableError) as err:
            raise ProtocolError(
                503, f"model '{name}' is overloaded or unavailable ({type(err).__name__}); retry later"
            ) from None
        return infer_response(name, parsed.id, outputs, parsed.outputs, summary)

    @http.app.get("/v1/models")
    def openai_models(self, request: Request) -> Response:
        """The served names that complete text (OpenAI's ``GET /v1/models``)."""
        try:
            self._authorize(request.headers.get("authorization"))
        except ProtocolError as err:
            return openai.OpenAIError(err.status, err.message).response()
        return JSONResponse(openai.list_models(sorted(self.completers)))

    @http.app.get("/v1/models/{name}")
    def openai_model(self, name: str, request: Request) -> Response:
        """One completer, with what its engine is doing (running and waiting sequences, batch sizes)."""
        try:
            self._authorize(request.headers.get("authorization"))
            completer = self._completer(name)
        except (ProtocolError, openai.OpenAIError) as err:
            return openai.as_openai_error(err).response()
        return JSONResponse(openai.describe(name, completer.engine))

    @http.app.post(
        "/v1/completions",
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": http.COMPLETION_SCHEMA}},
            }
        },
    )
    async def completions(self, request: Request) -> Response:
        """OpenAI's completions: text from a completer, whole or streamed as server-sent events."""
        name = "unknown"
        try:
            self._authorize(request.headers.get("authorization"))
            body = openai.parse_completion(await http.read_body(request, self.args.limits.max_body_bytes))
            completer = self._completer(body.model)
            name = body.model
            response = await openai.Completion(name, completer, body, self.metrics).response()
            status = "200"
        except (ProtocolError, openai.OpenAIError) as err:
            response = openai.as_openai_error(err).response()
            status = str(err.status)
        self.metrics.requests.inc(tags={"model": name, "status": status})
        return response

    def _completer(self, name: str) -> "openai.CompletesText":
        if name not in self.completers:
            served = ", ".join(sorted(self.completers)) or "none"
            raise openai.OpenAIError(
                404, f"model '{name}' is not a completer here; served: {served}", "model", "model_not_found"
            )
        return self.completers[name]

    def _info(self, name: str) -> ModelInfo:
        if name not in self.infos:
            raise ProtocolError(404, f"unknown model '{name}'; served: {', '.join(sorted(self.infos))}")
        return self.infos[name]

    def _models_of(self, name: str) -> list[str]:
        router = self.args.router(name)
        return router.models() if router else [name]

    def _authorize(self, authorization: Optional[str]) -> None:
        """``authorization``: the request's ``Authorization`` header (gRPC: its call metadata)."""
        http.authorize(self.token, authorization)

    @staticmethod
    async def _deployment_ready(handle: DeploymentHandle) -> bool:
        try:
            return await asyncio.wait_for(handle.ready.remote(), timeout=2.0)
        except Exception:  # noqa: BLE001 - any failure means "not ready", which is the answer asked for
            return False
