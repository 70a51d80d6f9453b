"""A run's Summary and Timeline to plain JSON values and back, exactly: what ``report`` reads instead of the
run's rows once the run has closed (docs/store.md, "The report cache").

Pure: values in, values out. Invariants:
- Round trip: ``decode(encode(x), root)`` equals ``x`` field by field (NaN stays NaN, tuples stay tuples, dicts
  keep their keys and order).
- Only the dataclasses reachable from the root type's own type hints are made (:func:`allowed`): a document
  cannot name any other class. Anything else it holds is a JSON value.
- A document that does not fit today's classes (a field renamed, a type changed) raises :class:`CodecError`; the
  caller then summarises the rows again.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

TYPE_KEY = "__t"
TUPLE_KEY = "__tuple"
ITEMS_KEY = "__items"  # a dict whose keys are not all plain strings


class CodecError(ValueError):
    """The document does not decode into today's classes."""


def allowed(root: type) -> dict[str, type]:
    """The dataclasses reachable from ``root``'s type hints, by name (``root`` included)."""
    found: dict[str, type] = {}
    todo: list[Any] = [root]
    while todo:
        hint = todo.pop()
        if dataclasses.is_dataclass(hint) and isinstance(hint, type):
            if hint.__name__ in found:
                continue
            found[hint.__name__] = hint
            todo.extend(typing.get_type_hints(hint).values())
        else:
            todo.extend(typing.get_args(hint))
    return found


def encode(value: Any) -> Any:
    """``value`` as plain JSON values (floats may be NaN or infinite: written with Python's json, which keeps them)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {TYPE_KEY: type(value).__name__}
        out.update((f.name, encode(getattr(value, f.name))) for f in dataclasses.fields(value))
        return out
    if isinstance(value, tuple):
        return {TUPLE_KEY: [encode(v) for v in value]}
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in value):
            return {k: encode(v) for k, v in value.items()}
        return {ITEMS_KEY: [[encode(k), encode(v)] for k, v in value.items()]}
    raise CodecError(f"cannot encode a {type(value).__name__}")


def decode(doc: Any, classes: dict[str, type]) -> Any:
    """The value :func:`encode` gave ``doc`` for, making only ``classes`` (from :func:`allowed`)."""
    if isinstance(doc, list):
        return [decode(v, classes) for v in doc]
    if not isinstance(doc, dict):
        return doc
    if TUPLE_KEY in doc:
        return tuple(decode(v, classes) for v in doc[TUPLE_KEY])
    if ITEMS_KEY in doc:
        return {_key(decode(k, classes)): decode(v, classes) for k, v in doc[ITEMS_KEY]}
    if TYPE_KEY not in doc:
        return {k: decode(v, classes) for k, v in doc.items()}
    cls = classes.get(doc[TYPE_KEY])
    if cls is None:
        raise CodecError(f"class {doc[TYPE_KEY]!r} is not one a summary holds")
    names = {f.name for f in dataclasses.fields(cls)}
    given = {k: decode(v, classes) for k, v in doc.items() if k != TYPE_KEY}
    if set(given) != names:
        raise CodecError(f"{cls.__name__}: fields {sorted(set(given) ^ names)} differ from today's")
    try:
        return cls(**given)
    except TypeError as exc:
        raise CodecError(f"{cls.__name__}: {exc}") from None


def _key(k: Any) -> Any:
    return tuple(k) if isinstance(k, list) else k
