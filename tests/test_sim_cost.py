"""profiler.sim.cost: one training step counted on the meta device, against figures known by construction."""

from __future__ import annotations

import importlib
import time
from typing import Any

import pytest
import torch
from torch import nn

import scenarios
from profiler.sim.cost import CostModelError, StepCost, measure_step

B, IN, HIDDEN, OUT = 4, 16, 32, 8
F32 = 4


class TwoLinear(nn.Module):
    def __init__(self, views: bool = False) -> None:
        super().__init__()
        self.fc1 = nn.Linear(IN, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, OUT)
        self.views = views

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x))
        if self.views:  # metadata only: the same numbers in the same memory, seen differently
            h = h.view(B, 4, HIDDEN // 4).transpose(1, 2).permute(0, 2, 1).reshape(B, -1)
            h = h.unsqueeze(0).squeeze(0).expand(B, HIDDEN).flatten(1)[:, :]
        out: torch.Tensor = self.fc2(h)
        return out


class Reshaper(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x.view(x.shape[0], -1).t().reshape(x.shape).transpose(0, 1).unsqueeze(1).squeeze(1)
        return out


class Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(IN, OUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc(x) if x.sum() > 0 else self.fc(-x)  # reads a value: meta has none
        return out


class ItemReader(Branchy):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc(x) * float(x.max().item())
        return out


def _sample(*shape: int) -> tuple[torch.Tensor, int]:
    return torch.zeros(shape), 0


def test_linear_flops_are_exact_forward_and_backward() -> None:
    cost = measure_step(TwoLinear, _sample(IN), B)
    forward = 2 * B * (IN * HIDDEN + HIDDEN * OUT)
    # backward: fc2 needs both its weight's and its input's gradient (twice its forward); fc1's input is the
    # batch, which needs no gradient, so only its weight's (once its forward). The optimizer counts none.
    backward = 2 * (2 * B * HIDDEN * OUT) + 2 * B * IN * HIDDEN
    assert cost.flops == forward + backward
    assert cost.batch_size == B and cost.precision == "fp32"


def test_weight_gradient_and_momentum_bytes_are_exact() -> None:
    cost = measure_step(TwoLinear, _sample(IN), B)
    params = (IN * HIDDEN + HIDDEN + HIDDEN * OUT + OUT) * F32
    assert (cost.param_bytes, cost.grad_bytes, cost.optimizer_bytes) == (params, params, params)
    assert cost.memory_bytes == 3 * params + cost.activation_bytes
    assert cost.to_dict()["memory_bytes"] == cost.memory_bytes


def test_saved_activations_count_each_storage_once_and_no_weights() -> None:
    # Saved for backward: fc1's input (the batch), ReLU's output (which fc2 saves again as its input: one
    # storage) and the weights (left out: counted as parameters).
    cost = measure_step(TwoLinear, _sample(IN), B)
    assert cost.activation_bytes == B * (IN + HIDDEN) * F32


def test_saved_activations_of_a_small_cnn_within_two_percent() -> None:
    def small_cnn() -> nn.Module:
        return nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(512, 10)
        )

    cost = measure_step(small_cnn, _sample(3, 8, 8), B, loss=nn.functional.cross_entropy)
    # the batch, the convolution's output (BatchNorm's input) and ReLU's output (the Linear's input, flattened):
    # what backward must keep; BatchNorm's per-channel statistics and the loss's few values come on top.
    floor = B * (3 * 64 + 8 * 64 + 8 * 64) * F32
    assert floor <= cost.activation_bytes <= floor * 1.02


def test_amp_halves_the_floating_point_activations_and_keeps_fp32_weights() -> None:
    fp32 = measure_step(TwoLinear, _sample(IN), B)
    amp = measure_step(TwoLinear, _sample(IN), B, precision="amp")
    tf32 = measure_step(TwoLinear, _sample(IN), B, precision="tf32")
    assert amp.activation_bytes * 2 == fp32.activation_bytes
    assert (amp.param_bytes, amp.grad_bytes, amp.optimizer_bytes) == (fp32.param_bytes,) * 3
    # two weights (of two dimensions): each cast to half in the forward and its gradient back to fp32 in the backward
    assert (amp.flops, amp.kernels, amp.precision) == (fp32.flops, fp32.kernels + 2 * 2, "amp")
    assert tf32.memory_bytes == fp32.memory_bytes
    with pytest.raises(ValueError, match="precision 'fp16' is not one of fp32, tf32, amp"):
        measure_step(TwoLinear, _sample(IN), B, precision="fp16")


def test_views_launch_no_kernels() -> None:
    plain = measure_step(TwoLinear, _sample(IN), B)
    viewed = measure_step(lambda: TwoLinear(views=True), _sample(IN), B)
    assert plain.kernels > 0
    assert viewed.kernels == plain.kernels
    # no parameters: no backward, no optimizer; the views cost nothing, the sum standing in for the loss one
    assert measure_step(Reshaper, _sample(6, 4), B).kernels == 1


def test_the_optimizer_step_counts_its_kernels() -> None:
    # SGD with momentum in its multi-tensor form: mul_ the buffers, add_ the gradients, add_ to the weights
    frozen_fc1 = measure_step(_frozen_fc1, _sample(IN), B)
    plain = measure_step(TwoLinear, _sample(IN), B)
    assert frozen_fc1.optimizer_bytes == frozen_fc1.grad_bytes == (HIDDEN * OUT + OUT) * F32
    assert frozen_fc1.param_bytes == plain.param_bytes
    # fc1 frozen: nothing below fc2's weights needs a gradient, so four backward kernels go (fc1's weight mm
    # and bias sum, ReLU's backward, fc2's input mm); the optimizer's three foreach ops stay
    assert plain.kernels - frozen_fc1.kernels == 4


def _frozen_fc1() -> nn.Module:
    model = TwoLinear()
    model.fc1.requires_grad_(False)
    return model


@pytest.mark.parametrize("model", [Branchy, ItemReader])
def test_a_step_that_reads_values_is_one_line_cost_model_error(model: type[nn.Module]) -> None:
    with pytest.raises(CostModelError) as info:
        measure_step(model, _sample(IN), B)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"cannot trace {model.__name__} on the meta device: RuntimeError: ")
    assert "cost_forward" in message


def test_targets_it_cannot_build_need_a_cost_forward() -> None:
    with pytest.raises(CostModelError, match="give the scenario a cost_forward"):
        measure_step(TwoLinear, (torch.zeros(IN), {"boxes": torch.zeros(1, 4)}), B)
    cost = measure_step(TwoLinear, (torch.zeros(IN), {"boxes": torch.zeros(1, 4)}), B, cost_forward=_head_only)
    # the same matmuls as the model's own step (summing the hidden layer into the loss adds no FLOPs)
    assert cost.flops == measure_step(TwoLinear, _sample(IN), B).flops


def _head_only(model: Any, x: torch.Tensor) -> dict[str, torch.Tensor]:
    hidden = model.fc1(x)
    return {"a": model.fc2(hidden), "b": [hidden]}


def test_a_repeated_question_is_answered_from_the_cache() -> None:
    first = measure_step(TwoLinear, _sample(IN), 3)
    started = time.perf_counter()
    again = measure_step(TwoLinear, _sample(IN), 3, precision="amp")
    assert time.perf_counter() - started < 0.01
    assert isinstance(again, StepCost) and again.flops == first.flops


# --- every built-in scenario's models trace -----------------------------------------------------------------

_SLOW = {("bilstm-imdb", "default")}  # nn.LSTM decomposes per time step on meta: ~7,000 ops, several seconds


def _scenario_models() -> list[Any]:
    cases = []
    for name in scenarios.names():
        for model in scenarios.get(name).model_names():
            marks = [pytest.mark.slow] if (name, model) in _SLOW else []
            cases.append(pytest.param(name, model, marks=marks, id=f"{name}:{model}"))
    return cases


def _scenario_sample(name: str) -> tuple[Any, Any]:
    scenario = scenarios.get(name)
    if scenario.data is None:
        return scenario.build_dataset(None)[0]  # type: ignore[no-any-return]
    # File-backed: the item's shape at the GPU resolution, without generating the JPEGs.
    size = importlib.import_module(scenarios.BUILTIN[name].partition(":")[0]).augment_for("cuda").size
    target: Any = {"boxes": torch.zeros(1, 4), "labels": torch.ones(1, dtype=torch.int64)} if name == "ssd" else 0
    return torch.zeros(3, size, size), target


@pytest.mark.parametrize(("name", "model"), _scenario_models())
def test_every_builtin_model_traces(name: str, model: str) -> None:
    scenario = scenarios.get(name)
    cost = measure_step(
        scenario.model_factory(model),
        _scenario_sample(name),
        scenario.batch_size,
        loss=scenario.loss,
        cost_forward=scenario.cost_forward,
        targets_in_forward=scenario.targets_in_forward,
    )
    assert cost.flops > 0 and cost.kernels > 0
    assert cost.param_bytes > 0 and cost.param_bytes == cost.grad_bytes == cost.optimizer_bytes
    assert cost.activation_bytes > 0


def test_resnet50_at_224_px_is_its_published_training_flops() -> None:
    # ~4.1 GMAC forward per image (torchvision), x2 FLOPs per MAC, x3 for forward + backward: ~24.3 GFLOP
    imagenet = importlib.import_module("scenarios.imagenet")
    # at the scenario's batch, so that the trace above answers from the cache
    cost = measure_step(imagenet.resnet50, (torch.zeros(3, 224, 224), 0), 32, loss=imagenet.SCENARIO.loss)
    assert cost.flops / 32 == pytest.approx(24.3e9, rel=0.02)
    assert cost.param_bytes == 25_557_032 * F32


@pytest.mark.slow
def test_ssd_cost_forward_resizes_for_ssd300_only() -> None:
    ssd = importlib.import_module("scenarios.ssd")
    at_320 = measure_step(ssd.ssd300_vgg16, _ssd_sample(320), 1, cost_forward=ssd.cost_step)
    at_300 = measure_step(ssd.ssd300_vgg16, _ssd_sample(300), 1, cost_forward=ssd.cost_step)
    assert at_320.flops == at_300.flops  # ssd300's transform resizes to its fixed 300 x 300
    # ssdlite trains at the loader's size (_skip_resize); at the scenario's batch, as the test above asks
    lite = [
        measure_step(ssd.ssdlite320_mobilenet_v3_large, _ssd_sample(size), 8, cost_forward=ssd.cost_step)
        for size in (160, 320)
    ]
    assert lite[1].flops == pytest.approx(4 * lite[0].flops, rel=0.15)


def _ssd_sample(size: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    return torch.zeros(3, size, size), {"boxes": torch.zeros(1, 4), "labels": torch.ones(1, dtype=torch.int64)}
