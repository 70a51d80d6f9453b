"""``[ADDR:]PORT`` endpoints (``--prometheus``, ``--rdzv-endpoint``): parsed without importing anything heavy
(argparse calls it for ``--help`` and bad input alike); ``--prometheus`` binds to localhost unless an address is
given."""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_HOST = "127.0.0.1"
MAX_PORT = 65535
_ENDPOINT = re.compile(r"(?:(?P<host>\[[^\]]*\]|[^:\[\]]*):)?(?P<port>[^:]*)")


@dataclass(frozen=True, slots=True)
class Endpoint:
    host: str
    port: int  # 0: a free port chosen when binding

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse_endpoint(text: str, *, default_host: str | None = DEFAULT_HOST, min_port: int = 0) -> Endpoint:
    """``PORT``, ``ADDR:PORT`` or ``[IPv6]:PORT``, the port in ``min_port``..65535; ValueError (one line naming the
    value and what is allowed) otherwise. ``default_host`` None: the address is required (``HOST:PORT``, read as
    torch's rendezvous reads it: the last colon starts the port, so a bare IPv6 address passes too)."""
    if default_host is None:
        host, sep, port_text = text.rpartition(":")
        if not sep or not host or not _digits(port_text) or not min_port <= int(port_text) <= MAX_PORT:
            raise ValueError(f"{text!r}: allowed HOST:PORT with a port in {min_port}-{MAX_PORT}")
        bracketed = len(host) > 1 and host[0] == "[" and host[-1] == "]"
        return Endpoint(host[1:-1] if bracketed else host, int(port_text))
    free = " (0: any free port)" if min_port == 0 else ""
    allowed = f"allowed PORT or ADDR:PORT, PORT {min_port}..{MAX_PORT}{free}, e.g. 9464 or 0.0.0.0:9464"
    m = _ENDPOINT.fullmatch(text.strip())
    if m is None or not _digits(m["port"]):
        raise ValueError(f"{text!r} is not [ADDR:]PORT: {allowed}")
    port = int(m["port"])
    if not min_port <= port <= MAX_PORT:
        raise ValueError(f"{text!r}: port {port} is out of range: {allowed}")
    host = (m["host"] or "").strip("[]") if m["host"] is not None else default_host
    if not host:
        raise ValueError(f"{text!r} has an empty address: {allowed}")
    return Endpoint(host, port)


def _digits(text: str) -> bool:
    return text.isascii() and text.isdigit()
