"""One way to serve: ``ppd chat`` (page + API) and ``ppd serve`` (API alone) build their app here and run it the same.

    app = server_app(service, policy, page=build_app(service), api_key=key)   # the guard outermost
    Serving(app, host, port).run(load)   # listening at once, the model loading behind, Ctrl+C/SIGTERM within 2 s

The server listens before the model exists: the page shows the load, the API answers 503 with ``Retry-After``
(``app.api.routes.check_ready``) and ``/health`` says "loading"; a model without a profile for this device then
calibrates between answers (``ModelHost.calibrate_in_background``). Quitting (Ctrl+C, SIGTERM) stops every
answer at its next step (streams end with their last chunk), trainings where they are (resumable), a calibration
at its next step, then the server, whatever it was doing, within ``QUIT_SECONDS``.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from fastapi import FastAPI
from starlette.middleware import Middleware

from app.api import api_routes
from app.guard import LocalGuard, Policy
from app.model_host import ModelHost
from app.signals import sigterm_interrupts

if TYPE_CHECKING:
    from ppd_core import Engine

QUIT_SECONDS = 2.0  # Ctrl+C or SIGTERM to exit, at any moment (container runtimes wait 10 s before a kill)
SERVER_SECONDS = 1.2  # of which the server and its open connections get this much (uvicorn's graceful shutdown)
STOP_SECONDS = 0.8  # and, at the same time, answers, trainings and a calibration get this much to stop


def server_app(service: ModelHost, policy: Policy, *, page=None, auth=None, api_key: str | None = None,
               serve_api: bool = True) -> FastAPI:
    """The app: the guard around /health and /v1 (``serve_api``) and, for ``ppd chat``, the Gradio page ``page``
    mounted at / (its login ``auth`` guards only the page, the API has its key)."""
    app = FastAPI(title="ppd", docs_url=None, redoc_url=None, openapi_url=None,
                  routes=api_routes(service, api_key) if serve_api else [],
                  middleware=[Middleware(LocalGuard, policy=policy)])
    if page is not None:
        import gradio as gr

        gr.mount_gradio_app(app, page, "/", auth=auth, footer_links=[], ssr_mode=False)
    return app


class Serving:
    """A uvicorn server on a thread of its own, the model loading on the caller's, and a quick quit for both."""

    def __init__(self, app: FastAPI, host: str, port: int):
        self.server = make_server(app, host, port, graceful_seconds=SERVER_SECONDS - 0.2)
        self.thread = threading.Thread(target=self.server.run, name="ppd-server", daemon=True)

    def run(self, service: ModelHost, load: Callable[[Callable], Engine], ready: Callable[[], None]) -> None:
        """Listen, load the model (``load(progress)``), call ``ready``, then serve until Ctrl+C or SIGTERM (the normal
        way to stop a server: it returns) or until the server stops by itself."""
        self.thread.start()
        try:
            with sigterm_interrupts():
                self._wait_started()
                service.attach(service.startup.run(load))
                ready()
                while self.thread.is_alive():
                    self.thread.join(0.2)
        except KeyboardInterrupt:
            print("ppd: stopping", file=sys.stderr, flush=True)
        finally:
            deadline = time.monotonic() + SERVER_SECONDS
            self.server.should_exit = True  # no new connections; open ones get until the deadline
            service.shutdown(STOP_SECONDS)  # meanwhile answers end at their next step (streams get their last
            # chunk), trainings and a calibration stop
            self.thread.join(max(deadline - time.monotonic(), 0.0))

    def _wait_started(self) -> None:
        while not self.server.started:
            if not self.thread.is_alive():
                raise SystemExit("ppd: the server could not start (see above)")
            self.thread.join(0.02)


def make_server(app, host: str, port: int, graceful_seconds: float = 1.0):
    """A uvicorn server for ``app`` (``server.run()`` blocks; ``server.should_exit = True`` stops it, open
    connections getting ``graceful_seconds`` to finish)."""
    import uvicorn

    config = uvicorn.Config(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=graceful_seconds)
    return uvicorn.Server(config)
