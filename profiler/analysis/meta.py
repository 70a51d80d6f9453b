"""Typed reads of stored JSON objects: a run's meta dict, a summary.json, a rank's exit record.

What ``json.loads`` gives is ``object``; these helpers narrow one value to the type a figure needs, and a
value of another type reads as missing (None, or an empty object / list), never as a wrong figure.
"""

from __future__ import annotations

JSON = dict[str, object]  # a JSON object as json.loads gives it
# a run's meta ``mode``: a script stallscope launched and timed through its start-up module (zerocode/instrument)
AUTO_INSTRUMENTED = "auto-instrumented"
Scalar = str | int | float | None  # what a config fact or a JSON leaf is


def as_json(value: object) -> JSON:
    """``value`` when it is a JSON object, else an empty one (a stored dict that may be missing or null)."""
    return value if isinstance(value, dict) else {}


def as_list(value: object) -> list[object]:
    """``value`` when it is a JSON array, else an empty one."""
    return value if isinstance(value, list) else []


def objects(value: object) -> list[JSON]:
    """The JSON objects in ``value`` when it is an array (its other elements are skipped)."""
    return [v for v in as_list(value) if isinstance(v, dict)]


def opt_str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def opt_int(value: object) -> int | None:
    """An int (not a bool: JSON's true is no count), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def opt_float(value: object) -> float | None:
    """A number as a float (not a bool), else None."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def opt_bool(value: object) -> bool | None:
    return value if isinstance(value, bool) else None
