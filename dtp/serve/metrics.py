"""GET /metrics in Prometheus' text format (`prometheus_client`: the `metrics` extra), on rank 0.

    dtp_serve_requests_total{endpoint, status, replica}     HTTP answers by route template and status code
    dtp_serve_request_seconds{endpoint, replica}            their latency (histogram)
    dtp_serve_queue_wait_seconds{replica}                   from accepted to started, per job (histogram)
    dtp_serve_batch_size{replica}                           jobs per pipeline call (histogram)
    dtp_serve_steps_total{replica} / dtp_serve_step_seconds_total{replica}   denoising steps and their time
                                                                             (steps per second: their ratio)

The HTTP series carry replica "0" (rank 0 answers every request); with --replicas R the queue-wait, batch and step
series carry the replica that ran the batch (0 ... R - 1).

Without prometheus_client the server runs and /metrics answers 501 naming the extra. One registry per server (not
the library's global one), so tests can start several in one process.
"""

from __future__ import annotations

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32)


class Metrics:
    def __init__(self, replica: int = 0):
        import prometheus_client as prom

        self.replica = str(replica)
        self.registry = prom.CollectorRegistry()
        self._prom = prom
        metric = dict(registry=self.registry)
        self.requests = prom.Counter(
            "dtp_serve_requests", "HTTP answers by route and status", ["endpoint", "status", "replica"], **metric
        )
        self.latency = prom.Histogram(
            "dtp_serve_request_seconds", "HTTP latency", ["endpoint", "replica"], buckets=LATENCY_BUCKETS, **metric
        )
        self.wait = prom.Histogram(
            "dtp_serve_queue_wait_seconds", "accepted to started", ["replica"], buckets=LATENCY_BUCKETS, **metric
        )
        self.batch = prom.Histogram(
            "dtp_serve_batch_size", "jobs per pipeline call", ["replica"], buckets=BATCH_BUCKETS, **metric
        )
        self.steps = prom.Counter("dtp_serve_steps", "denoising steps run", ["replica"], **metric)
        self.step_seconds = prom.Counter("dtp_serve_step_seconds", "time in denoising steps", ["replica"], **metric)

    def answered(self, endpoint: str, status: int, seconds: float) -> None:
        self.requests.labels(endpoint, str(status), self.replica).inc()
        self.latency.labels(endpoint, self.replica).observe(seconds)

    def started(self, waits: list[float], replica: int | None = None) -> None:
        """A batch started (on `replica`, default this server's): each job's seconds in the queue."""
        label = self.replica if replica is None else str(replica)
        self.batch.labels(label).observe(len(waits))
        for seconds in waits:
            self.wait.labels(label).observe(seconds)

    def stepped(self, step_seconds: list[float], replica: int | None = None) -> None:
        label = self.replica if replica is None else str(replica)
        self.steps.labels(label).inc(len(step_seconds))
        self.step_seconds.labels(label).inc(sum(step_seconds))

    def text(self) -> tuple[bytes, str]:
        return self._prom.generate_latest(self.registry), self._prom.CONTENT_TYPE_LATEST


def make_metrics(replica: int = 0) -> Metrics | None:
    """Metrics, or None when prometheus_client is not installed."""
    try:
        return Metrics(replica)
    except ImportError:
        return None
