"""The ingress's HTTP side that is not a route: the FastAPI app (its OpenAPI schema listing the V2 tensor
models and the served names), the refusal handler, the body reader with its size limit, and the bearer
token. ``serving.ingress`` declares the routes on :data:`app`."""

import hmac
import os
from pathlib import Path
from typing import Optional

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

import scaleforge
from scaleforge.config.serve import AuthSpec
from scaleforge.serving_contract import ProtocolError
from serving.openai import CompletionRequest
from serving.protocol import InferRequest


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refusing (413) anything over ``limit`` bytes before reading it all."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ProtocolError(
            413, f"request body of {int(declared):,} bytes exceeds the limit of {limit:,} bytes"
        )
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ProtocolError(413, f"request body exceeds the limit of {limit:,} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def read_token(auth: AuthSpec) -> Optional[str]:
    """The expected bearer token, from the replica's environment or a file (None: auth off)."""
    if auth.token_env:
        token = os.environ.get(auth.token_env)
        if not token:
            raise RuntimeError(
                f"auth.token_env: environment variable {auth.token_env} is not set in the replica "
                "(set it in the app's runtime_env.env_vars)"
            )
        return token
    if auth.token_file:
        path = Path(auth.token_file).expanduser()
        if not path.is_file():
            raise RuntimeError(f"auth.token_file: {path} does not exist")
        token = path.read_text().strip()
        if not token:
            raise RuntimeError(f"auth.token_file: {path} is empty")
        return token
    return None


app = FastAPI(
    title="scaleforge inference",
    version=scaleforge.__version__,
    description="Open Inference Protocol (KServe V2) over HTTP: plain models and routers over them.",
)


# The infer route reads the raw body (to enforce the size limit before parsing), so its request
# schema is declared by hand; the tensor models it refers to go into the OpenAPI components.
INFER_SCHEMA = InferRequest.model_json_schema(ref_template="#/components/schemas/{model}")
COMPLETION_SCHEMA = CompletionRequest.model_json_schema(ref_template="#/components/schemas/{model}")
INFER_DEFS = INFER_SCHEMA.pop("$defs") | COMPLETION_SCHEMA.pop("$defs")


def _openapi_with_tensor_schemas() -> dict:
    if app.openapi_schema is None:
        FastAPI.openapi(app).setdefault("components", {}).setdefault("schemas", {}).update(INFER_DEFS)
    return app.openapi_schema


app.openapi = _openapi_with_tensor_schemas


def document_served_names(names: list[str]) -> None:
    """List this app's served names in the OpenAPI ``{name}`` parameter (clients and fuzzers see what
    exists)."""
    for operations in app.openapi()["paths"].values():
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                if parameter["in"] == "path" and parameter["name"] == "name":
                    parameter["schema"]["enum"] = names


@app.exception_handler(ProtocolError)
async def _protocol_error(request: Request, err: ProtocolError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if err.status == 401 else None
    return JSONResponse({"error": err.message}, status_code=err.status, headers=headers)


def authorize(token: Optional[str], authorization: Optional[str]) -> None:
    """Refuse (401) unless ``authorization`` (a request's ``Authorization`` header, or gRPC call metadata)
    carries ``token``; anything goes when ``token`` is None (auth off)."""
    if token is None:
        return
    scheme, _, supplied = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not supplied:
        raise ProtocolError(401, "missing bearer token (send 'Authorization: Bearer <token>')")
    if not hmac.compare_digest(supplied.strip().encode(), token.encode()):
        raise ProtocolError(401, "invalid bearer token")
