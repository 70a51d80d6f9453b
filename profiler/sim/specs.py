"""Accelerators the simulator knows, from their datasheets, and the ``sim:NAME[,key=value]`` device string.

Every figure of an ``AcceleratorSpec`` names its source in ``spec.sources`` (figure -> citation with URL;
docs/sim.md tabulates them). Peak throughput is the datasheet's dense figure per precision (no
structured sparsity). The model's constants (the achieved fraction of that peak per device and precision, the
kernels' fill time, the host's launch and framework cost) are fitted by :mod:`profiler.sim.calibration` on eager
PyTorch training throughput, published by NVIDIA and measured on an H100; ``efficiency=E`` overrides the fraction.
Invariant: they are ``calibration.calibrate(calibration.POINTS, ...)`` rounded to two significant digits.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from profiler.sim.roofline import Rates

PRECISIONS = ("fp32", "tf32", "amp")
# run --precision's names on a simulated device: the same arithmetic (bf16 and fp16 autocast run on the tensor cores
# the simulator's amp peak is for; default is the device's default precision)
PRECISION_ALIASES = {"bf16": "amp", "fp16": "amp"}
LINKS = ("pcie", "nvlink")
LAUNCHES = ("sleep", "gil")


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
    memory_gbps: float = 0.0  # device memory bandwidth, GB/s (datasheet)
    # GPU-to-GPU link for the gradient all-reduce of multi-rank training, GB/s per direction per GPU: NVLink on SXM
    # boards (None: the GPUs talk over PCIe, at the pinned host-link rate)
    nvlink_gbps: float | None = None
    # the calibrated device whose SMs, clocks and tensor cores this one has (the H200 is an H100's GH100 with more
    # and faster memory): without points of its own it takes that device's efficiency, not the median of others
    compute_of: str | None = None

    def default_link(self) -> str:
        """nvlink where the board has it (SXM), else pcie."""
        return "nvlink" if self.nvlink_gbps else "pcie"

    def link_gbps(self, link: str) -> float:
        return self.nvlink_gbps if link == "nvlink" and self.nvlink_gbps else self.h2d_pinned_gbps

    def default_precision(self) -> str:
        """tf32 where the device has it (PyTorch runs convolutions in TF32 by default there), else fp32."""
        return "tf32" if "tf32" in self.peak_tflops else "fp32"


@dataclass(frozen=True, slots=True)
class SimConfig:
    """A parsed ``sim:NAME[,precision=P][,efficiency=E][,link=L]``."""

    spec: AcceleratorSpec
    precision: str
    efficiency: float
    efficiency_given: bool = False
    link: str = "pcie"  # pcie | nvlink: what the gradient all-reduce of a multi-rank run crosses
    # how the host spends a step's launch time: "sleep" (the host waits, the CPU is free), or "gil" (the training
    # thread spins launch by launch holding the GIL, as eager PyTorch does: a thread beside it slows the launches)
    launch: str = "sleep"

    @property
    def link_gbps(self) -> float:
        return self.spec.link_gbps(self.link)

    @property
    def peak_flops(self) -> float:
        return self.spec.peak_tflops[self.precision] * 1e12

    @property
    def achieved_flops(self) -> float:
        return self.peak_flops * self.efficiency

    @property
    def rates(self) -> Rates:
        """What the device achieves, kernel by kernel (profiler.sim.roofline); a spec without a memory bandwidth
        (0) does not bound kernels by their bytes."""
        bandwidth = self.spec.memory_gbps * 1e9 * MEMORY_EFFICIENCY
        return Rates(self.achieved_flops, bandwidth if bandwidth > 0 else math.inf, KERNEL_FILL_S)

    def label(self) -> str:
        """``sim:v100,precision=fp32,efficiency=0.57``: the string that makes this config again."""
        link = f",link={self.link}" if self.link != self.spec.default_link() else ""
        launch = f",launch={self.launch}" if self.launch != "sleep" else ""
        return f"sim:{self.spec.name},precision={self.precision},efficiency={self.efficiency:g}{link}{launch}"

    def to_dict(self) -> dict[str, str | float]:
        s = self.spec
        return {
            "accelerator": s.name,
            "full_name": s.full_name,
            "precision": self.precision,
            "efficiency": self.efficiency,
            "efficiency_source": "given" if self.efficiency_given else _efficiency_source(s.name, self.precision),
            "peak_tflops": s.peak_tflops[self.precision],
            "memory_gib": s.memory_gib,
            "h2d_pinned_gbps": s.h2d_pinned_gbps,
            "h2d_pageable_gbps": s.h2d_pageable_gbps,
            "tdp_w": s.tdp_w,
            "memory_gbps": s.memory_gbps,
            "memory_efficiency": MEMORY_EFFICIENCY,
            "kernel_fill_s": KERNEL_FILL_S,
            "link": self.link,
            "link_gbps": self.link_gbps,
            "launch": self.launch,
        }


# Where each figure comes from. Datasheet figures are NVIDIA's; the host-to-device rates are achieved copy
# rates (bandwidthTest / nvbandwidth), not link peaks; idle power is what nvidia-smi reads at 0 % utilisation,
# which no datasheet states (each source string says how firm it is).
_DS_K80 = (
    "NVIDIA Tesla K80 datasheet (board of 2x GK210: 8.73 TFLOPS FP32 with GPU Boost, 24 GB, 480 GB/s, 300 W), halved "
    "per GPU "
    "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-product-literature/TeslaK80-datasheet.pdf"
)
_DS_P100 = (
    "NVIDIA Tesla P100 PCIe datasheet (16 GB: 9.3 TFLOPS FP32, 18.7 TFLOPS FP16, 732 GB/s, 250 W) "
    "https://images.nvidia.com/content/tesla/pdf/nvidia-tesla-p100-PCIe-datasheet.pdf"
)
_DS_V100 = (
    "NVIDIA Tesla V100 datasheet, SXM2 column (15.7 TFLOPS FP32, 125 TFLOPS tensor, 16/32 GB, 900 GB/s, 300 W) "
    "https://images.nvidia.com/content/technologies/volta/pdf/tesla-volta-v100-datasheet-letter-fnl-web.pdf"
)
_DS_T4 = (
    "NVIDIA T4 datasheet (8.1 TFLOPS FP32, 65 TFLOPS mixed FP16/FP32, 16 GB GDDR6, 320+ GB/s, 70 W, PCIe Gen3 x16) "
    "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf"
)
_DS_A100 = (
    "NVIDIA A100 datasheet, A100 80GB SXM column (19.5 TFLOPS FP32; tensor TF32 156, FP16 312 dense, the starred "
    "figures are with sparsity; 80 GB; 2,039 GB/s; 400 W; PCIe Gen4 host link) "
    "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
)
_DS_H100 = (
    "NVIDIA H100 datasheet, H100 SXM column (67 TFLOPS FP32, 80 GB, 3.35 TB/s, up to 700 W, PCIe Gen5 host link) "
    "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
)
_WP_H100 = (
    "NVIDIA H100 Tensor Core GPU Architecture whitepaper, H100 SXM5 dense tensor peaks (TF32 494.7, FP16 989.4 "
    "TFLOPS; the datasheet's 989 / 1,979 are with sparsity) "
    "https://resources.nvidia.com/en-us-tensor-core/gtc22-whitepaper-hopper"
)
_DS_H200 = (
    "NVIDIA H200 datasheet, H200 SXM column (141 GB HBM3e, 4.8 TB/s, up to 700 W, NVLink 900 GB/s, PCIe Gen5 host "
    "link; its FLOP peaks are the H100 SXM's: the same GH100 SMs and clocks) "
    "https://www.nvidia.com/en-us/data-center/h200/"
)
_MEASURED_H200 = (
    "measured: NVML on an NVIDIA H200 read 143,771 MiB of memory (140.4 GiB), 2026-11-28 "
    "(../shared/measured/h200-2026-11-28.md)"
)
_PCIE3 = (
    "PCIe 3.0 x16 achieved from pinned memory, ~12 GB/s: bandwidthTest H2D pinned 12150.7 MB/s on a Tesla "
    "P100-PCIE-16GB https://github.com/mpicbg-scicomp/gearshifft/pull/82 ; V100 ingress measured at 12 GB/s "
    "https://github.com/ZaidQureshi/bam/issues/54"
)
_PCIE4 = (
    "PCIe 4.0 x16 achieved from pinned memory, ~25 GB/s: nvbandwidth host_to_device 25.13 GB/s on an A100-SXM4 "
    "https://github.com/NVIDIA/nvbandwidth/issues/42 ; A100 measured peak 25 GB/s "
    "https://github.com/ZaidQureshi/bam/issues/54"
)
_PCIE5 = (
    "PCIe 5.0 x16 achieved from pinned memory, ~50 GB/s: nvbandwidth on H100 nodes read 52.8 GB/s device-to-host "
    "(and 35 GB/s host-to-device with SM copies) https://github.com/NVIDIA/nvbandwidth/issues/24 ; the 50 for a "
    "copy-engine H2D copy is an estimate, no H100 copy-engine H2D figure was found"
)
_PAGEABLE = (
    "estimate, half the pinned rate: the driver stages a pageable copy through a pinned buffer (an extra host "
    "memcpy), NVIDIA 'How to Optimize Data Transfers in CUDA C/C++' "
    "https://developer.nvidia.com/blog/how-optimize-data-transfers-cuda-cc/ ; PyTorch 'A guide on good usage of "
    "non_blocking and pin_memory()' https://pytorch.org/tutorials/intermediate/pinmem_nonblock.html"
)
_NVLINK = (
    "{ds} total NVLink bandwidth {total} GB/s (both directions), halved: {half} GB/s per direction, the rate a "
    "ring all-reduce moves data at; a datasheet peak, so all-reduce times over NVLink are optimistic (NCCL's "
    "achieved bus bandwidth is lower)"
)
_NO_NVLINK = "none: the GPUs exchange gradients over PCIe, at the pinned host-link rate (h2d_pinned_gbps)"
_IDLE_LOGS = "estimate from public nvidia-smi logs of idle {gpu}: {reading}; no single citable source"


def _spec(
    name: str,
    full_name: str,
    peaks: dict[str, float],
    *,
    memory_gib: float,
    pinned_gbps: float,
    tdp_w: float,
    idle_w: float,
    memory_gbps: float,
    sources: dict[str, str],
    nvlink_gbps: float | None = None,
    compute_of: str | None = None,
) -> AcceleratorSpec:
    """Pageable host-to-device is half the pinned rate on every device (see _PAGEABLE)."""
    srcs = {f"peak_tflops.{p}": sources.get(f"peak_tflops.{p}", sources["peak"]) for p in peaks}
    srcs |= {k: v for k, v in sources.items() if k != "peak" and not k.startswith("peak_tflops.")}
    srcs["h2d_pageable_gbps"] = _PAGEABLE
    srcs["nvlink_gbps"] = sources.get("nvlink_gbps", _NO_NVLINK)
    if compute_of is not None:
        srcs["compute_of"] = sources["peak"]
    return AcceleratorSpec(
        name,
        full_name,
        peaks,
        memory_gib,
        pinned_gbps,
        pinned_gbps / 2,
        tdp_w,
        idle_w,
        srcs,
        memory_gbps,
        nvlink_gbps,
        compute_of,
    )


ACCELERATORS: dict[str, AcceleratorSpec] = {
    "k80": _spec(
        "k80",
        "NVIDIA Tesla K80 (one GK210 GPU of the dual-GPU board)",
        {"fp32": 4.37},
        memory_gib=12.0,
        pinned_gbps=12.0,
        tdp_w=150.0,
        idle_w=57.0,
        memory_gbps=240.0,
        sources={
            "peak": _DS_K80,
            "memory_gbps": _DS_K80 + " ; 480 GB/s for the board's two GPUs, halved",
            "memory_gib": _DS_K80,
            "h2d_pinned_gbps": _PCIE3 + " ; the board's two GPUs share one x16 link, no K80-specific measurement found",
            "tdp_w": _DS_K80 + " ; nvidia-smi caps each GK210 at 149 W",
            "idle_w": _IDLE_LOGS.format(gpu="K80 GPUs", reading="57-66 W at P0, ~27 W at P8"),
        },
    ),
    "p100": _spec(
        "p100",
        "NVIDIA Tesla P100-PCIE-16GB",
        {"fp32": 9.3, "amp": 18.7},
        memory_gib=16.0,
        pinned_gbps=12.0,
        tdp_w=250.0,
        idle_w=30.0,
        memory_gbps=732.0,
        sources={
            "peak": _DS_P100,
            "peak_tflops.amp": _DS_P100 + " ; no tensor cores, amp runs at the FP16 rate",
            "memory_gbps": _DS_P100,
            "memory_gib": _DS_P100,
            "h2d_pinned_gbps": _PCIE3,
            "tdp_w": _DS_P100,
            "idle_w": _IDLE_LOGS.format(gpu="P100-PCIE GPUs", reading="27-30 W at P0"),
        },
    ),
    "v100": _spec(
        "v100",
        "NVIDIA Tesla V100-SXM2-16GB",
        {"fp32": 15.7, "amp": 125.0},
        memory_gib=16.0,
        pinned_gbps=12.0,
        tdp_w=300.0,
        idle_w=53.0,
        memory_gbps=900.0,
        sources={
            "peak": _DS_V100,
            "memory_gbps": _DS_V100,
            "memory_gib": _DS_V100,
            "h2d_pinned_gbps": _PCIE3 + " ; SXM2 boards reach the host over PCIe 3.0 x16",
            "nvlink_gbps": _NVLINK.format(ds=_DS_V100, total=300, half=150),
            "tdp_w": _DS_V100,
            "idle_w": "nvidia-smi of a Tesla V100-SXM2 at 0 % utilisation, P0, context open: 53 W / 300 W "
            "https://github.com/zai-org/GLM-130B/issues/32",
        },
        nvlink_gbps=150.0,
    ),
    "t4": _spec(
        "t4",
        "NVIDIA T4 (PCIe, 16 GB)",
        {"fp32": 8.1, "amp": 65.0},
        memory_gib=16.0,
        pinned_gbps=12.0,
        tdp_w=70.0,
        idle_w=26.0,
        memory_gbps=320.0,
        sources={
            "peak": _DS_T4,
            "memory_gbps": _DS_T4,
            "memory_gib": _DS_T4,
            "h2d_pinned_gbps": _PCIE3,
            "tdp_w": _DS_T4,
            "idle_w": _IDLE_LOGS.format(gpu="T4 GPUs", reading="16-31 W at P0, 9-10 W at P8"),
        },
    ),
    "a100": _spec(
        "a100",
        "NVIDIA A100-SXM4-80GB",
        {"fp32": 19.5, "tf32": 156.0, "amp": 312.0},
        memory_gib=80.0,
        pinned_gbps=25.0,
        tdp_w=400.0,
        idle_w=55.0,
        memory_gbps=2039.0,
        sources={
            "peak": _DS_A100,
            "memory_gbps": _DS_A100,
            "memory_gib": _DS_A100,
            "h2d_pinned_gbps": _PCIE4,
            "nvlink_gbps": _NVLINK.format(ds=_DS_A100, total=600, half=300),
            "tdp_w": _DS_A100,
            "idle_w": _IDLE_LOGS.format(gpu="A100-SXM4 GPUs", reading="50-70 W at P0"),
        },
        nvlink_gbps=300.0,
    ),
    "h100": _spec(
        "h100",
        "NVIDIA H100-SXM5-80GB",
        {"fp32": 67.0, "tf32": 494.7, "amp": 989.4},
        memory_gib=80.0,
        pinned_gbps=50.0,
        tdp_w=700.0,
        idle_w=140.0,
        memory_gbps=3350.0,
        sources={
            "peak": _WP_H100,
            "peak_tflops.fp32": _DS_H100,
            "memory_gbps": _DS_H100,
            "memory_gib": _DS_H100,
            "h2d_pinned_gbps": _PCIE5,
            "nvlink_gbps": _NVLINK.format(ds=_DS_H100, total=900, half=450),
            "tdp_w": _DS_H100,
            "idle_w": "nvidia-smi of H100 80GB HBM3 GPUs at 0-4 % utilisation, P0, memory held: 140-145 W / 700 W "
            "https://github.com/wilicc/gpu-burn/issues/114",
        },
        nvlink_gbps=450.0,
    ),
    "h200": _spec(
        "h200",
        "NVIDIA H200 (SXM, 141 GB)",
        {"fp32": 67.0, "tf32": 494.7, "amp": 989.4},
        memory_gib=140.4,
        pinned_gbps=50.0,
        tdp_w=700.0,
        idle_w=140.0,
        memory_gbps=4800.0,
        sources={
            "peak": _WP_H100 + " ; " + _DS_H200,
            "peak_tflops.fp32": _DS_H100 + " ; " + _DS_H200,
            "memory_gbps": _DS_H200,
            "memory_gib": _MEASURED_H200 + " ; " + _DS_H200,
            "h2d_pinned_gbps": _PCIE5,
            "nvlink_gbps": _NVLINK.format(ds=_DS_H200, total=900, half=450),
            "tdp_w": _DS_H200,
            "idle_w": "estimate: the H100 SXM's 140-145 W at 0-4 % utilisation (the same board power class), not "
            "measured on an H200 https://github.com/wilicc/gpu-burn/issues/114",
        },
        nvlink_gbps=450.0,
        compute_of="h100",
    ),
}
# Variants whose name holds a table key but whose figures differ from its entry: a name with one of these tokens
# (as torch.cuda.get_device_name and NVML give it) is not that entry: "NVIDIA H100 PCIe" (51 TFLOPS FP32, 2 TB/s)
# and "NVIDIA H100 NVL" (94 GB, 3.9 TB/s) are not the H100 SXM, an "A100-SXM4-40GB" or "A100-PCIE-40GB" not the
# A100 80GB (1,555 GB/s; the "A100 80GB PCIe" has its peaks and 1,935 GB/s: it is). GH200 and H20 hold no key as a
# whole token ("gh200", "h20"): unknown too.
OTHER_VARIANTS: dict[str, tuple[str, ...]] = {"h100": ("pcie", "nvl"), "a100": ("40gb",)}


# The model's constants, fitted by profiler.sim.calibration.calibrate on the points in calibration.POINTS and
# rounded to two significant digits (docs/sim.md, "Calibration"; tests/test_sim_calibration.py holds them to it).
# Achieved fraction of the datasheet FLOP peak, per device and precision where a point measured it:
DEVICE_EFFICIENCY: dict[tuple[str, str], float] = {
    ("v100", "fp32"): 0.81,
    ("v100", "amp"): 0.47,
    ("a100", "tf32"): 0.36,
    ("a100", "amp"): 0.37,
    ("h100", "tf32"): 0.37,
    ("h100", "amp"): 0.19,
}
# and on a device no point measured, per precision: the median over the devices above (a device that shares a
# measured one's SMs and clocks, AcceleratorSpec.compute_of, takes that one's instead)
EFFICIENCY: dict[str, float] = {"fp32": 0.81, "tf32": 0.37, "amp": 0.37}
# Each kernel's fill time (seconds): fitted where one device and precision was measured at two batch sizes
KERNEL_FILL_S = 6.9e-6
# The host's time to issue a step of eager PyTorch: the framework's per-step cost, and one launch per kernel (Python,
# the dispatcher, the CUDA driver), fitted on launch-bound steps measured on the H100's 16-core host
FRAMEWORK_S = 6.2e-3
LAUNCH_S = 36e-6
# Achieved fraction of the datasheet memory bandwidth for the kernels that stream memory (normalisation,
# activations, the optimizer): an estimate, not fitted (docs/sim.md says how the fit depends on it)
MEMORY_EFFICIENCY = 0.8


def efficiency_of(name: str) -> str:
    """The device whose calibrated efficiency ``name`` takes: itself, or the one whose SMs it has (compute_of)."""
    spec = ACCELERATORS.get(name)
    return spec.compute_of if spec is not None and spec.compute_of else name


def _efficiency_source(name: str, precision: str) -> str:
    if (name, precision) in DEVICE_EFFICIENCY:
        return f"calibrated on the {name} (docs/sim.md)"
    of = efficiency_of(name)
    if (of, precision) in DEVICE_EFFICIENCY:
        return f"calibrated on the {of}, whose SMs and clocks the {name} has (docs/sim.md)"
    return f"no {name} {precision} point: the median of the calibrated devices (docs/sim.md)"


def default_efficiency(name: str, precision: str) -> float:
    """The calibrated efficiency of ``precision`` on the device ``name``: its own where a point measured it, else
    that of the device whose SMs and clocks it has (``compute_of``), else the precision's median over the devices
    that were measured."""
    own = DEVICE_EFFICIENCY.get((name, precision))
    if own is not None:
        return own
    return DEVICE_EFFICIENCY.get((efficiency_of(name), precision), EFFICIENCY[precision])


def names() -> list[str]:
    return list(ACCELERATORS)


def parse(text: str) -> SimConfig:
    """``sim:NAME[,precision=fp32|tf32|amp][,efficiency=E][,link=pcie|nvlink][,launch=sleep|gil]`` -> SimConfig;
    SimSpecError naming what is allowed."""
    if not text.startswith("sim:"):
        raise SimSpecError(
            f"--device {text!r} is not a simulated device: allowed sim:NAME[,precision=P][,efficiency=E][,link=L]"
        )
    name, *options = text[4:].split(",")
    spec = ACCELERATORS.get(name.strip().lower())
    if spec is None:
        raise SimSpecError(f"--device {text!r}: unknown accelerator {name!r}: allowed sim:{'|'.join(ACCELERATORS)}")
    precision, efficiency, given, link = spec.default_precision(), None, False, spec.default_link()
    launch = "sleep"
    for option in options:
        key, sep, value = option.partition("=")
        key, value = key.strip(), value.strip()
        if key == "precision" and sep:
            if value == "bf16" and "tf32" not in spec.peak_tflops:  # bfloat16 came with Ampere, as TF32 did
                raise SimSpecError(f"--device {text!r}: the {spec.name} has no bfloat16: allowed fp32, fp16 (amp)")
            value = spec.default_precision() if value == "default" else PRECISION_ALIASES.get(value, value)
            if value not in PRECISIONS:
                raise SimSpecError(
                    f"--device {text!r}: precision {value!r} is not one of {', '.join(PRECISIONS)} (or run "
                    "--precision's default, bf16, fp16)"
                )
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
        elif key == "link" and sep:
            link = _link(text, spec, value)
        elif key == "launch" and sep and value in LAUNCHES:
            launch = value
        else:
            raise SimSpecError(
                f"--device {text!r}: unknown option {option!r}: allowed precision=P, efficiency=E, link=pcie|nvlink, "
                "launch=sleep|gil"
            )
    eff = efficiency if efficiency is not None else default_efficiency(spec.name, precision)
    return SimConfig(spec, precision, eff, given, link, launch)


def _link(text: str, spec: AcceleratorSpec, value: str) -> str:
    if value not in LINKS:
        raise SimSpecError(f"--device {text!r}: link {value!r} is not one of {', '.join(LINKS)}")
    if value == "nvlink" and not spec.nvlink_gbps:
        raise SimSpecError(f"--device {text!r}: the {spec.name} has no NVLink: allowed link=pcie")
    return value


def match_accelerator(device_name: str, keys: Sequence[str] | None = None) -> str | None:
    """The key of :data:`ACCELERATORS` whose name is a whole token of ``device_name`` (``torch.cuda.get_device_name``:
    "NVIDIA A100-SXM4-80GB" -> a100, "Tesla T4" -> t4, "NVIDIA H200" -> h200, and "T4" inside another model number
    does not match), unless the name also holds a token of another variant (:data:`OTHER_VARIANTS`); else None."""
    for key in ACCELERATORS if keys is None else keys:
        if _token(key, device_name) and not any(_token(v, device_name) for v in OTHER_VARIANTS.get(key, ())):
            return key
    return None


def _token(word: str, name: str) -> bool:
    return re.search(rf"(?<![a-z0-9]){re.escape(word)}(?![a-z0-9])", name, re.IGNORECASE) is not None


def datasheet_peak(device_name: str) -> dict[str, object]:
    """A CUDA device's peak for MFU (a run's ``step_flops`` meta): the datasheet's for PyTorch's default arithmetic
    there (TF32 convolutions where it has them), ``{"peak_tflops", "peak_of"}``; for a device the table lacks,
    ``{"peak_of": <the line that says so>}``."""
    key = match_accelerator(device_name)
    if key is None:
        return {"peak_of": unknown_device(device_name)}
    spec = ACCELERATORS[key]
    precision = spec.default_precision()
    return {"peak_tflops": spec.peak_tflops[precision], "peak_of": f"{spec.full_name} {precision} datasheet"}


def unknown_device(device_name: str) -> str:
    """The one line said where a CUDA device is not in the table: the name read, and what the table holds."""
    return f"{device_name!r} is not in stallscope's device table ({', '.join(ACCELERATORS)}): its peak is not known"
