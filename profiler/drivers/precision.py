"""The arithmetic a built-in scenario's training runs in (``run --precision``, ``--channels-last``; issue #46).

- ``default``: PyTorch's own, left as it is. On CUDA that is TF32 convolutions (``torch.backends.cudnn.allow_tf32``
  is True) and full-precision matmuls (``torch.backends.cuda.matmul.allow_tf32`` is False): the run records both.
- ``fp32``: both TF32 switches off. ``tf32``: both on (an NVIDIA GPU of compute capability 8.0 or later).
- ``bf16`` / ``fp16``: autocast to that type for the forward and the loss (``torch.autocast``); ``fp16`` with a
  ``GradScaler`` (CUDA only: the CPU's autocast runs bfloat16). ``bf16`` on CUDA needs a device that has it.
- ``--channels-last``: the model and each 4-d input in ``torch.channels_last``.

A simulated device takes its precision in its own string (``sim:NAME,precision=...``): the flags are bad input
there. Bad input is a :class:`PrecisionError` whose message is the one line the command prints.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

PRECISIONS = ("default", "fp32", "tf32", "bf16", "fp16")
AUTOCAST = {"bf16": "bfloat16", "fp16": "float16"}


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

    def check(self, device_kind: str, torch: Any = None) -> None:
        """PrecisionError where ``device_kind`` ("cpu", "cuda", "sim") cannot run this precision."""
        if self.name not in PRECISIONS:
            raise PrecisionError(f"--precision {self.name!r}: allowed {', '.join(PRECISIONS)}")
        if device_kind == "sim" and (self.name != "default" or self.channels_last):
            flag = f"--precision {self.name}" if self.name != "default" else "--channels-last"
            raise PrecisionError(
                f"{flag} on a simulated device: give its precision in the device string instead "
                "(sim:NAME,precision=fp32|tf32|amp)"
            )
        if device_kind == "cpu" and self.name in ("tf32", "fp16"):
            why = "TF32 is an NVIDIA GPU's" if self.name == "tf32" else "the CPU's autocast runs bfloat16"
            raise PrecisionError(f"--precision {self.name} needs CUDA ({why}): allowed on a CPU default, fp32, bf16")
        if device_kind == "cuda" and torch is not None:
            major, _minor = torch.cuda.get_device_capability()
            if self.name == "tf32" and major < 8:
                raise PrecisionError(f"--precision tf32 needs compute capability 8.0 or later; this GPU has {major}.x")
            if self.name == "bf16" and not torch.cuda.is_bf16_supported():
                raise PrecisionError("--precision bf16: this GPU has no bfloat16; allowed default, fp32, fp16")

    def apply(self, torch: Any, device_kind: str) -> dict[str, object]:
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

    def step(self, torch: Any, device_type: str, train: Callable[..., Any]) -> Callable[[Any, Any, Any, Any], Any]:
        """A training step in this precision around ``train(model, opt, x, y, cast=, backward=, opt_step=)``
        (which runs the forward and the loss under ``cast``, then ``backward(loss)`` and ``opt_step(opt)``)."""
        dtype = getattr(torch, AUTOCAST[self.name]) if self.name in AUTOCAST else None
        scaler = torch.amp.GradScaler(device_type) if self.name == "fp16" else None
        memory = torch.channels_last if self.channels_last else None

        def backward(loss: Any) -> None:
            (scaler.scale(loss) if scaler is not None else loss).backward()

        def opt_step(opt: Any) -> None:
            if scaler is None:
                opt.step()
                return
            scaler.step(opt)
            scaler.update()

        def run(model: Any, opt: Any, x: Any, y: Any) -> Any:
            if memory is not None and getattr(x, "dim", lambda: 0)() == 4:
                x = x.contiguous(memory_format=memory)
            cast = torch.autocast(device_type, dtype=dtype) if dtype is not None else contextlib.nullcontext()
            return train(model, opt, x, y, cast=cast, backward=backward, opt_step=opt_step)

        return run
