"""A local HTTP server speaking the Hugging Face Hub's file endpoints, for tests (``HF_ENDPOINT`` points at it).

Serves repositories held in memory: repository info, the file tree, and files with ``HEAD``, ``GET`` and byte
ranges; unknown repositories, gated ones and missing files answer as the Hub does (``X-Error-Code``). A file can
be cut off after some bytes on its first download, to test resuming.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeHub:
    def __init__(self):
        self.repos: dict[str, dict[str, bytes]] = {}
        self.gated: set[str] = set()
        self.cut_after: dict[str, int] = {}  # file name -> bytes sent before its first download is dropped
        self.hold: threading.Event | None = None  # a file's download waits until it is set (a slow download)
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range header)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def commit(self, repo: str) -> str:
        files = self.repos[repo]
        return hashlib.sha1(b"".join(name.encode() + hashlib.sha256(data).digest() for name, data in sorted(files.items()))).hexdigest()

    def _handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def do_HEAD(self):
                self._serve(body=False)

            def do_GET(self):
                self._serve(body=True)

            def _error(self, status: int, code: str, message: str) -> None:
                data = json.dumps({"error": message}).encode()
                self.send_response(status)
                self.send_header("X-Error-Code", code)
                self.send_header("X-Error-Message", message)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command == "GET":
                    self.wfile.write(data)

            def _json(self, value) -> None:
                data = json.dumps(value).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _repo(self, repo: str) -> bool:
                if repo not in hub.repos:
                    self._error(404, "RepoNotFound", f"Repository Not Found for url: {self.path}.")
                    return False
                if repo in hub.gated:
                    self._error(403, "GatedRepo", f"Access to model {repo} is restricted.")
                    return False
                return True

            def _serve(self, body: bool) -> None:
                path = self.path.split("?")[0]
                hub.requests.append((self.command, path, self.headers.get("Range")))
                if match := re.fullmatch(r"/api/models/([^/]+/[^/]+)/revision/([^/]+)", path):
                    repo = match[1]
                    if self._repo(repo):
                        files = hub.repos[repo]
                        self._json({"id": repo, "modelId": repo, "sha": hub.commit(repo), "private": False,
                                    "siblings": [{"rfilename": name} for name in sorted(files)]})
                elif match := re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)(/.*)?", path):
                    repo = match[1]
                    if self._repo(repo):
                        self._json([{"type": "file", "oid": hashlib.sha1(data).hexdigest(), "size": len(data), "path": name}
                                    for name, data in sorted(hub.repos[repo].items())])
                elif match := re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path):
                    repo, name = match[1], match[3]
                    if self._repo(repo):
                        self._file(repo, name, body)
                else:
                    self._error(404, "EntryNotFound", f"no route {path}")

            def _file(self, repo: str, name: str, body: bool) -> None:
                data = hub.repos[repo].get(name)
                if data is None:
                    self._error(404, "EntryNotFound", f"{name} does not exist on main")
                    return
                if body and hub.hold is not None:  # before the headers (a client's read timeout must allow for it)
                    hub.hold.wait(300)
                start = 0
                if ranged := re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or ""):
                    start = int(ranged[1])
                self.send_response(206 if start else 200)
                self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
                self.send_header("X-Repo-Commit", hub.commit(repo))
                self.send_header("Content-Length", str(len(data) - start))
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.send_header("Accept-Ranges", "bytes")
                self.end_headers()
                if not body:
                    return
                cut = hub.cut_after.pop(name, None)
                if cut is not None:  # the first download of this file breaks off
                    self.wfile.write(data[start : start + cut])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                self.wfile.write(data[start:])

        return Handler
