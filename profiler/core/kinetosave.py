"""Kineto's trace export with the GIL released (issue #55: a kernel window's hand-over off the training thread).

torch's ``_ProfilerResult.save(path)`` is a pybind11 binding without a GIL release: kineto's C++ writes the whole
trace (about 100 ms for 35,000 activities) while every Python thread of the process waits, the training thread
too, although the window thread called it. The C++ it calls (``ProfilerResult::save``: ``ActivityTraceWrapper::
save``, then kineto's ``ChromeTraceLogger``) touches no Python object, so this module calls that same exported
function through ``ctypes``, which releases the GIL for the call: the training thread goes on stepping while the
trace is written.

It calls a C++ member function by its mangled name, so it first checks all it assumes, and where any check fails it
uses torch's own binding (the GIL held while kineto writes) and says which it used:

- Linux, and ``libtorch_cpu.so`` already loaded from torch's ``lib`` folder (``RTLD_NOLOAD``: never a second copy)
  with the libstdc++ (``__cxx11``) symbol ``torch::autograd::profiler::ProfilerResult::save(std::string const&)``;
- the result object is torch's ``_ProfilerResult``; the ``ProfilerResult*`` that pybind11 keeps just after the
  object's header (``object.__basicsize__``; or one pointer further, pybind11's non-simple layout) is the one whose
  first field (``trace_start_ns_``) equals what ``trace_start_ns()`` returns through the binding (a stray pointer
  cannot match a nanosecond timestamp), and whose ``events_`` vector is well formed;
- its trace (``std::unique_ptr<ActivityTraceWrapper>``, after the vector) is set, holds kineto's trace, and is not
  saved yet (its ``saved_`` flag): the two ``TORCH_CHECK``s that would otherwise throw a C++ exception through
  ``ctypes`` (which aborts the process) cannot fail;
- after the call, that ``saved_`` flag is set (the export ran).

The path goes over as a ``std::string`` laid out as libstdc++'s (pointer, length, capacity): the callee takes it
by const reference and only reads it. ``STALLSCOPE_KINETO_SAVE=binding`` forces torch's binding (benchmarks/
window_cost.py times both paths side by side). Standard library only: the start-up module of ``run --``
(profiler/zerocode/boot) loads this file by its path, in the script's own environment.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from collections.abc import Callable
from typing import Protocol

SYMBOL = "_ZN5torch8autograd8profiler14ProfilerResult4saveERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE"
ENV = "STALLSCOPE_KINETO_SAVE"  # "binding": torch's own save (the GIL held)
_HEADER = object.__basicsize__  # a PyObject's header; pybind11 keeps the C++ pointer right after it
_TRACE_AT = 8 + 3 * 8  # ProfilerResult: trace_start_ns_ (uint64), events_ (std::vector: 3 pointers), trace_
_SAVED_AT = 8  # ActivityTraceWrapper: trace_ (std::unique_ptr), saved_ (bool)
_found: dict[str, Callable[..., None] | None] = {}  # torch's lib folder -> the C++ save (None: not usable there)


class Results(Protocol):
    """What this module calls on torch's ``_ProfilerResult`` (``prof.profiler.kineto_results``)."""

    def trace_start_ns(self) -> int: ...

    def save(self, path: str) -> None: ...


class _StdString(ctypes.Structure):
    """libstdc++'s std::string (the C++11 ABI): data pointer, length, then 16 bytes (capacity, or the short buffer)."""

    _fields_ = [("data", ctypes.c_char_p), ("size", ctypes.c_size_t), ("capacity", ctypes.c_size_t),
                ("spare", ctypes.c_size_t)]  # fmt: skip


def lib_of(torch_module: object) -> str:
    """The ``lib`` folder of the torch module given (where ``libtorch_cpu.so`` is); "./lib" for one without a file
    (a test's stand-in: the binding is used there)."""
    return os.path.join(os.path.dirname(getattr(torch_module, "__file__", None) or "."), "lib")


def save(result: Results, path: str, lib_dir: str) -> tuple[str, float]:
    """Write ``result``'s trace (``prof.profiler.kineto_results``) to ``path``. Returns how ("native": the GIL
    released; "binding": torch's save, the GIL held) and the seconds the GIL was held here for it."""
    t0 = time.perf_counter()
    at = _native_target(result, lib_dir)
    if at is None:
        result.save(path)
        return "binding", time.perf_counter() - t0
    fn, address, wrapper = at
    data = path.encode()
    text = _StdString(data, len(data), len(data), 0)
    held = time.perf_counter() - t0
    fn(ctypes.c_void_p(address), ctypes.byref(text))  # ctypes releases the GIL for the call
    t1 = time.perf_counter()
    if not ctypes.c_bool.from_address(wrapper + _SAVED_AT).value:
        raise RuntimeError(f"kineto's export did not run (its trace is not marked saved): {path}")
    return "native", held + time.perf_counter() - t1


def _native_target(result: Results, lib_dir: str) -> tuple[Callable[..., None], int, int] | None:
    """(the C++ save, the ProfilerResult's and its ActivityTraceWrapper's addresses) where every check of the module
    holds, else None."""
    if os.environ.get(ENV) == "binding" or sys.platform != "linux" or type(result).__name__ != "_ProfilerResult":
        return None
    fn = _function(lib_dir)
    address = at_result(result)
    if fn is None or not address:
        return None
    wrapper = ctypes.c_void_p.from_address(address + _TRACE_AT).value
    if not wrapper or not ctypes.c_void_p.from_address(wrapper).value:
        return None
    if ctypes.c_uint8.from_address(wrapper + _SAVED_AT).value != 0:
        return None  # saved already: torch's binding raises its own error
    return fn, address, wrapper


def at_result(result: Results) -> int:
    """The address of the ``ProfilerResult`` behind torch's ``_ProfilerResult`` object, or 0 where the layout is not
    the one this module knows (see the module)."""
    want = int(result.trace_start_ns())
    if want <= 0:
        return 0
    first = ctypes.c_void_p.from_address(id(result) + _HEADER).value or 0
    for address in (first, ctypes.c_void_p.from_address(first).value or 0 if first else 0):
        if address and ctypes.c_uint64.from_address(address).value == want and _vector_ok(address + 8):
            return address
    return 0


def _vector_ok(address: int) -> bool:
    """A std::vector's three pointers (begin, end, end of storage) in order (all null when empty)."""
    begin, end, cap = (ctypes.c_size_t.from_address(address + 8 * i).value for i in range(3))
    return begin <= end <= cap and (begin > 0 or end == cap == 0)


def _function(lib_dir: str) -> Callable[..., None] | None:
    """The exported C++ save in the ``libtorch_cpu.so`` already loaded from ``lib_dir``, or None."""
    if lib_dir not in _found:
        fn = None
        try:
            lib = ctypes.CDLL(os.path.join(lib_dir, "libtorch_cpu.so"), mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
            fn = getattr(lib, SYMBOL)
            fn.restype, fn.argtypes = None, [ctypes.c_void_p, ctypes.c_void_p]
        except (OSError, AttributeError):
            fn = None
        _found[lib_dir] = fn
    return _found[lib_dir]
