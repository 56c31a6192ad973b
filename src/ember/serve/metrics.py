"""Server metrics in Prometheus' text exposition format (version 0.0.4), written by hand.

Counters, two gauges and three histograms; updated from the event loop and the engine thread
under one lock. Names follow vLLM's, with an `ember_` prefix.
"""

from __future__ import annotations

import bisect
import threading

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5)


class Histogram:
    """Cumulative buckets, a sum and a count, as Prometheus histograms are exposed."""

    def __init__(self, buckets: tuple[float, ...]) -> None:
        """A histogram over the given upper bounds (+Inf is added)."""
        self.bounds = tuple(sorted(buckets))
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        """Add one observation."""
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str) -> list[str]:
        """The _bucket, _sum and _count sample lines."""
        out, running = [], 0
        for bound, c in zip((*self.bounds, float("inf")), self.counts):
            running += c
            le = "+Inf" if bound == float("inf") else repr(float(bound))
            out.append(f'{name}_bucket{{le="{le}"}} {running}')
        out.append(f"{name}_sum {self.sum!r}")
        out.append(f"{name}_count {self.count}")
        return out


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class Metrics:
    """Everything GET /metrics reports."""

    def __init__(self, model_name: str = "") -> None:
        """Empty metrics for a server of `model_name`."""
        self._lock = threading.Lock()
        self.model_name = model_name
        self.requests: dict[tuple[str, str], int] = {}
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.running = 0
        self.waiting = 0
        self.ttft = Histogram(LATENCY_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(LATENCY_BUCKETS)

    def request(self, endpoint: str, status: int) -> None:
        """Count one answered request."""
        with self._lock:
            key = (endpoint, str(status))
            self.requests[key] = self.requests.get(key, 0) + 1

    def prompt_tokens(self, n: int) -> None:
        """Count prompt tokens accepted for generation."""
        with self._lock:
            self.prompt_tokens_total += n

    def generation_tokens(self, n: int) -> None:
        """Count generated tokens."""
        with self._lock:
            self.generation_tokens_total += n

    def set_sequences(self, running: int, waiting: int) -> None:
        """The scheduler's current running and queued sequence counts."""
        self.running, self.waiting = running, waiting

    def observe_ttft(self, seconds: float) -> None:
        """Time from a request's arrival to its first generated token."""
        with self._lock:
            self.ttft.observe(seconds)

    def observe_itl(self, seconds: float) -> None:
        """Time between two tokens of one sequence."""
        with self._lock:
            self.itl.observe(seconds)

    def observe_e2e(self, seconds: float) -> None:
        """Time from a generation request's arrival to its last token."""
        with self._lock:
            self.e2e.observe(seconds)

    def render(self) -> str:
        """The whole exposition text."""
        with self._lock:
            lines: list[str] = []

            def head(name: str, kind: str, help_text: str) -> None:
                lines.append(f"# HELP {name} {help_text}")
                lines.append(f"# TYPE {name} {kind}")

            head(
                "ember_requests_total", "counter", "HTTP requests answered, by endpoint and status."
            )
            for (endpoint, status), n in sorted(self.requests.items()):
                lines.append(
                    f'ember_requests_total{{endpoint="{_escape(endpoint)}",status="{status}"}} {n}'
                )
            head("ember_prompt_tokens_total", "counter", "Prompt tokens accepted for generation.")
            lines.append(f"ember_prompt_tokens_total {self.prompt_tokens_total}")
            head("ember_generation_tokens_total", "counter", "Tokens generated.")
            lines.append(f"ember_generation_tokens_total {self.generation_tokens_total}")
            head("ember_num_requests_running", "gauge", "Sequences being generated.")
            lines.append(f"ember_num_requests_running {self.running}")
            head("ember_num_requests_waiting", "gauge", "Sequences queued for admission.")
            lines.append(f"ember_num_requests_waiting {self.waiting}")
            for name, hist, help_text in (
                ("ember_time_to_first_token_seconds", self.ttft, "Arrival to first token."),
                ("ember_inter_token_latency_seconds", self.itl, "Time between two tokens."),
                ("ember_e2e_request_latency_seconds", self.e2e, "Arrival to last token."),
            ):
                head(name, "histogram", help_text)
                lines += hist.lines(name)
            head("ember_model_info", "gauge", "The model served (always 1).")
            lines.append(f'ember_model_info{{model="{_escape(self.model_name)}"}} 1')
            return "\n".join(lines) + "\n"
