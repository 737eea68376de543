"""The API's errors, all in OpenAI's shape: ``ApiError`` (what a route raises), the app's handlers, and the body
limit in front of /v1."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.model_host import ModelChanged, ModelHost
from ppd_core import GrammarError
from ppd_core.errors import PpdError

MAX_BODY_BYTES = 1 << 20  # request bodies beyond 1 MB are refused with 413
DRAIN_BYTES = 16 << 20  # an oversized body is read (and dropped) up to this much before the 413, so the client sees it


class ApiError(Exception):
    """A request the client must fix (400), a missing key (401), or a full line (503): OpenAI's error shape."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None, status: int = 400,
                 kind: str = "invalid_request_error", headers: dict | None = None):
        super().__init__(message)
        self.message, self.param, self.code, self.status, self.kind = message, param, code, status, kind
        self.headers = headers


def not_ready(service: ModelHost, error: PpdError) -> ApiError:
    """The 503 for a model that is loading (``NotReady``), with Retry-After while retrying can help."""
    return ApiError(str(error), code="model_not_ready", status=503, kind="server_error", headers=retry_header(service))


def retry_header(service: ModelHost) -> dict:
    """Retry-After while the model loads; none after a failed load (retrying will not help)."""
    refusal = service.startup.refusal()
    return {"Retry-After": str(refusal.retry_after)} if refusal.retry_after else {}


def failure(error: BaseException, grammar_param: str | None = None) -> ApiError:
    """An answer that failed on the model's side: a refusal in one line (the model was switched while the request
    waited: 503, ask again; the request's grammar, ``grammar_param``, left no token to go on with: 400), else a bug
    (500, its type only)."""
    if isinstance(error, ModelChanged):
        return ApiError(str(error), code="model_changed", status=503, kind="server_error", headers={"Retry-After": "1"})
    if isinstance(error, GrammarError):
        return ApiError(f"{grammar_param or 'the grammar'}: {error}", grammar_param, "grammar_dead_end")
    return ApiError(f"ppd failed while answering: {type(error).__name__}", status=500, kind="server_error")


def error_response(status: int, message: str, param: str | None = None, code: str | None = None,
                   kind: str = "invalid_request_error", headers: dict | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    headers = {"WWW-Authenticate": "Bearer", **(headers or {})} if status == 401 else headers
    return JSONResponse(body, status_code=status, headers=headers)


def add_error_handlers(app: FastAPI) -> None:
    """Every error in OpenAI's shape; FastAPI's validation errors (422) become 400s."""

    @app.exception_handler(ApiError)
    async def api_error(_: Request, error: ApiError):
        return error_response(error.status, error.message, error.param, error.code, error.kind, error.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, error: RequestValidationError):
        first = (error.errors() or [{}])[0]
        if first.get("type") == "json_invalid":
            reason = (first.get("ctx") or {}).get("error", "")
            return error_response(400, f"the request body is not valid JSON ({reason})".replace(" ()", ""), code="invalid_json")
        param = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in first.get("loc", ())[1:]).lstrip(".")
        message = first.get("msg", "invalid request")
        return error_response(400, f"{param or 'the request body'}: {message}", param or None)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, error: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(error.status_code)
        return error_response(error.status_code, str(error.detail), code=code)

    @app.exception_handler(Exception)
    async def server_error(_: Request, error: Exception):  # a bug: still an OpenAI-shaped answer
        return error_response(500, f"ppd failed while answering: {type(error).__name__}", kind="server_error")


class BodyLimit:
    """ASGI middleware: a request body over ``limit`` bytes is answered 413 in OpenAI's shape before any route
    parses it (declared by Content-Length or counted as it arrives); smaller bodies are passed on whole."""

    def __init__(self, app, limit: int = MAX_BODY_BYTES):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length", b"")
        chunks, size, more = [], 0, True
        while more and size <= DRAIN_BYTES:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            size += len(message.get("body", b""))
            if size <= self.limit:
                chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        if size > self.limit or (declared.isdigit() and int(declared) > self.limit):
            refusal = error_response(413, f"the request body is {size:,} bytes; the limit is {self.limit:,}",
                                     code="request_too_large")
            return await refusal(scope, receive, send)
        body, replayed = b"".join(chunks), False

        async def replay():  # the body once, then the client's own messages (a disconnect)
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)
