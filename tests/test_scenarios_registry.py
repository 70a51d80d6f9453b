"""The scenario registry: built-in names, user files, and the one-line error messages."""

from __future__ import annotations

from pathlib import Path

import pytest

import scenarios
from scenarios import Scenario, ScenarioError

USER_FILE = """
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from scenarios import Scenario


@dataclass
class Pairs:
    n: int = 8

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.full((3,), float(i)), torch.tensor(i % 2)


scenario = Scenario(
    name="{name}",
    dataset=Pairs,
    model=lambda: nn.Linear(3, 2),
    loss=nn.functional.cross_entropy,
    batch_size=4,
    steps=5,
    warmup=1,
)
"""


def write(path: Path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def test_builtin_names_and_lookup() -> None:
    assert scenarios.names() == sorted(scenarios.BUILTIN)
    assert "fashion-vgg" in scenarios.names()
    from scenarios.fashion_vgg import SCENARIO

    assert scenarios.get("fashion-vgg") is SCENARIO


def test_public_surface() -> None:
    assert scenarios.__all__ == sorted(scenarios.__all__)
    assert {"Scenario", "ScenarioError", "get", "names"} <= set(scenarios.__all__)
    assert issubclass(ScenarioError, ValueError)


def test_unknown_name() -> None:
    with pytest.raises(ScenarioError) as info:
        scenarios.get("foo")
    assert str(info.value) == (
        f"unknown scenario 'foo': choose one of {', '.join(scenarios.names())}, "
        "or a path to a .py file defining `scenario = Scenario(...)`"
    )


def test_missing_file(tmp_path: Path) -> None:
    path = str(tmp_path / "x.py")
    with pytest.raises(ScenarioError) as info:
        scenarios.get(path)
    assert str(info.value) == f"scenario file {path!r} does not exist"


def test_file_without_scenario(tmp_path: Path) -> None:
    path = write(tmp_path / "empty.py", "x = 1\n")
    with pytest.raises(ScenarioError, match="defines no `scenario`") as info:
        scenarios.get(path)
    assert path in str(info.value)


def test_file_with_wrong_type(tmp_path: Path) -> None:
    path = write(tmp_path / "wrong.py", "scenario = 42\n")
    with pytest.raises(ScenarioError, match="defines `scenario` as int, not a Scenario"):
        scenarios.get(path)


def test_file_that_raises_is_reported_on_one_line(tmp_path: Path) -> None:
    path = write(tmp_path / "boom.py", "raise RuntimeError('first line\\nsecond line')\n")
    with pytest.raises(ScenarioError) as info:
        scenarios.get(path)
    message = str(info.value)
    assert message == f"scenario file {path!r} failed to load: RuntimeError: first line second line"
    assert isinstance(info.value.__cause__, RuntimeError)

    path = write(tmp_path / "syntax.py", "def broken(:\n")
    with pytest.raises(ScenarioError, match="failed to load: SyntaxError"):
        scenarios.get(path)

    # A bad Scenario(...) call is a load error too: the file's author sees the validation message.
    path = write(tmp_path / "invalid.py", USER_FILE.replace("batch_size=4", "batch_size=0").format(name="v"))
    with pytest.raises(ScenarioError, match=r"ValueError: Scenario\.batch_size must be an integer >= 1, got 0"):
        scenarios.get(path)


def test_directory_named_like_a_file(tmp_path: Path) -> None:
    (tmp_path / "dir.py").mkdir()
    with pytest.raises(ScenarioError, match="is not a file"):
        scenarios.get(str(tmp_path / "dir.py"))


def test_user_file_loads_and_trains(tmp_path: Path) -> None:
    path = write(tmp_path / "mine.py", USER_FILE.format(name="mine"))
    scenario = scenarios.get(path)
    assert isinstance(scenario, Scenario)
    assert (scenario.name, scenario.batch_size, scenario.steps, scenario.warmup) == ("mine", 4, 5, 1)
    dataset, model = scenario.dataset(), scenario.model()
    x, y = dataset[3]
    loss = scenario.loss(model(x.unsqueeze(0)), y.unsqueeze(0))
    loss.backward()
    assert loss.ndim == 0


def test_same_stem_in_two_directories_do_not_clash(tmp_path: Path) -> None:
    first = scenarios.get(write(tmp_path / "a" / "s.py", USER_FILE.format(name="first")))
    second = scenarios.get(write(tmp_path / "b" / "s.py", USER_FILE.format(name="second")))
    assert (first.name, second.name) == ("first", "second")
