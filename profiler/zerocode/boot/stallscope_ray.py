"""Ray Data's iterators as loaders, for the start-up module (stallscope_instrument.py beside it, which loads this
file when ``ray.data.iterator`` is imported): each ``iter_batches`` / ``iter_torch_batches`` call is an epoch whose
batches that module times as a DataLoader's, and at the epoch's end Ray's own iteration timers are written as a
``ray_stats`` record, labelled as Ray's. It runs in the script's process: nothing here may raise into the script's
loop but what Ray itself raises."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def wrap_iter_batches(iter_batches: Callable[..., Any], loader_of: Callable[[dict[str, Any]], int], writer: Any) -> Any:
    """``DataIterator._iter_batches`` returning a :class:`RayEpoch` of the loader ``loader_of(kwargs)`` names (its
    call site's), with the stats object Ray's iteration updates kept for the epoch's end."""

    def _iter_batches(iterator: Any, *args: Any, **kwargs: Any) -> Any:
        timers: list[Any] = []
        own = getattr(iterator, "_to_ref_bundle_iterator", None)
        if callable(own):  # keep the stats object Ray's iteration updates: its own blocked-time timers

            def capturing() -> Any:
                result = own()
                if isinstance(result, tuple) and len(result) >= 2:
                    timers.append(result[1])
                return result

            iterator._to_ref_bundle_iterator = capturing
        batches = iter_batches(iterator, *args, **kwargs)
        return RayEpoch(batches, loader_of(kwargs), timers, writer)

    return _iter_batches


# Ray Data's own iteration timers (DatasetStats attributes) written at an epoch's end as a ``ray_stats`` record
RAY_TIMERS = {
    "user_thread_blocked_s": "iter_total_blocked_s",
    "first_batch_s": "iter_time_to_first_batch_s",
    "user_code_s": "iter_user_s",
    "blocked_on_production_s": "iter_blocked_production_wait_s",
}


class RayEpoch:
    """One ``iter_batches`` / ``iter_torch_batches`` result of Ray Data, as a loader's epoch (``patch_ray``)."""

    def __init__(self, batches: Any, lid: int, timers: list[Any], writer: Any) -> None:
        self.batches, self._stallscope_id, self.timers, self.writer = batches, lid, timers, writer

    def __iter__(self) -> Any:
        return RayEpochIterator(iter(self.batches), self)


class RayEpochIterator:
    """Ray's generator behind a class whose ``__next__`` can be timed (a generator's cannot be patched); at the
    epoch's end, Ray's own timers for it as a ``ray_stats`` record, labelled as Ray's."""

    def __init__(self, inner: Any, epoch: RayEpoch) -> None:
        self.inner, self.epoch = inner, epoch

    def __iter__(self) -> RayEpochIterator:
        return self

    def __next__(self) -> Any:
        try:
            return next(self.inner)
        except StopIteration:
            self.write_stats()
            raise

    def write_stats(self) -> None:
        stats = self.epoch.timers[-1] if self.epoch.timers else None
        rec: dict[str, object] = {"k": "ray_stats", "id": self.epoch._stallscope_id, "source": "Ray Data's own timers"}
        for key, attr in RAY_TIMERS.items():
            get = getattr(getattr(stats, attr, None), "get", None)
            rec[key] = float(get()) if callable(get) else None
        rec["batches"] = getattr(stats, "iter_batches_total", None)
        self.epoch.writer.put(rec)
