"""Model FLOPs utilisation: the model's FLOPs per step over the time it took, against the device's datasheet peak.

Pure. The FLOPs of one training step (forward, loss, backward, SGD) are counted once on the meta device, the
simulator's count (profiler.sim.cost): meta ``sim_cost.flops`` on a simulated device, ``step_flops.flops`` on CUDA
(the runner counts them). Two rates:

- over step time: FLOPs x measured steps / their time: the achieved TFLOP/s of the training as it ran, and
  **MFU** = that / the peak;
- over kernel time: FLOPs / the kernels' busy time per step in the kernel windows (analysis.gpu): how fast the
  device computed while it computed.

The peak is the datasheet's for the precision the run used (a simulated device's own; on CUDA, PyTorch's default
arithmetic, TF32 convolutions where the device has them). SIMULATED on a simulated device, where the step time's
device part is predicted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from profiler.analysis.gpu import GpuSplit


@dataclass(frozen=True, slots=True)
class Mfu:
    flops_per_step: float
    flops_source: str
    peak_tflops: float  # NaN: the device's peak is not known
    peak_of: str
    tflops_step: float  # achieved over step time
    tflops_kernel: float  # over the kernels' busy time (NaN: no kernel window)
    simulated: bool

    @property
    def mfu(self) -> float:
        return self.tflops_step / self.peak_tflops if self.peak_tflops > 0 else math.nan

    def to_dict(self) -> dict[str, object]:
        def num(x: float) -> float | None:
            return None if math.isnan(x) else x

        return {
            "flops_per_step": self.flops_per_step,
            "flops_source": self.flops_source,
            "peak_tflops": num(self.peak_tflops),
            "peak_of": self.peak_of,
            "achieved_tflops_over_step_time": num(self.tflops_step),
            "achieved_tflops_over_kernel_time": num(self.tflops_kernel),
            "mfu": num(self.mfu),
            "simulated": self.simulated,
        }


def mfu_of(meta: dict[str, object], step_ms_mean: float, gpu: GpuSplit | None) -> Mfu | None:
    """The run's MFU (None: its FLOPs were not counted, or no step was measured)."""
    device = _dict(meta.get("device"))
    sim = _dict(device.get("sim")) or None
    if sim is not None:
        flops, source = _dict(meta.get("sim_cost")).get("flops"), "counted on the meta device (sim_cost)"
        peak, peak_of = sim.get("peak_tflops"), f"{sim.get('full_name')} {sim.get('precision')} datasheet (SIMULATED)"
    else:
        facts = _dict(meta.get("step_flops"))
        flops, source = facts.get("flops"), str(facts.get("source") or "")
        peak, peak_of = facts.get("peak_tflops"), str(facts.get("peak_of") or "peak not known for this device")
    if not isinstance(flops, (int, float)) or flops <= 0 or not step_ms_mean > 0:
        return None
    busy_s = gpu.part_s("busy") / len(gpu.steps) if gpu is not None and gpu.steps else math.nan
    return Mfu(
        float(flops),
        source,
        float(peak) if isinstance(peak, (int, float)) else math.nan,
        peak_of,
        flops / (step_ms_mean / 1e3) / 1e12,
        flops / busy_s / 1e12 if busy_s > 0 else math.nan,
        sim is not None,
    )


def _dict(x: object) -> dict[str, object]:
    return x if isinstance(x, dict) else {}
