"""Scraping a process's Prometheus ``/metrics`` in tests (tests/test_metrics.py, the
pipeline's metrics in tests/test_pipeline.py): the text is parsed by
prometheus_client's own parser, so a malformed exposition fails the test."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def scrape(address: str) -> dict:
    """``{(sample name, ((label, value), ...)): value}`` of the metrics at ``address``."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=60) as r:
        assert r.headers["Content-Type"].startswith("text/plain")
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def one(samples: dict, name: str, **labels) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def total(samples: dict, name: str, **labels) -> float:
    """The sum over the samples of ``name`` that carry ``labels`` (and any others)."""
    return sum(v for (n, ls), v in samples.items()
               if n == name and set(labels.items()) <= set(ls))
