"""The server's Prometheus metrics (prometheus-client), with vLLM's names under `memra:`.

    m = Metrics("smollm2-135m")
    m.prompt_tokens.inc(n); m.ttft.observe(s); m.render()   # text exposition format 0.0.4

Gauges: memra:num_requests_running, memra:num_requests_waiting, memra:kv_cache_usage_perc
(a fraction, 1 = full, as vLLM's). Counters: memra:prefix_cache_queries_total and
memra:prefix_cache_hits_total (prompt tokens looked up / found cached),
memra:prompt_tokens_total, memra:generation_tokens_total, memra:request_success_total
{finished_reason}, memra:spec_draft_tokens_total and memra:spec_accepted_tokens_total (draft
tokens verified / accepted by speculative decoding, `memra serve --spec`),
memra:forced_tokens_total (generated tokens a constraint forced: emitted without sampling and
fed with the sampled token before them in one step; counted in generation tokens too).
Histograms (seconds, vLLM's buckets): memra:time_to_first_token_seconds,
memra:inter_token_latency_seconds, memra:e2e_request_latency_seconds,
memra:request_queue_time_seconds. Every series carries model_name. Each server has its own
registry (no process-global state: tests run several servers in one process).
"""

from __future__ import annotations

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

CONTENT_TYPE = CONTENT_TYPE_LATEST
# no *_created series (as vLLM): they double the exposition and no dashboard reads them
prometheus_client.disable_created_metrics()

# vLLM's buckets (vllm/v1/metrics/loggers.py)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0)


class _Labelled:
    """A metric with its model_name label bound."""

    def __init__(self, metric, model: str):
        self.m = metric
        self.child = metric.labels(model_name=model) if "finished_reason" not in metric._labelnames else None
        self.model = model

    def __getattr__(self, name):
        return getattr(self.child, name)

    def labels(self, **kw):
        return self.m.labels(model_name=self.model, **kw)


class Metrics:
    def __init__(self, model_name: str):
        r = self.registry = CollectorRegistry(auto_describe=True)
        L = ["model_name"]

        def bind(m):
            return _Labelled(m, model_name)

        self.running = bind(Gauge("memra:num_requests_running", "Requests in the running batch.", L, registry=r))
        self.waiting = bind(Gauge("memra:num_requests_waiting", "Requests waiting for admission.", L, registry=r))
        self.kv_usage = bind(Gauge("memra:kv_cache_usage_perc", "Fraction of KV-cache blocks in use (1 = full).",
                                   L, registry=r))
        self.prefix_queries = bind(Counter("memra:prefix_cache_queries", "Prompt tokens looked up in the prefix "
                                           "cache.", L, registry=r))
        self.prefix_hits = bind(Counter("memra:prefix_cache_hits", "Prompt tokens found in the prefix cache.", L,
                                        registry=r))
        self.prompt_tokens = bind(Counter("memra:prompt_tokens", "Prompt tokens of admitted requests.", L,
                                          registry=r))
        self.generation_tokens = bind(Counter("memra:generation_tokens", "Generated tokens.", L, registry=r))
        self.spec_draft_tokens = bind(Counter("memra:spec_draft_tokens", "Draft tokens verified by "
                                              "speculative decoding.", L, registry=r))
        self.spec_accepted_tokens = bind(Counter("memra:spec_accepted_tokens", "Draft tokens accepted by "
                                                 "speculative decoding.", L, registry=r))
        self.forced_tokens = bind(Counter("memra:forced_tokens", "Generated tokens a constraint forced "
                                          "(emitted without sampling; fast-forward).", L, registry=r))
        self.success = bind(Counter("memra:request_success", "Finished requests by finish reason.",
                                    L + ["finished_reason"], registry=r))
        self.ttft = bind(Histogram("memra:time_to_first_token_seconds", "Arrival to first token.", L,
                                   buckets=TTFT_BUCKETS, registry=r))
        self.itl = bind(Histogram("memra:inter_token_latency_seconds", "Time between consecutive tokens of "
                                  "a request.", L, buckets=ITL_BUCKETS, registry=r))
        self.e2e = bind(Histogram("memra:e2e_request_latency_seconds", "Arrival to the last token.", L,
                                  buckets=LATENCY_BUCKETS, registry=r))
        self.queue = bind(Histogram("memra:request_queue_time_seconds", "Arrival to admission into the "
                                    "running batch.", L, buckets=LATENCY_BUCKETS, registry=r))

    def render(self) -> bytes:
        return generate_latest(self.registry)
