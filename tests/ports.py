"""A free local port for a server a test starts."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port on 127.0.0.1 nothing listens on now (the OS's pick)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
