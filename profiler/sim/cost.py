"""What one training step costs the device: FLOPs, kernels and memory, counted once on the meta device.

API (the simulator relies on exactly this): ``measure_step(model_factory, sample, batch_size, *, precision,
loss=None, cost_forward=None, targets_in_forward=False) -> StepCost``; CostModelError (one line: why) when
the step cannot be traced on meta. Every figure is an estimate, never a measurement; what each one counts
(and leaves out) is in docs/sim.md, "The device model".
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeGuard

from profiler.sim.specs import PRECISIONS

if TYPE_CHECKING:
    import torch
    from torch._ops import OpOverload


class CostModelError(ValueError):
    """The model's step could not be traced on the meta device; the message is one line and says why."""


@dataclass(frozen=True, slots=True)
class StepCost:
    """One training step at ``batch_size``, as counted on the meta device (estimates, never measured)."""

    batch_size: int
    flops: float  # forward + backward + optimizer, as FlopCounterMode counts them (2 per multiply-add)
    kernels: int  # device kernels one step launches (aten ops that compute, views excluded)
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    activation_bytes: int  # tensors saved for backward at the step's peak
    precision: str
    # each kernel's (FLOPs, bytes it reads and writes), in launch order; () for a cost built by hand, whose
    # device time is then FLOPs over the achieved rate alone (profiler.sim.roofline)
    work: tuple[tuple[float, float], ...] = ()

    @property
    def bytes_moved(self) -> float:
        """Bytes the step's kernels read and write (the sum over ``work``)."""
        return sum(b for _, b in self.work)

    @property
    def memory_bytes(self) -> int:
        """Device memory the step needs (weights, gradients, optimizer state, saved activations)."""
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes + self.activation_bytes

    def to_dict(self) -> dict[str, float | str]:
        return {
            "batch_size": self.batch_size,
            "flops": self.flops,
            "kernels": self.kernels,
            "param_bytes": self.param_bytes,
            "grad_bytes": self.grad_bytes,
            "optimizer_bytes": self.optimizer_bytes,
            "activation_bytes": self.activation_bytes,
            "memory_bytes": self.memory_bytes,
            "bytes_moved": self.bytes_moved,
            "precision": self.precision,
        }


# cost_forward(model, x): a tensor, or a (nested) sequence or mapping of tensors, whose elements summed are the loss
CostForward = Callable[["torch.nn.Module", "torch.Tensor"], object]
# loss(model output, targets or None): the loss tensor
LossFn = Callable[[object, "torch.Tensor | None"], "torch.Tensor"]
ModelFactory = Callable[[], object]  # () -> nn.Module (checked: CostModelError otherwise)

# The runner's optimizer (profiler/drivers/runner.py); the cost of its step does not depend on the values.
_LR = 0.01
_MOMENTUM = 0.9
# One multi_tensor_apply launch takes at most this many tensor lists' worth of tensors (PyTorch's
# depth_to_max_tensors for two lists, as in ``_foreach_add_(params, bufs)``); a foreach op over more
# tensors launches once per chunk. Its further split by blocks (320 x 64 Ki elements per launch) is left out.
_FOREACH_TENSORS_PER_LAUNCH = 64

# The aten ops of a convolution (forward, and its input and weight gradients)
_CONVOLUTIONS = frozenset({"convolution", "convolution_backward"})

# Ops that allocate or record but run no device kernel; the dispatch-level count skips them beside views.
_NO_KERNEL_OPS = frozenset(
    {
        "empty",
        "empty_like",
        "empty_strided",
        "new_empty",
        "new_empty_strided",
        "_unsafe_view",  # a view the schema does not mark as aliasing (reshape of a fresh tensor)
        "_reshape_alias",
        "lift_fresh",
        "resize_",
        "set_",
        "is_same_size",
        "_has_compatible_shallow_copy_type",
        "sym_size",
        "sym_stride",
        "sym_numel",
        "sym_storage_offset",
    }
)


def measure_step(
    model_factory: ModelFactory,
    sample: Sequence[object],
    batch_size: int,
    *,
    precision: str = "fp32",
    loss: LossFn | None = None,
    cost_forward: CostForward | None = None,
    targets_in_forward: bool = False,
) -> StepCost:
    """Count one training step of ``model_factory()`` at ``batch_size`` on the meta device.

    ``sample`` is one dataset item ``(x, y)``: x a tensor (the batch is ``[batch_size, *x.shape]`` of its
    dtype), y an int or a tensor (targets: int64 ``[batch_size]`` for ints, ``[batch_size, *y.shape]`` of
    y's dtype for tensors). The step is ``loss(model(x), y)`` (``model(x, y)`` with ``targets_in_forward``;
    with no ``loss`` the sum of the output's elements stands in for it), backward, and the runner's SGD step.
    ``cost_forward(model, x)``, when given, replaces model and loss: it returns a tensor, or a sequence or
    mapping of tensors, whose elements summed are the traced loss, and y is not used.

    ``precision``: ``fp32`` counts each kernel's tensors; ``tf32`` adds, after each convolution, one kernel that
    reads and writes its channels-first (NCHW) 4-d floating-point tensors once more: cuDNN's tensor-core
    convolutions run in NHWC and transpose to it and back (an H200's trace of ResNet-18: 18% of the kernel time;
    docs/sim.md); ``amp`` is what its calibration measured, channels_last, with no transposes, and halves the
    bytes of floating-point saved activations (autocast keeps them in half precision) and keeps fp32 weights,
    gradients and optimizer state (AMP's master weights). Each kernel's ``work`` is its FLOPs and the bytes of the
    tensors it reads and writes; under ``amp`` the floating-point bytes of the forward and backward kernels are
    halved (the optimizer keeps fp32), and each weight of two or more dimensions adds two cast kernels (autocast's
    half copy of it in the forward, its gradient back to fp32 in the backward). FLOPs do not depend on precision.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    x_spec, y_spec = _sample_specs(sample, need_targets=cost_forward is None)
    step = _Step(model_factory, x_spec, y_spec, batch_size, loss, cost_forward, targets_in_forward)
    try:
        hash(step)
    except TypeError:  # an unhashable factory or loss (a callable object with __eq__): trace it every time
        trace = _trace(step)
    else:
        trace = _cached_trace(step)
    activation = trace.activation_bytes
    work = _work(trace, precision)
    if precision == "amp":
        activation -= trace.float_activation_bytes // 2
    return StepCost(
        batch_size=batch_size,
        flops=trace.flops,
        kernels=len(work),
        param_bytes=trace.param_bytes,
        grad_bytes=trace.grad_bytes,
        optimizer_bytes=trace.optimizer_bytes,
        activation_bytes=activation,
        precision=precision,
        work=work,
    )


def _work(trace: _Trace, precision: str) -> tuple[tuple[float, float], ...]:
    """Each kernel's (FLOPs, bytes) at ``precision`` (see :func:`measure_step`)."""
    if precision == "tf32":
        work: list[tuple[float, float]] = []
        for k in trace.launches:
            work.append((k.flops, k.nbytes))
            if k.layout_bytes:  # its tensors to NHWC and back: each read and written once more
                work.append((0.0, 2.0 * k.layout_bytes))
        return tuple(work)
    if precision != "amp":
        return tuple((k.flops, k.nbytes) for k in trace.launches)
    work = [(k.flops, k.nbytes if k.optimizer else k.nbytes - k.float_bytes / 2) for k in trace.launches]
    for numel in trace.cast_weights:  # fp32 -> half in the forward (4 + 2 bytes), half -> fp32 in the backward
        work += [(0.0, 6.0 * numel), (0.0, 6.0 * numel)]
    return tuple(work)


@dataclass(frozen=True, slots=True)
class _Launch:
    """One kernel of the traced step: its FLOPs, the bytes of the tensors it reads and writes (a foreach op's
    launches share its op's evenly), their floating-point part, and whether the optimizer launched it."""

    flops: float
    nbytes: float
    float_bytes: float
    optimizer: bool
    # a convolution's 4-d floating-point tensors in the channels-first (NCHW) layout, in bytes: what cuDNN's
    # tensor-core kernels transpose to NHWC and back around it (0 for any other op)
    layout_bytes: float = 0.0


@dataclass(frozen=True, slots=True)
class _Trace:
    flops: float
    kernels: int
    launches: tuple[_Launch, ...]
    cast_weights: tuple[int, ...]  # elements of each trainable weight of >= 2 dimensions (autocast casts them)
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    activation_bytes: int
    float_activation_bytes: int  # the part of activation_bytes in floating-point storages


# (shape, dtype name) of x; y: ("int",), ("tensor", shape, dtype name), or None when it is not used
_TensorSpec = tuple[tuple[int, ...], str]
_TargetSpec = tuple[str] | tuple[str, tuple[int, ...], str] | None


def _sample_specs(sample: Sequence[object], *, need_targets: bool) -> tuple[_TensorSpec, _TargetSpec]:
    import torch

    try:
        x, y = sample
    except (TypeError, ValueError):
        raise CostModelError(f"a sample must be one dataset item (x, y), got {type(sample).__name__}") from None
    if not isinstance(x, torch.Tensor):
        raise CostModelError(f"a sample's input must be a tensor, got {type(x).__name__}")
    x_spec = (tuple(x.shape), _dtype_name(x.dtype))
    if not need_targets:
        return x_spec, None
    if isinstance(y, int) and not isinstance(y, bool):
        return x_spec, ("int",)
    if isinstance(y, torch.Tensor):
        if y.dim() == 0 and not y.is_floating_point() and not y.is_complex():
            return x_spec, ("int",)
        return x_spec, ("tensor", tuple(y.shape), _dtype_name(y.dtype))
    raise CostModelError(
        f"cannot build meta targets from a {type(y).__name__} target (only ints and tensors): "
        "give the scenario a cost_forward"
    )


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True, slots=True)
class _Step:
    """What a trace depends on, hashable: the factory and loss by identity, the sample by shape and dtype."""

    model_factory: ModelFactory
    x_spec: _TensorSpec
    y_spec: _TargetSpec
    batch_size: int
    loss: LossFn | None
    cost_forward: CostForward | None
    targets_in_forward: bool


@functools.lru_cache(maxsize=64)
def _cached_trace(step: _Step) -> _Trace:
    # A sweep asks for the same step again and again (per batch size, per precision, per worker count).
    return _trace(step)


def _trace(step: _Step) -> _Trace:
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    model = _build_on_meta(step.model_factory)
    name = type(model).__name__
    x = torch.empty((step.batch_size, *step.x_spec[0]), dtype=getattr(torch, step.x_spec[1]), device="meta")
    y = _meta_targets(step.y_spec, step.batch_size)
    loss, cost_forward = step.loss, step.cost_forward
    params = [p for p in model.parameters() if p.requires_grad]
    saved = _SavedActivations([t.untyped_storage() for t in (*model.parameters(), *model.buffers())])
    try:
        # A model without trainable parameters (a pure reshape) has no optimizer step to count.
        opt = torch.optim.SGD(params, lr=_LR, momentum=_MOMENTUM, foreach=True) if params else None
        if opt is not None:
            _init_momentum(opt, params)
        flop_mode = FlopCounterMode(
            display=False, custom_mapping={torch.ops.aten.convolution_backward: _conv_backward_flops}
        )
        counter = _KernelLog(flop_mode.get_total_flops)
        with flop_mode, _counting_kernels(counter):
            with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
                if cost_forward is not None:
                    total = _sum_elements(cost_forward(model, x))
                else:
                    out = model(x, y) if step.targets_in_forward else model(x)
                    total = _sum_elements(out) if loss is None else loss(out, y)
            if total.requires_grad:
                total.backward()  # type: ignore[no-untyped-call]
            counter.optimizer = True
            if opt is not None:
                opt.step()
    except Exception as exc:  # noqa: BLE001 - any failure of the traced step is the one-line error below
        raise CostModelError(
            f"cannot trace {name} on the meta device: {type(exc).__name__}: {_first_line(exc)}"
            " (a scenario whose step cannot run on meta gives Scenario.cost_forward)"
        ) from None
    param_bytes = sum(_nbytes(p) for p in model.parameters())  # frozen weights take memory too
    grad_bytes = sum(_nbytes(p.grad) for p in params if p.grad is not None)
    states = opt.state.values() if opt is not None else ()
    optimizer_bytes = sum(_nbytes(v) for state in states for v in state.values() if _is_tensor(v))
    return _Trace(
        flops=float(flop_mode.get_total_flops()),
        kernels=len(counter.launches),
        launches=tuple(counter.launches),
        cast_weights=tuple(p.numel() for p in params if p.dim() >= 2 and p.is_floating_point()),
        param_bytes=param_bytes,
        grad_bytes=grad_bytes,
        optimizer_bytes=optimizer_bytes,
        activation_bytes=saved.total_bytes,
        float_activation_bytes=saved.float_bytes,
    )


def _conv_backward_flops(
    grad_out_shape: Sequence[int],
    x_shape: Sequence[int],
    w_shape: Sequence[int],
    _bias: object,
    _stride: object,
    _padding: object,
    _dilation: object,
    transposed: bool,
    _output_padding: object,
    _groups: object,
    output_mask: Sequence[bool],
    *args: object,
    **kwargs: object,
) -> int:
    """FLOPs of a convolution's backward: each of the input and weight gradients costs what the forward did.

    Every multiply-add x * w of the forward has one g * w in the input gradient and one g * x in the weight
    gradient. FlopCounterMode's own formula (torch 2.14) counts the weight gradient as a convolution with the
    batch as input channels and ignores ``groups``, so a depthwise convolution's is counted C times over
    (ssdlite's MobileNetV3 came out at 25 GFLOP/img instead of 2.7); for ungrouped convolutions both agree.
    """
    from torch.utils.flop_counter import conv_flop_count

    forward: int = conv_flop_count(list(x_shape), list(w_shape), list(grad_out_shape), transposed)
    return forward * (int(bool(output_mask[0])) + int(bool(output_mask[1])))


def _build_on_meta(model_factory: ModelFactory) -> torch.nn.Module:
    """The factory's module on the meta device, in train mode; CostModelError when it cannot be built."""
    import torch

    try:
        with torch.device("meta"):
            model = model_factory()
    except Exception:  # noqa: BLE001 - e.g. an init that reads values; build it for real and move it below
        model = None
    if model is None:
        try:
            model = model_factory()
        except Exception as exc:  # noqa: BLE001 - the factory itself fails: say so in one line
            raise CostModelError(
                f"cannot build the model of {_callable_name(model_factory)}: {type(exc).__name__}: {_first_line(exc)}"
            ) from None
    if not isinstance(model, torch.nn.Module):
        raise CostModelError(f"{_callable_name(model_factory)} built a {type(model).__name__}, not an nn.Module")
    # A factory that makes tensors on an explicit device escapes torch.device("meta"); move what it made.
    if any(t.device.type != "meta" for t in (*model.parameters(), *model.buffers())):
        model = model.to("meta")
    model.train()
    return model


def _meta_targets(y_spec: _TargetSpec, batch_size: int) -> torch.Tensor | None:
    import torch

    if y_spec is None:
        return None
    if len(y_spec) == 1:  # ("int",)
        return torch.empty(batch_size, dtype=torch.int64, device="meta")
    _, shape, dtype = y_spec
    return torch.empty((batch_size, *shape), dtype=getattr(torch, dtype), device="meta")


def _init_momentum(opt: torch.optim.Optimizer, params: Sequence[torch.Tensor]) -> None:
    """One untraced step on zero gradients: the momentum buffers exist, as in every step after the first."""
    import torch

    for p in params:
        p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)  # as the runner: backward allocates fresh gradients


def _sum_elements(out: object) -> torch.Tensor:
    """The sum of every element of a tensor, or of a (nested) sequence or mapping of tensors."""
    tensors = list(_tensors_in(out))
    if not tensors:
        raise TypeError(f"the traced output holds no tensor ({type(out).__name__})")
    total = tensors[0].sum()
    for t in tensors[1:]:
        total = total + t.sum()
    return total


def _tensors_in(out: object) -> Iterator[torch.Tensor]:
    if _is_tensor(out):
        yield out
    elif isinstance(out, Mapping):
        for value in out.values():
            yield from _tensors_in(value)
    elif isinstance(out, Sequence) and not isinstance(out, str | bytes):
        for value in out:
            yield from _tensors_in(value)


class _SavedActivations:
    """Bytes of the tensors autograd saves for backward: what the forward leaves on the device at its peak.

    Meta tensors have no data pointer, so storages are told apart by the identity of their Python storage
    object (``untyped_storage()`` returns the same object for the same storage; the hook keeps it alive, so
    the id is not reused). Each storage counts once at its full size: a view saved beside its base (ReLU's
    output and the next convolution's input) is not counted twice. Storages of parameters and buffers are
    left out (weights are counted as such). An estimate: the caching allocator's rounding, workspaces and
    temporaries freed inside the forward are not in it, and an op that recomputes rather than saves (or a
    backend that saves a different set than the meta kernels do) shifts it.
    """

    def __init__(self, resident: list[torch.UntypedStorage]) -> None:
        self._seen = {id(storage) for storage in resident}
        # alive, so that no other storage takes one of their ids
        self._keep: list[torch.UntypedStorage] = list(resident)
        self.total_bytes = 0
        self.float_bytes = 0

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if id(storage) not in self._seen:
            self._seen.add(id(storage))
            self._keep.append(storage)
            self.total_bytes += storage.nbytes()
            if t.is_floating_point():
                self.float_bytes += storage.nbytes()
        return t

    @staticmethod
    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t


class _KernelLog:
    """What :func:`_counting_kernels` records: one :class:`_Launch` per kernel; ``flops()`` reads the enclosing
    FlopCounterMode's running total, so that an op's FLOPs are the total's growth across it."""

    def __init__(self, flops: Callable[[], int]) -> None:
        self.flops = flops
        self.optimizer = False  # set once the optimizer's step begins
        self.launches: list[_Launch] = []

    def add(self, n: int, flops: float, tensors: Iterator[torch.Tensor], *, convolution: bool = False) -> None:
        import torch

        total = floating = layout = 0
        for t in tensors:
            nbytes = t.numel() * t.element_size()
            total += nbytes
            floating += nbytes if t.is_floating_point() else 0
            if convolution and t.dim() == 4 and t.is_floating_point():
                layout += nbytes if t.size(1) > 1 and not t.is_contiguous(memory_format=torch.channels_last) else 0
        self.launches += [_Launch(flops / n, total / n, floating / n, self.optimizer, layout / n)] * n


def _counting_kernels(log: _KernelLog) -> AbstractContextManager[object]:
    """A dispatch mode that records in ``log`` each device kernel the traced ops would launch, with its FLOPs and
    the bytes of the tensors it reads and writes (arguments and results; an in-place op's tensor twice: read and
    written).

    It must see the ops below autograd (the backward's and the optimizer's aten ops, not the Python calls that
    made them); ``TorchFunctionMode`` sees neither the backward nor the decomposition of composite ops, so
    this uses ``TorchDispatchMode`` from the private ``torch.utils._python_dispatch`` (the mode
    ``FlopCounterMode`` itself is built on). It is entered inside the FlopCounterMode, so an op reaches it
    first and the flop counter when it runs the op. The private import is confined to this function.
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    class _KernelCounter(TorchDispatchMode):  # type: ignore[no-untyped-call]
        def __torch_dispatch__(
            self,
            func: OpOverload,
            types: Sequence[type],
            args: tuple[object, ...] = (),
            kwargs: dict[str, object] | None = None,
        ) -> object:
            n = _launches(func, args)
            before = log.flops()
            out = func(*args, **(kwargs or {}))
            if n:
                conv = func.overloadpacket.__name__ in _CONVOLUTIONS
                log.add(n, float(log.flops() - before), _tensors_in((args, kwargs or {}, out)), convolution=conv)
            return out

    return _KernelCounter()  # type: ignore[no-untyped-call]


def _launches(func: OpOverload, args: tuple[object, ...]) -> int:
    """Kernels one dispatched aten op launches: 0 for views and metadata-only ops, chunks for foreach ops.

    The rule: an op whose schema says its output aliases its input (``is_view``: view, t, transpose, expand,
    slice, select, detach, alias, ...) or that only rewrites a tensor's sizes and strides in place (tag
    ``inplace_view``: t_, squeeze_, as_strided_) moves no data, so no kernel; nor do allocations and size
    queries (``_NO_KERNEL_OPS``) or the profiler's record_function markers. Everything else computes or
    copies, and counts one launch.
    """
    import torch

    if func.namespace == "profiler" or func.is_view or torch.Tag.inplace_view in func.tags:
        return 0
    name = func.overloadpacket.__name__
    if name in _NO_KERNEL_OPS:
        return 0
    if name.startswith("_foreach_") and args and isinstance(args[0], list | tuple):
        return max(1, math.ceil(len(args[0]) / _FOREACH_TENSORS_PER_LAUNCH))
    return 1


def _is_tensor(value: object) -> TypeGuard[torch.Tensor]:
    import torch

    return isinstance(value, torch.Tensor)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "(no message)"


def _callable_name(f: Callable[..., object]) -> str:
    return getattr(f, "__qualname__", None) or getattr(f, "__name__", None) or type(f).__name__
