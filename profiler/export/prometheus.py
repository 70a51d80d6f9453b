"""A Prometheus endpoint of the live figures (``--prometheus [ADDR:]PORT``; docs/integrations.md "Prometheus").

:class:`PrometheusExporter` binds when started, then follows one run's or one job's live feed: a thread folds
the feed every ``poll_s``; a scrape computes the metrics (``profiler.export.metrics``) on the scraping thread.

Invariants:
- The training thread never waits on it; a feed that fails keeps the last figures served (its first error in
  ``error``, said once at close), and a run's final figures stay served until :meth:`close`.
- ``prometheus_client`` (the optional ``stallscope[prometheus]``) is imported in :meth:`PrometheusExporter.start`
  only; missing, it is one :class:`ExporterError` line.
- Its own registry (never the process-global one); 127.0.0.1 unless an address is given.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from profiler.core.store import PhaseRow, StepRow
from profiler.export.endpoint import Endpoint, parse_endpoint
from profiler.export.metrics import Metric, job_metrics, run_metrics
from profiler.jobs.analysis_live import JobLiveAggregator
from profiler.live.analysis import LiveAggregator, TotalsFolder
from profiler.live.feeds import LiveFeed, Samples, SessionFeed, Steps

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from prometheus_client.core import Metric as Family

    from profiler.core.hooks import SessionView

INSTALL = "pip install 'stallscope[prometheus]'"


class ExporterError(Exception):
    """The exporter cannot serve (missing dependency, address, port in use): one line for the user."""


class JobFeedLike(Protocol):
    """A job's live feed (``profiler.live.feeds.JobFeed``)."""

    def poll(self) -> tuple[dict[int, Steps], Samples]: ...

    def rank_meta(self) -> dict[int, dict[str, object]]: ...

    def rank_status(self, rank: int) -> str: ...

    def status(self) -> str: ...

    def meta(self) -> Mapping[str, object]: ...


class _RunState:
    def __init__(self, feed: LiveFeed) -> None:
        self.feed = feed
        self.agg = LiveAggregator(horizon_s=60)
        self.totals = TotalsFolder()

    def refresh(self) -> None:
        steps, samples = self.feed.poll()
        self.agg.add_steps(steps)
        self.totals.add_steps(steps)
        self.agg.add_samples(samples)

    def metrics(self) -> list[Metric]:
        return run_metrics(self.agg.snapshot(), self.totals.totals(), self.feed.meta(), self.feed.status())


class _JobState:
    def __init__(self, feed: JobFeedLike) -> None:
        self.feed = feed
        self.agg = JobLiveAggregator()
        self.totals: dict[int, TotalsFolder] = {}
        self.node: dict[str, float] = {}

    def refresh(self) -> None:
        steps, samples = self.feed.poll()
        metas = self.feed.rank_meta()
        for rank, rows in steps.items():
            self.agg.add_rank(rank, rows, metas.get(rank), self.feed.rank_status(rank))
            self.totals.setdefault(rank, TotalsFolder()).add_steps(rows)
        self.agg.add_node_samples(samples)
        if samples:
            self.node = samples[-1][1]

    def metrics(self) -> list[Metric]:
        totals = {rank: f.totals() for rank, f in self.totals.items()}
        return job_metrics(self.agg.snapshot(), totals, self.node, self.feed.meta(), self.feed.status())


class _Collector:
    """prometheus_client's custom-collector protocol: ``collect()`` computes the families at scrape time."""

    def __init__(self, exporter: PrometheusExporter) -> None:
        self._exporter = exporter

    def collect(self) -> Iterator[Family]:
        from prometheus_client.core import Metric as Family

        for m in self._exporter.metrics():
            if not m.samples:
                continue
            fam = Family(m.name, m.help, m.kind)
            suffix = "_total" if m.kind == "counter" else ""
            for labels, value in m.samples:
                fam.add_sample(m.name + suffix, labels, value)
            yield fam


class PrometheusExporter:
    """Serves ``/metrics`` on ``endpoint``; :meth:`follow` (a run) or :meth:`follow_job` (a job) says what of."""

    def __init__(self, endpoint: Endpoint, *, poll_s: float = 0.5) -> None:
        self.endpoint = endpoint
        self._poll_s = poll_s
        self._lock = threading.Lock()
        self._state: _RunState | _JobState | None = None
        self._server: WSGIServer | None = None
        self.error: BaseException | None = None

    def start(self) -> PrometheusExporter:
        """Bind and serve; ExporterError (one line) when prometheus_client is missing or the address is unusable."""
        try:
            from prometheus_client import CollectorRegistry, start_http_server
        except ImportError:
            raise ExporterError(f"--prometheus needs the prometheus_client package: {INSTALL}") from None
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(self))
        try:
            self._server, _thread = start_http_server(self.endpoint.port, addr=self.endpoint.host, registry=registry)
        except OSError as exc:  # in use, not an address of this host, not permitted (a port below 1024)
            why = exc.strerror or str(exc)
            raise ExporterError(
                f"--prometheus {self.endpoint}: cannot listen there ({why}): allowed a free port on an address of "
                "this host"
            ) from None
        return self

    @property
    def port(self) -> int:
        """The bound port (the one chosen for port 0)."""
        return int(self._server.server_port) if self._server is not None else self.endpoint.port

    @property
    def url(self) -> str:
        host = f"[{self.endpoint.host}]" if ":" in self.endpoint.host else self.endpoint.host
        return f"http://{host}:{self.port}/metrics"

    def metrics(self) -> list[Metric]:
        """The metrics now (also what a scrape serves): what is new in the feed folded first."""
        with self._lock:
            state = self._state
            if state is None:
                return []
            self._refresh(state)
            return state.metrics()

    def _refresh(self, state: _RunState | _JobState) -> None:
        try:
            state.refresh()
        except Exception as exc:  # noqa: BLE001 - a failing feed keeps the last figures; said once at close
            if self.error is None:
                self.error = exc

    @contextlib.contextmanager
    def _follow(self, state: _RunState | _JobState) -> Iterator[PrometheusExporter]:
        done = threading.Event()

        def loop() -> None:
            while not done.wait(self._poll_s):
                with self._lock:
                    self._refresh(state)

        with self._lock:
            self._state = state
        thread = threading.Thread(target=loop, name="stallscope-prometheus", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            done.set()
            thread.join(timeout=max(2.0, 2 * self._poll_s))
            with self._lock:
                self._refresh(state)  # the run's last steps and status stay served until close()

    def follow(self, feed: LiveFeed) -> contextlib.AbstractContextManager[PrometheusExporter]:
        """Serve ``feed``'s run while the block runs (and its final figures after it)."""
        return self._follow(_RunState(feed))

    def follow_job(self, feed: JobFeedLike) -> contextlib.AbstractContextManager[PrometheusExporter]:
        """Serve a job's ranks while the block runs."""
        return self._follow(_JobState(feed))

    def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()

    def __enter__(self) -> PrometheusExporter:
        return self.start() if self._server is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve(endpoint: Endpoint | str | int) -> PrometheusExporter:
    """A started exporter on ``endpoint`` (``9464``, ``"0.0.0.0:9464"``), for integrations: follow a feed with
    :meth:`PrometheusExporter.follow`. ValueError for a bad endpoint, ExporterError when it cannot serve."""
    ep = endpoint if isinstance(endpoint, Endpoint) else parse_endpoint(str(endpoint))
    return PrometheusExporter(ep).start()


class SessionExporter:
    """``Session(..., prometheus=PORT)``: a Session hook serving the session's figures while it runs (the
    integrations pass their ``prometheus`` argument through to the Session). The endpoint is checked when made
    (ValueError), bound when the session starts (ExporterError: nothing is recorded yet), closed with it."""

    def __init__(self, endpoint: str | int) -> None:
        self.endpoint = parse_endpoint(str(endpoint))
        self._stack = contextlib.ExitStack()
        self._exporter: PrometheusExporter | None = None

    @property
    def url(self) -> str:
        return self._exporter.url if self._exporter is not None else ""

    def on_start(self, session: SessionView) -> None:
        exporter = self._stack.enter_context(PrometheusExporter(self.endpoint))
        self._stack.enter_context(exporter.follow(SessionFeed(session)))
        self._exporter = exporter

    def on_meta(self, items: Mapping[str, object]) -> None:
        pass  # read from the session's feed at each scrape

    def on_step(self, row: StepRow, phases: Sequence[PhaseRow]) -> None:
        pass  # read from the session's bounded buffer at each scrape

    def on_event(self, kind: str, message: str) -> None:
        pass

    def on_close(self, status: str, error: str | None) -> None:
        self._stack.close()


def scrape_text(exporter: PrometheusExporter) -> str:
    """The exposition text a scrape would get now (tests, and a one-off dump without HTTP)."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(exporter))
    return generate_latest(registry).decode()


def metric_names(metrics: Sequence[Metric]) -> list[str]:
    return [m.name + ("_total" if m.kind == "counter" else "") for m in metrics]


__all__ = [
    "Endpoint",
    "ExporterError",
    "JobFeedLike",
    "PrometheusExporter",
    "SessionExporter",
    "metric_names",
    "parse_endpoint",
    "scrape_text",
    "serve",
]
