"""The arithmetic a built-in scenario's training runs in (``run --precision``, ``--channels-last``; issue #46).

- ``default``: PyTorch's own, left as it is. On CUDA that is TF32 convolutions (``torch.backends.cudnn.allow_tf32``
  is True) and full-precision matmuls (``torch.backends.cuda.matmul.allow_tf32`` is False): the run records both.
- ``fp32``: both TF32 switches off. ``tf32``: both on (an NVIDIA GPU of compute capability 8.0 or later).
- ``bf16`` / ``fp16``: autocast to that type for the forward and the loss (``torch.autocast``); ``fp16`` with a
  ``GradScaler`` (CUDA only: the CPU's autocast runs bfloat16). ``bf16`` on CUDA needs a device that has it.
- ``--channels-last``: the model and each 4-d input in ``torch.channels_last``.

On a simulated device the flags mean what they mean on CUDA, so that a real run and its twin differ only in
``--device`` (issue #57): ``--precision`` goes into the device string (:meth:`Precision.sim_device`: bf16 and fp16
are its ``amp``, the tensor cores' peak), refused where the simulated GPU has no peak for it as the real one would
refuse it; ``--channels-last`` is recorded, and the run says that the simulator's cost model has no memory format.
Bad input is a :class:`PrecisionError` whose message is the one line the command prints.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor, nn, optim

PRECISIONS = ("default", "fp32", "tf32", "bf16", "fp16")
AUTOCAST = {"bf16": "bfloat16", "fp16": "float16"}
SIM_PRECISION = {"fp32": "fp32", "tf32": "tf32", "bf16": "amp", "fp16": "amp"}  # --precision -> sim:...,precision=
CHANNELS_LAST_ON_SIM = (
    "the simulated device's cost model has no memory format: channels_last changes none of its figures"
)


class PrecisionError(ValueError):
    """A precision the device cannot run: the message names it and what is allowed."""


@dataclass(frozen=True, slots=True)
class Precision:
    name: str = "default"
    channels_last: bool = False

    @property
    def plain(self) -> bool:
        """Nothing to do in the step: PyTorch's defaults, contiguous memory."""
        return self.name in ("default", "fp32", "tf32") and not self.channels_last

    def check(self, device_kind: str, torch: ModuleType | None = None) -> None:
        """PrecisionError where ``device_kind`` ("cpu", "cuda", "sim") cannot run this precision."""
        if self.name not in PRECISIONS:
            raise PrecisionError(f"--precision {self.name!r}: allowed {', '.join(PRECISIONS)}")
        if device_kind == "cpu" and self.name in ("tf32", "fp16"):
            why = "TF32 is an NVIDIA GPU's" if self.name == "tf32" else "the CPU's autocast runs bfloat16"
            raise PrecisionError(f"--precision {self.name} needs CUDA ({why}): allowed on a CPU default, fp32, bf16")
        if device_kind == "cuda" and torch is not None:
            major, _minor = torch.cuda.get_device_capability()
            if self.name == "tf32" and major < 8:
                raise PrecisionError(f"--precision tf32 needs compute capability 8.0 or later; this GPU has {major}.x")
            if self.name == "bf16" and not torch.cuda.is_bf16_supported():
                raise PrecisionError("--precision bf16: this GPU has no bfloat16; allowed default, fp32, fp16")

    def sim_device(self, text: str, name: str, peaks: Collection[str]) -> str:
        """``--device`` ``text`` (a simulated GPU ``name`` with FLOP ``peaks``) with this precision in it; the text
        as given for ``default``. PrecisionError where the GPU has no peak for it (a real one of that kind would
        refuse it too), or where the text already names another precision."""
        if self.name == "default":
            return text
        want = SIM_PRECISION[self.name]
        if want not in peaks or (self.name == "bf16" and "tf32" not in peaks):  # bfloat16: Ampere and later
            allowed = [
                "default",
                "fp32",
                *(["tf32", "bf16"] if "tf32" in peaks else []),
                *(["fp16"] if "amp" in peaks else []),
            ]
            raise PrecisionError(
                f"--precision {self.name}: the simulated {name} has no {self.name} peak (as that GPU would not run "
                f"it); allowed {', '.join(allowed)}"
            )
        given = [item.partition("=")[2] for item in text.split(",")[1:] if item.startswith("precision=")]
        if given and SIM_PRECISION.get(given[-1], given[-1]) != want:
            raise PrecisionError(
                f"--precision {self.name} and --device {text!r} name different precisions: give one of them"
            )
        return text if given else f"{text},precision={self.name}"

    def sim_facts(self, precision: str) -> dict[str, object]:
        """What a simulated device's run computes in, for the store's meta (``precision``)."""
        facts: dict[str, object] = {
            "precision": self.name,
            "sim_precision": precision,
            "channels_last": self.channels_last,
        }
        if self.channels_last:
            facts["channels_last_note"] = CHANNELS_LAST_ON_SIM
        return facts

    def apply(self, torch: ModuleType, device_kind: str) -> dict[str, object]:
        """Set the TF32 switches it asks for; what the run computes in, for the store's meta (``precision``)."""
        if device_kind == "cuda" and self.name in ("fp32", "tf32"):
            torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = self.name == "tf32"
        facts: dict[str, object] = {
            "precision": self.name,
            "autocast": AUTOCAST.get(self.name),
            "grad_scaler": self.name == "fp16",
            "channels_last": self.channels_last,
        }
        if device_kind == "cuda":
            facts["cudnn_tf32"] = bool(torch.backends.cudnn.allow_tf32)
            facts["matmul_tf32"] = bool(torch.backends.cuda.matmul.allow_tf32)
        return facts

    def step(
        self, torch: ModuleType, device_type: str, train: Callable[..., object]
    ) -> Callable[[nn.Module, optim.Optimizer, Tensor, Tensor], object]:
        """A training step in this precision around ``train(model, opt, x, y, cast=, backward=, opt_step=)``
        (which runs the forward and the loss under ``cast``, then ``backward(loss)`` and ``opt_step(opt)``)."""
        dtype = getattr(torch, AUTOCAST[self.name]) if self.name in AUTOCAST else None
        scaler = torch.amp.GradScaler(device_type) if self.name == "fp16" else None
        memory = torch.channels_last if self.channels_last else None

        def backward(loss: Tensor) -> None:
            (scaler.scale(loss) if scaler is not None else loss).backward()

        def opt_step(opt: optim.Optimizer) -> None:
            if scaler is None:
                opt.step()
                return
            scaler.step(opt)
            scaler.update()

        def run(model: nn.Module, opt: optim.Optimizer, x: Tensor, y: Tensor) -> object:
            if memory is not None and getattr(x, "dim", lambda: 0)() == 4:
                x = x.contiguous(memory_format=memory)
            cast = torch.autocast(device_type, dtype=dtype) if dtype is not None else contextlib.nullcontext()
            return train(model, opt, x, y, cast=cast, backward=backward, opt_step=opt_step)

        return run
