"""Who may talk to a ppd server: an ASGI middleware that checks every request's ``Host`` and ``Origin``.

A server on 127.0.0.1 is reachable by every web page the user opens, not only by the user: another local dev
server's page can call it (``Origin: http://localhost:9999``), and a public site can point its own name at
127.0.0.1 (DNS rebinding, ``Host: attacker.example``) and read the answers. Ollama closed the same door with the
same two checks:

- ``Host`` must name this server: ``localhost`` (and ``*.localhost``), a loopback address, the address it is bound
  to, or a name allowed with ``--allow-host`` / ``$PPD_ALLOWED_HOSTS``. On a wildcard address (0.0.0.0, ::) any IP
  literal and this machine's own names pass too: an IP literal cannot be rebound. Anything else is 403.
- A browser's ``Origin`` must be the server's own (the same host and port as ``Host``) or one allowed with
  ``--allow-origin`` / ``$PPD_ORIGINS`` (shell-style patterns, e.g. ``chrome-extension://*``). A request from any
  other origin, the preflight included, is 403: no CORS grant, no call run. Clients that send no ``Origin`` (curl,
  the ``openai`` client, scripts) are not browsers and pass.

An allowed origin gets CORS: its preflight is answered here (204), its responses carry
``Access-Control-Allow-Origin``.

Every response also forbids framing (``X-Frame-Options: DENY``, CSP ``frame-ancestors 'none'``): another page
cannot show ppd's page in a frame and trick a click through it (clickjacking). The page frames nothing of its own.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import json
import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

HOSTS_ENV = "PPD_ALLOWED_HOSTS"
ORIGINS_ENV = "PPD_ORIGINS"
LOCAL_NAMES = ("localhost",)
WILDCARDS = ("0.0.0.0", "::", "")
DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
FRAME_HEADERS = [(b"x-frame-options", b"DENY"), (b"content-security-policy", b"frame-ancestors 'none'")]
PREFLIGHT_HEADERS = [(b"access-control-allow-methods", b"GET, POST, OPTIONS"), (b"access-control-max-age", b"600"),
                     (b"vary", b"Origin")]


def listed(values: Iterable[str] | None, env: str) -> list[str]:
    """The option's values, or else the environment's comma-separated list; blanks dropped."""
    values = list(values or []) or os.environ.get(env, "").split(",")
    return [value.strip() for value in values if value.strip()]


def split_host(host: str) -> tuple[str, int | None]:
    """``"[::1]:8000"`` -> ``("::1", 8000)``; ``"Example.COM."`` -> ``("example.com", None)``."""
    host = host.strip().lower()
    if host.startswith("["):
        name, _, rest = host[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif host.count(":") == 1:
        name, _, port = host.partition(":")
    else:  # a bare name, or a bare IPv6 address
        name, port = host, ""
    return name.rstrip("."), int(port) if port.isdigit() else None


def ip_of(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name.split("%")[0])
    except ValueError:
        return None


@dataclass
class Policy:
    """What the guard lets in; ``bound`` is the address the server listens on (``--host``)."""

    bound: str
    hosts: list[str] = field(default_factory=list)  # more names allowed in Host (exact, or patterns like *.lan)
    origins: list[str] = field(default_factory=list)  # browser origins allowed besides the server's own

    def __post_init__(self):
        self.bound = split_host(self.bound)[0]
        self.hosts = [split_host(host)[0] for host in self.hosts]
        self.origins = [origin.rstrip("/").lower() for origin in self.origins]
        self.wildcard = self.bound in WILDCARDS
        self.own_names = {socket.gethostname().lower(), socket.getfqdn().lower()} if self.wildcard else set()

    def host_allowed(self, host: str) -> bool:
        name, _ = split_host(host)
        address = ip_of(name)
        if name in LOCAL_NAMES or name.endswith(".localhost") or name == self.bound:
            return True
        if address is not None and (address.is_loopback or self.wildcard):
            return True
        return name in self.own_names or any(fnmatch.fnmatchcase(name, pattern) for pattern in self.hosts)

    def origin_allowed(self, origin: str, host: str, scheme: str) -> bool:
        """The server's own origin (same host and port as the request's Host), or one the options allow."""
        origin = origin.strip().rstrip("/").lower()
        if any(fnmatch.fnmatchcase(origin, pattern) for pattern in self.origins):
            return True
        parts = urlsplit(origin)
        if parts.scheme not in DEFAULT_PORTS or not parts.hostname:
            return False  # "null" (a sandboxed frame, a file), an extension, anything odd
        try:
            origin_port = parts.port or DEFAULT_PORTS[parts.scheme]
        except ValueError:
            return False
        name, port = split_host(host)
        return (parts.hostname.rstrip("."), origin_port) == (name, port or DEFAULT_PORTS.get(scheme, 80))

    def granted(self, origin: str) -> bool:
        """Whether ``origin`` gets CORS headers (an allowed foreign origin; the own one needs none)."""
        origin = origin.strip().rstrip("/").lower()
        return any(fnmatch.fnmatchcase(origin, pattern) for pattern in self.origins)


class LocalGuard:
    """ASGI middleware enforcing ``Policy`` on every HTTP request and websocket of the app it wraps."""

    def __init__(self, app, policy: Policy):
        self.app, self.policy = app, policy

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        if scope["type"] == "http":
            send = unframed(send)
        headers = {key.decode("latin-1"): value.decode("latin-1") for key, value in scope["headers"]}
        host, origin = headers.get("host"), headers.get("origin")
        refusal = self.refusal(host, origin, scope.get("scheme", "http"))
        if refusal is not None:
            if scope["type"] == "websocket":
                return await send({"type": "websocket.close", "code": 1008, "reason": refusal[:120]})
            return await forbidden(send, refusal)
        if origin is None or not self.policy.granted(origin):
            return await self.app(scope, receive, send)
        if scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
            return await preflight(send, origin, headers.get("access-control-request-headers"))
        await self.app(scope, receive, with_grant(send, origin))

    def refusal(self, host: str | None, origin: str | None, scheme: str) -> str | None:
        """Why the request is refused, in one line; None where it may go on."""
        if host is not None and not self.policy.host_allowed(host):
            return (f"the Host {host!r} is not this server's: a page may be trying DNS rebinding. Reach ppd as "
                    f"localhost or 127.0.0.1, or allow the name with --allow-host NAME (or ${HOSTS_ENV})")
        if origin is not None and not self.policy.origin_allowed(origin, host or "", scheme):
            return (f"requests from the web page at {origin!r} are refused: only ppd's own page may call it. Allow "
                    f"that origin with --allow-origin ORIGIN (or ${ORIGINS_ENV})")
        return None


async def forbidden(send, message: str) -> None:
    body = json.dumps({"error": {"message": message, "type": "forbidden", "param": None, "code": "forbidden"}}).encode()
    await send({"type": "http.response.start", "status": 403,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def preflight(send, origin: str, requested: str | None) -> None:
    headers = [(b"access-control-allow-origin", origin.encode("latin-1")), *PREFLIGHT_HEADERS]
    if requested:
        headers.append((b"access-control-allow-headers", requested.encode("latin-1")))
    await send({"type": "http.response.start", "status": 204, "headers": headers})
    await send({"type": "http.response.body", "body": b""})


def unframed(send):
    """``send`` with ``FRAME_HEADERS`` added to the response's start: no page may frame this one."""

    async def sending(message):
        if message["type"] == "http.response.start":
            kept = [(key, value) for key, value in message.get("headers", []) if key.lower() != b"x-frame-options"]
            message = {**message, "headers": kept + FRAME_HEADERS}
        await send(message)

    return sending


def with_grant(send, origin: str):
    """``send`` with the allowed origin's CORS headers added to the response's start."""

    async def granting(message):
        if message["type"] == "http.response.start":
            kept = [(key, value) for key, value in message.get("headers", [])
                    if not key.lower().startswith(b"access-control-allow-origin")]
            message = {**message, "headers": kept + [(b"access-control-allow-origin", origin.encode("latin-1")),
                                                     (b"vary", b"Origin")]}
        await send(message)

    return granting
