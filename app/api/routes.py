"""The routes: ``/health``, and ``router``'s ``/v1`` (models, chat completions, completions), each reaching the
``ApiState`` of its server as ``request.app.state.ppd`` (``ppd_state``)."""

from __future__ import annotations

import hmac
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from app.api.answers import streamed, whole
from app.api.decoding import ApiState, Decoding
from app.api.errors import ApiError, add_error_handlers, not_ready, retry_header
from app.api.infill import InfillRequest, completion_request, infill_ids, streamed_infill, whole_infill
from app.api.jobs import make_job
from app.api.messages import encodable
from app.api.responses import model_card, unloaded_card
from app.api.responses_answer import streamed_response, whole_response
from app.api.responses_request import ResponsesRequest, chat_request
from app.api.schemas import ChatCompletionRequest, CompletionRequest
from app.model_catalog import available, public_name
from app.model_queue import Busy
from ppd_core import ModelSnapshot
from ppd_core.engine_load import live_llama_cpp_models
from ppd_core.errors import PpdError


def ppd_state(request: Request) -> ApiState:
    """The API state of the app the request reached (``/v1``'s own app)."""
    return request.app.state.ppd


async def authorize(request: Request) -> None:
    """With a key set, /v1 needs ``Authorization: Bearer <key>``."""
    api_key = ppd_state(request).api_key
    if api_key is None:
        return
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), api_key.encode()):
        raise ApiError("missing or wrong API key: send 'Authorization: Bearer <key>'", code="invalid_api_key",
                       status=401)


async def check_ready(request: Request) -> None:
    """503 with Retry-After while the model loads."""
    service = ppd_state(request).service
    if not service.ready:
        startup = service.startup
        raise ApiError(startup.line(), code="model_not_ready", status=503, kind="server_error",
                       headers=retry_header(service))


router = APIRouter(dependencies=[Depends(authorize), Depends(check_ready)])


def snapshot(state: ApiState) -> ModelSnapshot:
    """The loaded model; 503 (``model_not_ready``) while another one loads."""
    try:
        return state.service.snapshot()
    except PpdError as error:
        raise not_ready(state.service, error) from None


def loaded_ids(state: ApiState, loaded: ModelSnapshot) -> set[str]:
    """The ids that name the loaded model: its name, its spec, and the spec as listed (``public_name``)."""
    return {loaded.name, state.service.spec, public_name(state.service.spec)}


async def others(state: ApiState, loaded: ModelSnapshot) -> list[str]:
    """The ids of the models ppd could load instead (``model_catalog.available``; local ones by name only). A
    request naming one is refused (``model_not_loaded``); one naming anything else, a local path included, is
    answered by the loaded model, as llama-server answers any name."""
    specs = await run_in_threadpool(available, state.service.spec)  # reads the Hub cache: off the event loop
    names = dict.fromkeys(public_name(spec) for spec in specs if spec.isprintable())  # no undecodable file names
    return [name for name in names if name not in loaded_ids(state, loaded)]


@router.get("/models")
async def models(state: ApiState = Depends(ppd_state)):
    loaded = snapshot(state)
    return {"object": "list", "data": [model_card(loaded, state.service.spec, state.created)] + [
        unloaded_card(name, state.created) for name in await others(state, loaded)]}


@router.get("/models/{model_id:path}")
async def model(model_id: str, state: ApiState = Depends(ppd_state)):
    """The loaded model's card for its name, its spec (``default``, ``hf:...``) or its listed id; another listed
    model's (not loaded) card; else 404."""
    loaded = snapshot(state)
    if model_id in loaded_ids(state, loaded):
        return model_card(loaded, state.service.spec, state.created)
    if model_id in await others(state, loaded):
        return unloaded_card(model_id, state.created)
    raise ApiError(f"the model {model_id!r} does not exist; this server has {loaded.name!r}", "model",
                   "model_not_found", status=404)


@router.post("/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request):
    return await answer(body, request)


@router.post("/completions")
async def completions(body: CompletionRequest, request: Request):
    return await answer(body, request)


@router.post("/embeddings")
async def embeddings():
    """No embeddings: a clear 501 in OpenAI's shape (not a bare 404 that reads like a wrong base URL), which the
    ``openai`` client does not retry (``x-should-retry``)."""
    raise ApiError("ppd serves no embeddings: it answers /v1/chat/completions, /v1/completions and /v1/responses. "
                   "Use an embedding model's server (llama-server --embedding) for /v1/embeddings.",
                   code="embeddings_not_supported", status=501, kind="invalid_request_error",
                   headers={"x-should-retry": "false"})


@router.post("/responses")
async def responses(body: ResponsesRequest, request: Request):
    """OpenAI's Responses API: the request answered as the chat request it makes (``responses_request``)."""
    return await answer(chat_request(body), request, Shape(partial(whole_response, request=body),
                                                           partial(streamed_response, request=body), body.stream))


@dataclass
class Shape:
    """How an endpoint's answer goes out: whole (``(decoding, job, request)``) and streamed (``(decoding, job)``:
    server-sent events); ``stream``: which one, where the request is not the chat or completion request itself."""

    whole: Callable = whole
    streamed: Callable = streamed
    stream: bool | None = None


async def answer(body: ChatCompletionRequest | CompletionRequest, request: Request, shape: Shape = Shape()):
    """Any endpoint's answer, streamed or whole, in its ``shape``; every client mistake is a 400 here, before the
    model is asked; tokenizing is off the event loop."""
    state = ppd_state(request)
    loaded = snapshot(state)
    if body.model is not None and encodable(body.model, "model") not in loaded_ids(state, loaded) and \
            body.model in await others(state, loaded):
        raise ApiError(f"the model {body.model!r} is available but not loaded: this server answers with "
                       f"{loaded.name!r} (switch models on the page)", "model", "model_not_loaded")
    job = await run_in_threadpool(make_job, state.service, body)
    try:
        ticket = state.service.queue.join()
    except Busy as busy:
        raise ApiError(str(busy), code="server_busy", status=503, kind="server_error",
                       headers={"Retry-After": str(busy.retry_after)}) from None
    decoding = Decoding(state, job, ticket)
    if not (body.stream if shape.stream is None else shape.stream):
        return await shape.whole(decoding, job, request)
    # the background task runs when the response ends, also after a disconnect (even one before the first event,
    # when the generator's own ``finally`` never runs)
    return StreamingResponse(shape.streamed(decoding, job), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
                             background=BackgroundTask(decoding.cancel))


infill_router = APIRouter(dependencies=[Depends(authorize), Depends(check_ready)])


@infill_router.post("/infill")
async def infill(body: InfillRequest, request: Request):
    """llama-server's ``/infill`` (editors' fill-in-the-middle), in its own shapes (``infill``)."""
    state = ppd_state(request)
    snapshot(state)  # 503 while a model loads
    engine = state.service.engine
    ids = await run_in_threadpool(infill_ids, engine.tokenizer, body, engine.max_context)
    return await answer(completion_request(body, ids), request, Shape(whole_infill, streamed_infill, body.stream))


async def health(state: ApiState, _: Request) -> JSONResponse:
    """``/health``, as llama-server's: 503 while the model loads, else the model and the line for it."""
    service = state.service
    try:
        model = service.snapshot().name
    except PpdError:
        startup = service.startup
        return JSONResponse({"status": "error" if startup.error else "loading", "detail": startup.line()},
                            status_code=503, headers=retry_header(service))
    queue = service.queue
    return JSONResponse({"status": "ok", "model": model, "busy": queue.busy, "held_by": queue.holder,
                         "waiting": queue.waiting, "max_waiting": queue.max_waiting, "running": state.running,
                         "background": service.background,  # e.g. a first launch's calibration, with its progress
                         "calibration_paused_for": service.calibration_paused_for,  # calls it gave the model to
                         "llama_cpp_models": live_llama_cpp_models()})  # one while a GGUF is loaded: none leaked


def v1_app(state: ApiState, routes: APIRouter = router) -> FastAPI:
    """``/v1``: an app of its own, with ``router`` and its own error handlers (OpenAI's shape); with
    ``infill_router``, the app of llama-server's ``/infill``."""
    v1 = FastAPI(title="ppd", docs_url=None, redoc_url=None, openapi_url=None)
    v1.state.ppd = state
    v1.include_router(routes)
    add_error_handlers(v1)
    return v1
