"""The text of ``stallscope kernels TRACE``: figures from :mod:`profiler.kernels.analysis`, no computation here
beyond units."""

from __future__ import annotations

from profiler.kernels.analysis import TraceKernels


def _ms(us: float) -> str:
    return f"{us / 1e3:,.3f}"


def render(path: str, tk: TraceKernels, kernel_wait_us: float, *, hta_window: bool = False) -> str:
    lines = [
        f"trace: {path}" + (f" ({tk.device})" if tk.device else ""),
        f"device activity (kernels, copies, sets; measured by the profiler's CUPTI records): {tk.activities} on "
        f"{len(tk.streams)} stream(s), busy {_ms(tk.busy_us)} ms of {_ms(tk.span_us)} ms from the first to the last "
        f"({tk.busy_fraction:.1%})"
        + (
            " of the work HTA 0.5 analyses (launched before the last ProfilerStep began)"
            if hta_window and tk.steps
            else ""
        )
        if tk.activities
        else "device activity: none in this trace (a CPU-only trace?)",
    ]
    if tk.streams:
        lines += [
            "",
            f"idle per stream, ms (host wait: the next work was launched after the last ended; kernel wait: a gap "
            f"under {kernel_wait_us:g} us; other)"
            + (", as HTA 0.5 takes them (--hta-window: its window and rounded microseconds):" if hta_window else ":"),
            f"  {'stream':>8} {'busy':>12} {'idle':>12} {'host wait':>12} {'kernel wait':>12} {'other':>12}",
        ]
        for s in tk.streams:
            lines.append(
                f"  {s.stream:>8} {_ms(s.busy_us):>12} {_ms(s.idle_us):>12} {_ms(s.host_wait_us):>12} "
                f"{_ms(s.kernel_wait_us):>12} {_ms(s.other_us):>12}"
            )
    if tk.steps:
        lines += [
            "",
            "steps (ProfilerStep#N), ms: the device busy (any stream) and, where it idled, why: input (the work after "
            "the gap was launched late while the host was in a DataLoader's __next__), host (launched late "
            "otherwise), sync (queued, waiting), short (a short gap, a launch's latency):",
            f"  {'step':>6} {'span':>10} {'launched':>9} {'busy':>10} {'input':>10} {'host':>10} {'sync':>10} "
            f"{'short':>10} {'busy %':>7}",
        ]
        for st in tk.steps:
            lines.append(
                f"  {st.step:>6} {_ms(st.dur):>10} {st.activities:>9} {_ms(st.busy_us):>10} {_ms(st.input_us):>10} "
                f"{_ms(st.host_us):>10} {_ms(st.sync_us):>10} {_ms(st.short_us):>10} {st.busy_fraction:>7.1%}"
            )
    return "\n".join(lines)
