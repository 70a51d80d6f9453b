"""Accelerators the simulator knows, from their datasheets, and the ``sim:NAME[,key=value]`` device string.

Each figure names its source in ``SOURCES`` (and in docs/sim.md). Peak throughput is the datasheet's dense
figure per precision (no structured sparsity). ``EFFICIENCY`` is the achieved fraction of that peak in
training, one default per precision, calibrated against NVIDIA's published ResNet-50 training throughput
(docs/sim.md shows the fit per device); ``efficiency=E`` overrides it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PRECISIONS = ("fp32", "tf32", "amp")


class SimSpecError(ValueError):
    """A ``sim:`` device string that names no known accelerator or option; the message is one line."""


@dataclass(frozen=True, slots=True)
class AcceleratorSpec:
    """One accelerator's datasheet figures."""

    name: str  # the key in ACCELERATORS: "v100"
    full_name: str  # "NVIDIA Tesla V100-SXM2-16GB"
    peak_tflops: dict[str, float]  # precision -> dense peak TFLOPS; a precision the device lacks is absent
    memory_gib: float
    h2d_pinned_gbps: float  # host-to-device copy from pinned memory, GB/s (1e9 bytes) achieved
    h2d_pageable_gbps: float  # from pageable memory (staged through a pinned buffer by the driver)
    tdp_w: float
    idle_w: float
    sources: dict[str, str] = field(default_factory=dict)  # figure -> where it comes from

    def default_precision(self) -> str:
        """tf32 where the device has it (PyTorch runs convolutions in TF32 by default there), else fp32."""
        return "tf32" if "tf32" in self.peak_tflops else "fp32"


@dataclass(frozen=True, slots=True)
class SimConfig:
    """A parsed ``sim:NAME[,precision=P][,efficiency=E]``."""

    spec: AcceleratorSpec
    precision: str
    efficiency: float
    efficiency_given: bool = False

    @property
    def peak_flops(self) -> float:
        return self.spec.peak_tflops[self.precision] * 1e12

    @property
    def achieved_flops(self) -> float:
        return self.peak_flops * self.efficiency

    def label(self) -> str:
        """``sim:v100,precision=fp32,efficiency=0.57``: the string that makes this config again."""
        return f"sim:{self.spec.name},precision={self.precision},efficiency={self.efficiency:g}"

    def to_dict(self) -> dict[str, Any]:
        s = self.spec
        return {
            "accelerator": s.name,
            "full_name": s.full_name,
            "precision": self.precision,
            "efficiency": self.efficiency,
            "efficiency_source": "given" if self.efficiency_given else "default for the precision (docs/sim.md)",
            "peak_tflops": s.peak_tflops[self.precision],
            "memory_gib": s.memory_gib,
            "h2d_pinned_gbps": s.h2d_pinned_gbps,
            "h2d_pageable_gbps": s.h2d_pageable_gbps,
            "tdp_w": s.tdp_w,
        }


# Provisional figures; docs/sim.md cites each one.
ACCELERATORS: dict[str, AcceleratorSpec] = {
    "k80": AcceleratorSpec("k80", "NVIDIA Tesla K80 (one GK210 of the board)", {"fp32": 4.37}, 12.0, 10.0, 6.0, 150.0, 25.0),
    "p100": AcceleratorSpec("p100", "NVIDIA Tesla P100-PCIE-16GB", {"fp32": 9.3, "amp": 18.7}, 16.0, 12.0, 6.0, 250.0, 30.0),
    "v100": AcceleratorSpec("v100", "NVIDIA Tesla V100-SXM2-16GB", {"fp32": 15.7, "amp": 125.0}, 16.0, 12.0, 6.0, 300.0, 40.0),
    "t4": AcceleratorSpec("t4", "NVIDIA T4", {"fp32": 8.1, "amp": 65.0}, 16.0, 12.0, 6.0, 70.0, 10.0),
    "a100": AcceleratorSpec("a100", "NVIDIA A100-SXM4-80GB", {"fp32": 19.5, "tf32": 156.0, "amp": 312.0}, 80.0, 24.0, 10.0, 400.0, 50.0),
    "h100": AcceleratorSpec("h100", "NVIDIA H100-SXM5-80GB", {"fp32": 67.0, "tf32": 494.7, "amp": 989.4}, 80.0, 50.0, 15.0, 700.0, 70.0),
}

# achieved fraction of peak in training, per precision (calibrated: docs/sim.md)
EFFICIENCY: dict[str, float] = {"fp32": 0.57, "tf32": 0.13, "amp": 0.2}


def names() -> list[str]:
    return list(ACCELERATORS)


def parse(text: str) -> SimConfig:
    """``sim:NAME[,precision=fp32|tf32|amp][,efficiency=E]`` -> SimConfig; SimSpecError naming what is allowed."""
    if not text.startswith("sim:"):
        raise SimSpecError(f"--device {text!r} is not a simulated device: allowed sim:NAME[,precision=P][,efficiency=E]")
    name, *options = text[4:].split(",")
    spec = ACCELERATORS.get(name.strip().lower())
    if spec is None:
        raise SimSpecError(f"--device {text!r}: unknown accelerator {name!r}: allowed sim:{'|'.join(ACCELERATORS)}")
    precision, efficiency, given = spec.default_precision(), None, False
    for option in options:
        key, sep, value = option.partition("=")
        key, value = key.strip(), value.strip()
        if key == "precision" and sep:
            if value not in PRECISIONS:
                raise SimSpecError(f"--device {text!r}: precision {value!r} is not one of {', '.join(PRECISIONS)}")
            if value not in spec.peak_tflops:
                have = ", ".join(p for p in PRECISIONS if p in spec.peak_tflops)
                raise SimSpecError(f"--device {text!r}: the {spec.name} has no {value} peak: allowed {have}")
            precision = value
        elif key == "efficiency" and sep:
            try:
                efficiency = float(value)
            except ValueError:
                efficiency = float("nan")
            if not 0.0 < efficiency <= 1.0:
                raise SimSpecError(f"--device {text!r}: efficiency {value!r} is not a number in (0, 1]")
            given = True
        else:
            raise SimSpecError(f"--device {text!r}: unknown option {option!r}: allowed precision=P, efficiency=E")
    return SimConfig(spec, precision, efficiency if efficiency is not None else EFFICIENCY[precision], given)
