"""Direct rendering of metric families: text format 0.0.4 and OpenMetrics 1.0.0.

prometheus_client's encoders escape every metric and label name character by character and
format every label set afresh on every scrape; at a few thousand samples that is most of a
cold scrape. This renderer writes the same bytes for the families the exporter serves
(names of the legacy character set, no exemplars, timestamps or OpenMetrics-only samples),
with each label set rendered once and reused while the device (its label values) stays the
same. A label set unused for a generation (_GENERATION renders) is forgotten: per-process
label sets never repeat under PID churn, and a cache that kept them grew RSS by about
1.4 KiB each. A family outside that fast path is handed to prometheus_client's own encoder, so the
output stays what prometheus_client would write for any input (tests/test_render.py compares
the two on randomised families).
"""

from __future__ import annotations

import math
import re
import threading
from typing import Any, Callable, Iterable

from prometheus_client.exposition import generate_latest as _text_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.exposition import generate_latest as _openmetrics_latest
from prometheus_client.utils import floatToGoString

# no colon: prometheus_client's OpenMetrics encoder writes sample names with the label-name
# character set (a colon becomes "_" under escaping=underscores) in some versions
_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
# the types on the fast path, with their text-format name (histograms, summaries and state
# sets go to prometheus_client: none of the exporter's own families is one)
_TEXT_TYPES = {"counter": "counter", "gauge": "gauge", "info": "gauge", "unknown": "untyped", "untyped": "untyped"}
_OM_ONLY = ("_created", "_gsum", "_gcount")  # samples prometheus_client moves or renames in text
_CACHE_LIMIT = 20000  # label sets of one generation at most: a backstop, a host stays well under it
_GENERATION = 8  # renders per generation: a label set unused for 8-16 renders is dropped
_INF, _MINUS_INF = math.inf, -math.inf


def go_float(value: Any) -> str:
    """prometheus_client's floatToGoString, the same string for every input (its rarer
    branches, whose exponent format changed between versions, are its own)."""
    d = float(value)
    if d != d or d == _INF or d == _MINUS_INF:
        return floatToGoString(d)
    s = repr(d)
    if d > 0 and s.find(".") > 6:  # Go switches to exponents sooner than Python
        return floatToGoString(d)
    return s


def _value(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class _Slow(Exception):
    """This family is outside the fast path."""


class Renderer:
    """Renders families; keeps the label strings of the label sets it has seen (a label set
    is checked once, when it is first rendered). Safe to share between threads."""

    def __init__(self) -> None:
        # two generations: a hit in the old one moves to the young one; every _GENERATION
        # renders the young one becomes the old and what was left in the old is dropped.
        # Each dict operation is atomic; a label string lost to a concurrent swap is rebuilt.
        self._young: dict[tuple[tuple[str, str], ...], str] = {}
        self._old: dict[tuple[tuple[str, str], ...], str] = {}
        self._renders = 0
        self._swap = threading.Lock()
        self._names: dict[str, bool] = {}

    def cached_label_sets(self) -> int:
        """How many label strings are cached (both generations)."""
        return len(self._young) + len(self._old)

    def _rendered(self) -> None:
        with self._swap:
            self._renders += 1
            if self._renders % _GENERATION == 0:
                self._old, self._young = self._young, {}

    def _labelstr(self, labels: dict[str, str]) -> str:
        key = tuple(labels.items())
        young = self._young
        text = young.get(key)
        if text is None:
            text = self._old.get(key)
            if text is None:
                for k, v in key:
                    if not isinstance(k, str) or not _LABEL.match(k) or k.startswith("__") or not isinstance(v, str):
                        raise _Slow(k)
                text = "{" + ",".join(f'{k}="{_value(v)}"' for k, v in sorted(key)) + "}"
            if len(young) >= _CACHE_LIMIT:
                young.clear()  # more label sets in one generation than a host has: start afresh
            young[key] = text
        return text

    def _legacy(self, name: Any) -> bool:
        ok = self._names.get(name)
        if ok is None:
            ok = self._names[name] = isinstance(name, str) and bool(_NAME.match(name))
        return ok

    def _family(self, metric: Metric) -> list[str]:
        """The sample lines of a family on the fast path; _Slow when it is not."""
        if metric.type not in _TEXT_TYPES or not self._legacy(metric.name) or not isinstance(metric.documentation, str):
            raise _Slow(metric.name)
        legacy, labelstr, names = self._legacy, self._labelstr, self._names
        om_only = (metric.name + "_created", metric.name + "_gsum", metric.name + "_gcount")
        lines = []
        for s in metric.samples:
            name = s.name
            if s.timestamp is not None or s.exemplar is not None or s.value is None:
                raise _Slow(name)
            if not (names.get(name) or legacy(name)) or name in om_only:
                raise _Slow(name)
            labels = s.labels
            lines.append(f"{name}{labelstr(labels) if labels else ''} {go_float(s.value)}\n")
        return lines

    def text(self, metrics: Iterable[Metric]) -> bytes:
        """What prometheus_client.exposition.generate_latest writes."""
        out: list[str] = []
        for metric in metrics:
            try:
                lines = self._family(metric)
            except _Slow:
                out.append(_single(_text_latest, metric).decode("utf-8"))
                continue
            name = metric.name
            if metric.type == "counter":
                name += "_total"
            elif metric.type == "info":
                name += "_info"
            doc = metric.documentation.replace("\\", "\\\\").replace("\n", "\\n")
            out.append(f"# HELP {name} {doc}\n# TYPE {name} {_TEXT_TYPES[metric.type]}\n")
            out.extend(lines)
        self._rendered()
        return "".join(out).encode("utf-8")

    def openmetrics(self, metrics: Iterable[Metric]) -> bytes:
        """What prometheus_client.openmetrics.exposition.generate_latest writes."""
        out: list[str] = []
        for metric in metrics:
            try:
                if metric.unit and not self._legacy(metric.unit):
                    raise _Slow(metric.unit)
                lines = self._family(metric)
            except _Slow:
                body = _single(_openmetrics_latest, metric)
                out.append(body[: -len(b"# EOF\n")].decode("utf-8"))
                continue
            name = metric.name
            out.append(f"# HELP {name} {_value(metric.documentation)}\n# TYPE {name} {metric.type}\n")
            if metric.unit:
                out.append(f"# UNIT {name} {metric.unit}\n")
            out.extend(lines)
        out.append("# EOF\n")
        self._rendered()
        return "".join(out).encode("utf-8")


class _One:
    def __init__(self, metric: Metric) -> None:
        self._metric = metric

    def collect(self) -> list[Metric]:
        return [self._metric]


def _single(encoder: Callable[..., bytes], metric: Metric) -> bytes:
    return encoder(_One(metric))
