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
import socket
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from profiler.analysis.gpu import window_source
from profiler.core.background import in_background
from profiler.core.sampler_process.views import ViewRecipe
from profiler.core.store import PhaseRow, StepRow
from profiler.export.endpoint import Endpoint, parse_endpoint
from profiler.export.metrics import Metric, job_metrics, run_metrics
from profiler.jobs.analysis_live import JobLiveAggregator
from profiler.live.analysis import LiveAggregator, TotalsFolder
from profiler.live.feeds import LiveFeed, Samples, SessionFeed, Steps

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from prometheus_client import CollectorRegistry
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
        windows = getattr(self.feed, "windows", None)  # a feed of kernel windows (the sampler process's, a store's)
        if callable(windows):
            self.agg.add_windows(windows(), window_source(self.feed.meta()))

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
        self._sock: socket.socket | None = None
        self.error: BaseException | None = None

    def start(self) -> PrometheusExporter:
        """Bind and serve; ExporterError (one line) when prometheus_client is missing or the address is unusable."""
        return self.bind().serve()

    def bind(self) -> PrometheusExporter:
        """Listen on the endpoint, serving nothing yet (:meth:`serve` here, or :meth:`recipe` in the sampler
        process); ExporterError as :meth:`start`."""
        _client()
        if self._sock is not None:
            return self
        sock = socket.socket(socket.AF_INET6 if ":" in self.endpoint.host else socket.AF_INET)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as http.server's own bind
            sock.bind((self.endpoint.host, self.endpoint.port))
            sock.listen()
            self._sock = sock
        except OSError as exc:  # in use, not an address of this host, not permitted (a port below 1024)
            sock.close()
            why = exc.strerror or str(exc)
            raise ExporterError(
                f"--prometheus {self.endpoint}: cannot listen there ({why}): allowed a free port on an address of "
                "this host"
            ) from None
        return self

    def serve(self) -> PrometheusExporter:
        """Answer scrapes on the bound socket from a thread of this process."""
        if self._server is None:
            from prometheus_client import CollectorRegistry

            registry = CollectorRegistry(auto_describe=False)
            registry.register(_Collector(self))
            self._server = _serve_on(self.bind()._socket(), registry)
        return self

    def recipe(self) -> ViewRecipe:
        """This endpoint served from the sampler process over its feed (the socket passed to it, bound here)."""
        fd = self.bind()._socket().fileno()
        return ViewRecipe("profiler.export.prometheus:serve_fd", pass_fds=(fd,), fd=fd, poll_s=self._poll_s)

    @property
    def serving(self) -> bool:
        """Answering scrapes from this process."""
        return self._server is not None

    def show(self, feed: LiveFeed) -> None:
        """Serve ``feed``'s figures as they are now, until :meth:`close` (a finished run's store)."""
        state = _RunState(feed)
        self.serve()
        with self._lock:
            self._state = state
            self._refresh(state)

    def _socket(self) -> socket.socket:
        assert self._sock is not None
        return self._sock

    @property
    def port(self) -> int:
        """The bound port (the one chosen for port 0)."""
        return int(self._sock.getsockname()[1]) if self._sock is not None else self.endpoint.port

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
        self.serve()

        def loop(done: threading.Event) -> None:
            while not done.wait(self._poll_s):
                with self._lock:
                    self._refresh(state)

        with self._lock:
            self._state = state
        try:
            with in_background(loop, name="stallscope-prometheus", join_s=max(2.0, 2 * self._poll_s)):
                yield self
        finally:
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
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    def __enter__(self) -> PrometheusExporter:
        return self.start() if self._server is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _client() -> None:
    """ExporterError (one line) when prometheus_client is missing."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise ExporterError(f"--prometheus needs the prometheus_client package: {INSTALL}") from None


def _serve_on(sock: socket.socket, registry: CollectorRegistry) -> WSGIServer:
    """prometheus_client's WSGI app served on an already bound socket, from a daemon thread."""
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

    from prometheus_client import make_wsgi_app

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True

    class Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

    host, port = sock.getsockname()[:2]
    server = Server((host, port), Quiet, bind_and_activate=False)
    server.socket.close()
    server.socket = sock
    server.server_name, server.server_port = host, port
    server.setup_environ()
    server.set_app(make_wsgi_app(registry))
    threading.Thread(target=server.serve_forever, name="stallscope-prometheus-http", daemon=True).start()
    return server


@contextlib.contextmanager
def serve_fd(feed: LiveFeed, *, fd: int, poll_s: float = 0.5) -> Iterator[PrometheusExporter]:
    """The sampler process's side of :meth:`PrometheusExporter.recipe`: scrapes answered on the socket the
    training process bound, from ``feed`` (the rows as they are drained)."""
    sock = socket.socket(fileno=fd)
    host, port = sock.getsockname()[:2]
    exporter = PrometheusExporter(Endpoint(host, port), poll_s=poll_s)
    exporter._sock = sock
    with exporter.serve(), exporter.follow(feed):
        yield exporter


def serve(endpoint: Endpoint | str | int) -> PrometheusExporter:
    """A started exporter on ``endpoint`` (``9464``, ``"0.0.0.0:9464"``), for integrations: follow a feed with
    :meth:`PrometheusExporter.follow`. ValueError for a bad endpoint, ExporterError when it cannot serve."""
    ep = endpoint if isinstance(endpoint, Endpoint) else parse_endpoint(str(endpoint))
    return PrometheusExporter(ep).start()


class ViewHost(Protocol):
    """A recorder that may serve views from another process (``profiler.core.hooks.Recorder.add_views``)."""

    def add_views(self, recipes: Sequence[ViewRecipe], fallback: Callable[[], object]) -> bool: ...


class SessionExporter:
    """``Session(..., prometheus=PORT)``: a Session hook serving the session's figures while it runs (the
    integrations pass their ``prometheus`` argument through to the Session). The endpoint is checked when made
    (ValueError), bound when the session starts (ExporterError: nothing is recorded yet), closed with it. With a
    ``host`` (the run's recorder) that serves views from its sampler process, the scrapes are answered there; else, or
    once it is lost, from this process."""

    def __init__(self, endpoint: str | int, host: ViewHost | None = None) -> None:
        self.endpoint = parse_endpoint(str(endpoint))
        self._host = host
        self._stack = contextlib.ExitStack()
        self._exporter: PrometheusExporter | None = None

    @property
    def url(self) -> str:
        return self._exporter.url if self._exporter is not None else ""

    def on_start(self, session: SessionView) -> None:
        exporter = PrometheusExporter(self.endpoint).bind()
        self._stack.callback(exporter.close)
        self._exporter = exporter

        def here() -> None:
            exporter.serve()
            self._stack.enter_context(exporter.follow(SessionFeed(session)))

        if self._host is None or not self._host.add_views([exporter.recipe()], here):
            here()

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
