"""The direct renderer writes what prometheus_client writes: the same bytes, text format 0.0.4
and OpenMetrics, on randomised families (odd names, quotes, backslashes, newlines and unicode
in names, help and label values, NaN and infinities, empty label values and sets) and on the
exporter's own families from a fake 8-GPU machine."""

from __future__ import annotations

import math
import string

from hypothesis import HealthCheck, given, settings, strategies as st
from prometheus_client.exposition import generate_latest as text_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest

from resmon_exporter.http.render import Renderer, go_float
from prometheus_client.utils import floatToGoString

LEGACY = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,12}", fullmatch=True)
ODD = st.text(alphabet=st.sampled_from(list('ab_:"\\\n{}=, .-é€😀') + list(string.digits)), min_size=0, max_size=8)
NAMES = st.one_of(LEGACY, LEGACY, LEGACY, ODD)
VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1.0, 1e6, 1234567.0, 1e22, 1e-7, math.nan, math.inf, -math.inf]),
    st.integers(min_value=-(2**63), max_value=2**64),
)
TEXT = st.text(alphabet=st.sampled_from(list('ab "\\\n\t=,{}é€😀\x00') + list(string.ascii_letters)), max_size=12)
LABELS = st.dictionaries(NAMES, st.one_of(st.just(""), TEXT), max_size=4)
TYPES = st.sampled_from(["counter", "gauge", "info", "unknown", "summary", "histogram", "stateset"])
SUFFIXES = {
    "counter": ["_total", "_created"], "info": ["_info"], "summary": ["_count", "_sum", ""],
    "histogram": ["_bucket", "_count", "_sum", "_created"], "stateset": [""], "gauge": [""], "unknown": [""],
}


@st.composite
def families(draw: st.DrawFn) -> list[Metric]:
    out = []
    for _ in range(draw(st.integers(min_value=0, max_value=4))):
        mtype = draw(TYPES)
        name = draw(NAMES)
        unit = draw(st.one_of(st.just(""), st.just(""), LEGACY))
        try:
            metric = Metric(name, draw(TEXT), mtype, unit)
        except ValueError:  # a name or unit prometheus_client refuses: no family
            continue
        for _ in range(draw(st.integers(min_value=0, max_value=4))):
            suffix = draw(st.sampled_from(SUFFIXES[mtype]))
            sample = draw(st.one_of(st.just(metric.name + suffix), st.just(metric.name + suffix), NAMES))
            timestamp = draw(st.one_of(st.none(), st.none(), st.none(), st.floats(min_value=0, max_value=2e9)))
            metric.add_sample(sample, draw(LABELS), draw(VALUES), timestamp)
        out.append(metric)
    return out


class Families:
    def __init__(self, metrics: list[Metric]) -> None:
        self._metrics = metrics

    def collect(self) -> list[Metric]:
        return self._metrics


SHARED = Renderer()  # one renderer across examples: its label cache must never change an answer


def same(reference, direct, metrics: list[Metric]) -> None:
    try:
        expected = reference(Families(metrics))
    except Exception as exc:  # prometheus_client refuses this input: so must the renderer
        failed = None
        try:
            direct(metrics)
        except Exception as err:
            failed = err
        assert failed is not None, f"prometheus_client raised {exc!r}, the renderer did not"
        return
    assert direct(metrics) == expected
    assert direct(metrics) == expected  # again, from the label cache


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(families())
def test_text_format_is_byte_identical(metrics):
    same(text_latest, SHARED.text, metrics)
    same(text_latest, Renderer().text, metrics)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(families())
def test_openmetrics_is_byte_identical(metrics):
    same(openmetrics_latest, SHARED.openmetrics, metrics)
    same(openmetrics_latest, Renderer().openmetrics, metrics)


@given(VALUES)
def test_floats_are_formatted_as_go_does(value):
    assert go_float(value) == floatToGoString(value)


def test_a_changed_label_value_is_not_served_from_the_cache():
    renderer = Renderer()
    for value in ("a", 'b"\\\n', "a"):
        metric = Metric("resmon_x", "help", "gauge")
        metric.add_sample("resmon_x", {"gpu": "0", "name": value}, 1.0)
        assert renderer.text([metric]) == text_latest(Families([metric]))


# -- the exporter's own families, from the fake NVML in process --------------------------

import pytest  # noqa: E402

from resmon_exporter import ResourceMonitor  # noqa: E402
from resmon_exporter.collectors.registry import ResourceCollector  # noqa: E402
from resmon_exporter.http.routes import DEFAULT_COLLECTORS, PinnedExposition  # noqa: E402
from fakenvml import Scenario, load_in_process  # noqa: E402
from scenarios import health_machine, profiling_machine, three_gpus  # noqa: E402


@pytest.mark.parametrize("machine", [three_gpus, health_machine, profiling_machine])
def test_the_exporters_own_families_render_as_prometheus_client_renders_them(machine, fake_libs, tmp_path_factory, tmp_path, monkeypatch):
    load_in_process(fake_libs["current"], tmp_path_factory.getbasetemp() / "in-process-trace.txt")
    scenario = Scenario(tmp_path / "scenario.txt", machine())
    monkeypatch.setenv("FAKE_NVML_SCENARIO", str(scenario.path))
    renderer = Renderer()
    with ResourceMonitor(gpu_backend="nvml", cache_ttl=0, collect_processes=True, collect_kubernetes=False) as m:
        collector = ResourceCollector(m)
        for _ in range(2):  # the second time from the label cache
            snap = m.snapshot()
            families = tuple(collector.families(snap))
            assert len(families) > 20
            for names in (None, frozenset({"resmon_gpu_up", "process_resident_memory_bytes"})):
                # collected once: the process_* values move between two collections
                frozen = list(PinnedExposition(DEFAULT_COLLECTORS, families, names).collect())
                assert renderer.text(frozen) == text_latest(Families(frozen))
                assert renderer.openmetrics(frozen) == openmetrics_latest(Families(frozen))


def test_the_label_cache_stays_bounded_under_pid_churn() -> None:
    """Per-process label sets never repeat when PIDs churn: the cache must forget those unused
    for a few renders, not grow to its 20,000-entry backstop (about 1.4 KiB each)."""
    renderer = Renderer()
    steady = [{"gpu": str(g), "uuid": f"GPU-{g}"} for g in range(8)]
    for render in range(300):
        metric = Metric("resmon_gpu_process_memory_used_bytes", "VRAM.", "gauge")
        for labels in steady:
            metric.add_sample(metric.name, labels, 1.0)
        for p in range(64):  # 64 processes that exit before the next scrape
            metric.add_sample(metric.name, {"gpu": "0", "uuid": "GPU-0", "pid": str(render * 64 + p)}, 2.0)
        assert renderer.text([metric]) == text_latest(Families([metric]))
    cached = renderer.cached_label_sets()
    assert cached <= 8 + 2 * 8 * 64, cached  # the steady sets plus at most two generations of churn
    for labels in steady:  # the steady label sets are still cached (rendered once, reused)
        assert tuple(labels.items()) in renderer._young or tuple(labels.items()) in renderer._old


# -- the render cache ----------------------------------------------------------------------

import itertools  # noqa: E402

from resmon_exporter.config import COLLECTOR_NAMES  # noqa: E402
from resmon_exporter.http.routes import OPENMETRICS as OPENMETRICS_TYPE, TEXT as TEXT_TYPE, RenderCache  # noqa: E402


def test_the_render_cache_stays_bounded_when_a_client_walks_every_collect_selection() -> None:
    """One body per (format, gzip, collect[] set) grew to every combination a client asked
    for within a snapshot (1,020 of them raised RSS by 16-36 MiB, never returned): the
    selections are a small LRU, the plain scrapes (no collect[]) always stay."""
    cache = RenderCache()
    snap = object()  # the cache compares snapshots by identity
    rendered: list[tuple[str, bool, frozenset[str] | None]] = []

    def get(key: tuple[str, bool, frozenset[str] | None]) -> bytes:
        def render() -> bytes:
            rendered.append(key)
            return repr(key).encode() * 100

        body = cache.get(snap, key, render)  # type: ignore[arg-type]
        assert body == repr(key).encode() * 100
        return body

    formats = [(fmt, gz) for fmt in (TEXT_TYPE, OPENMETRICS_TYPE) for gz in (False, True)]
    plain = [(fmt, gz, None) for fmt, gz in formats]
    selections = [frozenset(c) for r in range(1, len(COLLECTOR_NAMES) + 1)
                  for c in itertools.combinations(COLLECTOR_NAMES, r)]
    walked = [(fmt, gz, s) for s in selections for fmt, gz in formats]
    assert len(walked) > 1000
    for key in plain + walked:
        get(key)
    rendered.clear()
    for key in walked:  # the same walk again: what is still cached is served without a render
        get(key)
    kept = len(walked) - len(rendered)
    assert kept <= RenderCache.SELECTIONS, kept
    assert len(cache) <= len(plain) + RenderCache.SELECTIONS, len(cache)
    rendered.clear()
    for key in plain:  # the common scrape still comes from the cache after the walk
        get(key)
    assert rendered == [], rendered
    # a selection asked for again and again (a second job's collect[]) stays cached too
    again = (TEXT_TYPE, False, frozenset({"host"}))
    get(again)
    rendered.clear()
    for key in walked[:50]:
        get(again)
        get(key)
    assert again not in rendered, rendered.count(again)
    # and a new snapshot renders everything afresh
    snap = object()
    rendered.clear()
    get(plain[0])
    assert rendered == [plain[0]]
