"""``--ray-address ADDR`` on ``run``, ``sweep`` and ``tune``: the Ray instance the ``ray`` pipeline (and a command's
own ``ray.init()`` under ``run --``) uses, in place of ``RAY_ADDRESS``.

The flag is checked twice before anything runs: its form when parsed (``host:port``, ``ray://host:port`` or
``auto``), and that ``host:port`` takes a connection, so a typo is one line and exit 2, not Ray's minutes of
retries in the middle of a sweep. The value is then put in this process's ``RAY_ADDRESS``: the pipeline reads it
there, and a command started by ``run --`` inherits it.
"""

from __future__ import annotations

import argparse
import os
import re

from profiler.cli.common import BadInput

ENV = "RAY_ADDRESS"
FLAG = "--ray-address"
ALLOWED = "host:port (the head node's GCS port, e.g. 10.0.0.5:6379), ray://host:port or auto"
_HOST_PORT = re.compile(r"^(ray://)?(?P<host>[A-Za-z0-9._-]+|\[[0-9A-Fa-f:]+\]):(?P<port>[0-9]{1,5})$")


def ray_address(text: str) -> str:
    """An argparse ``type``: the address unchanged, else one line naming what is allowed."""
    value = text.strip()
    if value == "auto":
        return value
    m = _HOST_PORT.match(value)
    if m is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a Ray address: allowed {ALLOWED}")
    if not 1 <= int(m["port"]) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: port {m['port']} is out of range: allowed 1..65535")
    return value


def add_ray_address(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        FLAG,
        type=ray_address,
        metavar="ADDR",
        help=f"the Ray instance of --pipeline ray (and of a command's ray.init()): {ALLOWED}; overrides {ENV} "
        "(default: $RAY_ADDRESS, else a local instance started for each run)",
    )


def apply_ray_address(args: argparse.Namespace) -> None:
    """Put ``--ray-address`` in ``RAY_ADDRESS`` once it takes a connection: BadInput (one line) when it does not."""
    address = getattr(args, "ray_address", None)
    if address is None:
        return
    from pipelines.ray_data import RayUnavailable, reachable

    try:
        reachable(address, via=FLAG)
    except RayUnavailable as exc:
        raise BadInput(str(exc)) from None
    os.environ[ENV] = address
