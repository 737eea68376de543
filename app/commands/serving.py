"""What `ppd chat` and `ppd serve` share: the line's and the guard's options, the API key, and the checks of the
host and port made before the model loads."""

from __future__ import annotations

import argparse
import errno
import ipaddress
import os
import socket
import sys

from ppd_core.errors import PpdError

API_KEY_ENV = "PPD_API_KEY"  # the OpenAI-compatible API's key, instead of --api-key


def add_queue_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-queue", type=int, default=8, metavar="N",
                        help="answers that may wait for the model behind the one running (default 8); beyond them an "
                        "API request gets 503 and a page a busy notice")


def add_guard_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--allow-host", action="append", default=None, metavar="NAME",
                        help="also answer requests whose Host is NAME (a name this server is reached by, e.g. behind a "
                        "proxy; patterns like *.lan; repeatable; default: $PPD_ALLOWED_HOSTS, comma-separated). Other "
                        "names than localhost and the --host address are refused: a page may be trying DNS rebinding")
    parser.add_argument("--allow-origin", action="append", default=None, metavar="ORIGIN",
                        help="let web pages from ORIGIN call this server (e.g. http://localhost:3000 for a chat "
                        "front-end; patterns like chrome-extension://*; repeatable; default: $PPD_ORIGINS, "
                        "comma-separated). Pages from other origins are refused")


def check_max_queue(args: argparse.Namespace) -> None:
    if args.max_queue < 0:
        raise PpdError(f"--max-queue must be 0 or more, got {args.max_queue}")


def is_loopback(host: str) -> bool:
    """Whether ``host`` only listens on this machine (127.0.0.0/8, ::1, or a name resolving only to those)."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise PpdError(f"--host {host} is not an address or a name this machine can resolve") from None
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


def api_key_of(args: argparse.Namespace) -> tuple[bool, str | None]:
    """Whether to serve the OpenAI-compatible API, and the key its requests need (None: no key).

    The rule of the chat login: --api-key (or $PPD_API_KEY) sets a key; without one, a non-loopback
    --host needs an explicit --no-auth. `ppd serve` refuses to start otherwise; `ppd chat` (whose
    --auth protects only the page) then serves the page without the API.
    """
    key = args.api_key if args.api_key is not None else (None if args.no_auth else os.environ.get(API_KEY_ENV) or None)
    if key is not None:
        if not key or not all("!" <= char <= "~" for char in key):  # what an Authorization header can carry
            raise PpdError("--api-key must be a non-empty key of printable ASCII characters without spaces "
                           "(clients cannot send others in a header)")
        return True, key
    if is_loopback(args.host):
        return True, None
    if args.no_auth:
        print(f"ppd: warning: serving the OpenAI-compatible API on {args.host} without a key (--no-auth): anyone who "
              "can reach it can use the model", file=sys.stderr)
        return True, None
    if args.command == "serve":
        raise PpdError(
            f"--host {args.host} serves beyond this machine: add --api-key KEY (or set {API_KEY_ENV}), "
            "or --no-auth to serve the API without a key"
        )
    print(f"ppd: note: the OpenAI-compatible API (/v1) is off: on --host {args.host} it needs --api-key KEY "
          f"(or {API_KEY_ENV})", file=sys.stderr)
    return False, None


def check_port_free(host: str, port: int) -> None:
    """Fail before the model loads if the server could not listen on ``host:port``.

    Binds like the server does (SO_REUSEADDR), on the host's address and, as Gradio also
    probes it, on 127.0.0.1.
    """
    if not 1 <= port <= 65535:
        raise PpdError(f"--port must be between 1 and 65535, got {port}")
    try:
        infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise PpdError(f"--host {host} is not an address or a name this machine can resolve") from None
    probes = [(host, infos[0][0], infos[0][4])]
    if infos[0][4][0] != "127.0.0.1":
        probes.append(("127.0.0.1", socket.AF_INET, ("127.0.0.1", port)))
    for name, family, address in probes:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as error:
                if error.errno == errno.EADDRINUSE:
                    raise PpdError(f"port {port} on {name} is already in use; pick another with --port") from None
                raise PpdError(f"cannot serve on {host}:{port} ({error.strerror or error})") from None


def guard_policy(args: argparse.Namespace):
    """Who may call the server (``app.guard``): its own page, and the hosts and origins the options allow."""
    from app.guard import HOSTS_ENV, ORIGINS_ENV, Policy, listed

    return Policy(args.host, listed(args.allow_host, HOSTS_ENV), listed(args.allow_origin, ORIGINS_ENV))


def url_host(host: str) -> str:
    """``host`` as a URL writes it (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
