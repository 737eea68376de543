"""The real ``ppd serve`` app (uvicorn on a thread, as ``ppd serve`` runs it) on the default GGUF, with a context of
``CONTEXT`` tokens so that a prompt can fill it in a second or two, for the client-library tests (import the fixture
``client_server`` into a test module)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from app.api import create_api
from app.model_host import ModelHost
from ppd_core import Engine, EngineConfig
from test_api import start

CONTEXT = 1024
TIMEOUT = 60  # seconds a client waits for one answer: no test may hang


@dataclass
class Served:
    url: str  # http://127.0.0.1:PORT (the API is under /v1)
    service: ModelHost
    app: object

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"


@pytest.fixture(scope="module")
def client_server():
    engine = Engine.load(EngineConfig(model="default", device="cpu", tree="small", threads=1, max_context=CONTEXT))
    service = ModelHost(engine)
    app = create_api(service)
    server, thread, port = start(app, "127.0.0.1")
    yield Served(f"http://127.0.0.1:{port}", service, app)
    server.should_exit = True
    thread.join(15)
    engine.close()
