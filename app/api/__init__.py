"""The OpenAI-compatible HTTP API: ``GET /v1/models[/{id}]``, ``POST /v1/chat/completions``, ``POST /v1/completions``,
``POST /v1/responses``, ``GET /health`` (and ``POST /v1/embeddings``: a 501 saying ppd serves none).

One job: turn OpenAI requests into ``Engine.stream`` calls and the answers back into OpenAI's JSON and server-sent
events. ``ppd serve`` runs it alone (``create_api``); ``ppd chat`` puts its routes (``api_routes``) in front of the
Gradio app's, on one server, so the page and the API share one model and one ``ModelHost.queue``: an API answer
waits for a page's answer and the other way round.

API answers never reuse the KV cache (``reuse_cache=False``): each request prefills its whole conversation into a
cache of its own, so the UI's kept cache for its next turn stays valid.

A request is validated and tokenized off the event loop (``jobs``), then takes a place in ``ModelHost``'s line for
the model (a full line: 503 with ``Retry-After``) and decodes on a worker of a fixed pool (one worker per place in
line), through ``ModelHost.decode`` (``decoding``); its events go out streamed or whole (``answers``).

    schemas    the requests, and the Job and Outcome they become     responses  OpenAI's JSON shapes
    messages   a chat's messages, checked                            answers    streamed and whole answers
    jobs       a request made a Job                                  errors     OpenAI-shaped errors, the body limit
    decoding   a Job decoded on a worker; the one event iterator     routes     the router and /health
    prompts    a completion's prompt (ids, echo, fill-in-the-middle) responses_request / responses_answer: the
                                                                     Responses API made a chat request, and back
"""

from __future__ import annotations

from functools import partial

from fastapi import FastAPI
from starlette.routing import Mount, Route

from app.api.decoding import ApiState
from app.api.errors import BodyLimit, add_error_handlers
from app.api.routes import health, infill_router, v1_app
from app.model_host import ModelHost


def api_routes(service: ModelHost, api_key: str | None = None) -> list:
    """``/health`` and ``/v1`` (its requests need ``Authorization: Bearer <api_key>`` when a key is set), for
    ``ppd chat`` to put in front of the Gradio app's routes."""
    return routes_of(ApiState(service, api_key))


def routes_of(state: ApiState) -> list:
    return [Route("/health", partial(health, state), methods=["GET"]), Mount("/v1", app=BodyLimit(v1_app(state))),
            Route("/infill", BodyLimit(v1_app(state, infill_router)), methods=["POST"])]  # llama-server's, for editors


def create_api(service: ModelHost, api_key: str | None = None) -> FastAPI:
    """``ppd serve``'s app: /health and /v1 (``app.state.ppd`` holds the finished jobs)."""
    state = ApiState(service, api_key)
    app = FastAPI(title="ppd", docs_url=None, redoc_url=None, openapi_url=None, routes=routes_of(state))
    app.state.ppd = state
    add_error_handlers(app)
    return app
