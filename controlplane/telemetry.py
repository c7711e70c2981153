"""What an operator watches: Prometheus metrics, structured (JSON) logs carrying the request id, and the
audit trail (one ``controlplane.audit`` line per write and per terminal session)."""

from __future__ import annotations

import contextvars
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from sr_common.logs import JsonFormatter, configure

__all__ = ["REQUEST_ID", "JsonFormatter", "RequestIdFilter", "Telemetry", "audit", "audit_log", "configure_logging"]

REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")
audit_log = logging.getLogger("controlplane.audit")
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class RequestIdFilter(logging.Filter):
    """Stamps every record with the id of the request it was logged under ("-" outside requests)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = REQUEST_ID.get()
        return True


def configure_logging(log_format: str, level: str) -> None:
    """Root logging for ``sr-controlplane``: text for people, json for log pipelines (sr_common.logs, the gateway's
    format), every line stamped with its request id."""
    configure(level, log_format, text="%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s",
              filters=[RequestIdFilter()])


def audit(action: str, *, who: Any, deployment: str | None, result: int | str, **extra: Any) -> None:
    """One audit line: who (user id and name), in which project, did what to which deployment, outcome."""
    fields = {
        "audit": True,
        "action": action,
        "user_id": getattr(who, "user_id", None),
        "user_name": getattr(who, "user_name", None),
        "project_id": getattr(who, "project_id", None),
        "deployment_id": deployment,
        "result": result,
        **extra,
    }
    audit_log.info("%s %s by %s: %s", action, deployment or "-", fields["user_id"] or "anonymous", result,
                   extra=fields)


class Telemetry:
    """The service's Prometheus metrics, in a registry of its own (one per app)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("sr_cp_http_requests", "HTTP requests by route, method and status",
                                ["route", "method", "status"], registry=self.registry)
        self.latency = Histogram("sr_cp_http_request_seconds", "HTTP request latency by route and method",
                                 ["route", "method"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.kube = Histogram("sr_cp_kubernetes_call_seconds", "Kubernetes API call latency by action and outcome",
                              ["action", "outcome"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.keystone = Histogram("sr_cp_keystone_call_seconds", "Keystone token validation latency by outcome",
                                  ["outcome"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.exec_sessions = Gauge("sr_cp_exec_sessions", "terminal sessions open now", registry=self.registry)
        self.leader = Gauge("sr_cp_reconciler_leader", "1 while this replica holds the reconciler Lease",
                            registry=self.registry)
        self.reconcile_lag = Gauge("sr_cp_reconciler_lag_seconds",
                                   "seconds since the leader's last complete reconcile pass", registry=self.registry)
        self.drift = Gauge("sr_cp_reconciler_drift", "records without workload / workloads without record",
                           ["kind"], registry=self.registry)
        self.dependency_up = Gauge("sr_cp_dependency_up",
                                   "1 when the dependency answered the last readiness probe (keystone, kubernetes)",
                                   ["dependency"], registry=self.registry)

    @contextmanager
    def timed(self, histogram: Histogram, **labels: str) -> Iterator[dict[str, str]]:
        """Observe the block's duration; the block may set ``outcome`` in the yielded dict."""
        state = {"outcome": "ok"}
        started = time.perf_counter()
        try:
            yield state
        except BaseException:
            state["outcome"] = "error"
            raise
        finally:
            histogram.labels(**labels, **({"outcome": state["outcome"]} if "outcome" in histogram._labelnames
                                          else {})).observe(time.perf_counter() - started)
