"""How many steps the training process took, beside those its store holds: a killed run's count of what is missing
(meta ``steps_taken``: the ring's count, written by the sampler process at the close; docs/store.md). Pure."""

from __future__ import annotations

from typing import TypedDict

from profiler.core.rows import RunRecord


class Taken(TypedDict):
    """The Summary's ``steps_taken`` and ``steps_lost``."""

    steps_taken: int | None
    steps_lost: int | None


def steps_taken(rec: RunRecord) -> Taken:
    """The steps the training process took (meta ``steps_taken``, from the ring's count: docs/store.md) and how
    many of them the store does not hold; None where the run did not count them."""
    taken = rec.meta.get("steps_taken")
    if not isinstance(taken, int) or isinstance(taken, bool):
        return {"steps_taken": None, "steps_lost": None}
    return {"steps_taken": taken, "steps_lost": max(0, taken - len(rec.steps))}


def missing_notes(rec: RunRecord) -> list[str]:
    """For a run that did not close itself, how many steps it took and how many of them the store lacks."""
    got = steps_taken(rec)
    taken, lost = got["steps_taken"], got["steps_lost"]
    if taken is None or lost is None or (lost == 0 and rec.meta.get("status") == "complete"):
        return []
    if lost == 0:
        return [f"the training process took {taken:,} steps before it ended; all {taken:,} are stored"]
    why = (
        "they had not reached the sampler process when the training process ended"
        if rec.meta.get("status") == "interrupted"
        else "they did not reach the store"
    )
    held = len(rec.steps)
    return [f"the training process took {taken:,} steps; the store holds {held:,}: {lost:,} are missing ({why})"]
