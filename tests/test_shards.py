"""Data-parallel shards: every rank of a job loads a disjoint part of each epoch, all ranks together the whole
epoch, in an order that changes every epoch and is the same on every rank (a DistributedSampler that moves to the
next epoch by itself; DALI's reader shard_id / num_shards)."""

from __future__ import annotations

from typing import Any

import pytest

from pipelines import LoaderSpec, get
from pipelines.dali import reader_options


class Items:
    def __len__(self) -> int:
        return 20

    def __getitem__(self, i: int) -> tuple[int, int]:
        return i, 0


def _epochs(pipeline: str, shard: int, shards: int, workers: int = 0) -> list[list[int]]:
    built = get(pipeline).build(Items(), LoaderSpec(batch_size=2, workers=workers, shard=shard, num_shards=shards))
    try:
        return [[int(i) for x, _ in built.batches for i in x] for _ in range(2)]
    finally:
        built.close()


@pytest.mark.parametrize("pipeline", ["naive", "prefetch"])
def test_ranks_split_every_epoch_and_reshuffle(pipeline: str) -> None:
    shards: list[Any] = [_epochs(pipeline, r, 2) for r in (0, 1)]
    for epoch in (0, 1):
        a, b = shards[0][epoch], shards[1][epoch]
        assert len(a) == len(b) == 10 and not set(a) & set(b) and sorted(a + b) == list(range(20))
    assert shards[0][0] != shards[0][1]  # a new order each epoch
    assert _epochs(pipeline, 0, 2) == shards[0]  # the same on every run (seeded)


def test_one_shard_is_the_plain_loader() -> None:
    assert sorted(_epochs("naive", 0, 1)[0]) == list(range(20))
    with pytest.raises(ValueError, match="shard must be in"):
        LoaderSpec(batch_size=2, shard=2, num_shards=2)


def test_dali_reads_its_shard() -> None:
    assert {"shard_id": 1, "num_shards": 4}.items() <= reader_options(LoaderSpec(8, shard=1, num_shards=4)).items()
    assert "shard_id" not in reader_options(LoaderSpec(8))
