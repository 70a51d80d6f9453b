"""``[ADDR:]PORT`` of ``--prometheus``: parsed without importing anything heavy (argparse calls it for ``--help``
and bad input alike), bound to localhost unless an address is given."""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_HOST = "127.0.0.1"
_ENDPOINT = re.compile(r"(?:(?P<host>\[[^\]]*\]|[^:\[\]]*):)?(?P<port>[^:]*)")


@dataclass(frozen=True, slots=True)
class Endpoint:
    host: str
    port: int  # 0: a free port chosen when binding

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse_endpoint(text: str) -> Endpoint:
    """``PORT``, ``ADDR:PORT`` or ``[IPv6]:PORT``; ValueError (one line naming the value) otherwise."""
    allowed = "allowed PORT or ADDR:PORT, PORT 0..65535 (0: any free port), e.g. 9464 or 0.0.0.0:9464"
    m = _ENDPOINT.fullmatch(text.strip())
    if m is None or not m["port"].isdigit():
        raise ValueError(f"{text!r} is not [ADDR:]PORT: {allowed}")
    port = int(m["port"])
    if port > 65535:
        raise ValueError(f"{text!r}: port {port} is out of range: {allowed}")
    host = (m["host"] or "").strip("[]") if m["host"] is not None else DEFAULT_HOST
    if not host:
        raise ValueError(f"{text!r} has an empty address: {allowed}")
    return Endpoint(host, port)
