"""Checks PromQL written for the sidecar (dashboard panels, alert rules) against the series a
real `SidecarMetrics` registry exports: every metric named exists, and every label a query
matches, groups by or joins on is one that metric carries (or one Prometheus adds per target).
"""

from __future__ import annotations

import re
from pathlib import Path

import promql_parser
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sidecar.metrics import SidecarMetrics
from tests.support.metrics_kit import touch_every_metric

API_DOCS = Path(__file__).resolve().parents[2] / "docs" / "api.md"
# Labels Prometheus attaches to every series it scrapes through the chart's ServiceMonitor
# (`rsub_region` by the ServiceMonitor's relabeling, from the Service's `rsub.io/region`).
TARGET_LABELS = frozenset(
    {"job", "instance", "namespace", "pod", "service", "container", "endpoint", "rsub_region"}
)
# Series Prometheus writes itself for each target (with the target's labels only).
SCRAPE_SERIES = ("up",)


def exported_series() -> dict[str, frozenset[str]]:
    """Sample name (as queried: `_total`, `_bucket`, ...) -> its label names; with the
    series Prometheus writes per target (`up`)."""
    metrics = SidecarMetrics()
    touch_every_metric(metrics)
    text = generate_latest(metrics.registry).decode()
    series: dict[str, frozenset[str]] = dict.fromkeys(SCRAPE_SERIES, frozenset())
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            series[sample.name] = series.get(sample.name, frozenset()) | frozenset(sample.labels)
    return series


def labels_below(node: promql_parser.Expr, series: dict[str, frozenset[str]]) -> frozenset[str]:
    """Labels the series selected anywhere in `node` carry (the target's included)."""
    names: set[str] = set(TARGET_LABELS)

    def add(inner: promql_parser.Expr) -> None:
        if isinstance(inner, promql_parser.VectorSelector) and inner.name in series:
            names.update(series[inner.name])

    promql_parser.walk(node, pre_visit=add)
    return frozenset(names)


def problems(expr: str, series: dict[str, frozenset[str]]) -> list[str]:
    """What in `expr` names no exported metric or a label its metrics lack; [] when fine."""
    found: list[str] = []

    def visit(node: promql_parser.Expr) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            if node.name not in series:
                found.append(f"no metric {node.name!r}")
                return
            for matcher in node.matchers.matchers:
                if matcher.name not in series[node.name] | TARGET_LABELS:
                    found.append(f"{node.name} has no label {matcher.name!r}")
        elif isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
            missing = set(node.modifier.labels) - labels_below(node.expr, series)
            found.extend(f"grouping by absent label {name!r}" for name in sorted(missing))
        elif isinstance(node, promql_parser.BinaryExpr) and node.modifier is not None:
            matching = node.modifier.matching
            if matching is not None:
                missing = set(matching.labels) - (
                    labels_below(node.lhs, series) & labels_below(node.rhs, series)
                )
                found.extend(f"matching on absent label {name!r}" for name in sorted(missing))

    promql_parser.walk(promql_parser.parse(expr), pre_visit=visit)
    return found


def legend_labels(legend: str) -> set[str]:
    """The labels a Grafana legend (`{{job}} {{stream}}`) shows."""
    return set(re.findall(r"\{\{\s*(\w+)\s*\}\}", legend))


def documented_alerts() -> dict[str, tuple[str, str]]:
    """docs/api.md's "Suggested alerts" (the chart's rules): alert -> (expression, for)."""
    rows = re.findall(
        r"^\| `(Rsub\w+)` \| `([^`]+)` \| *(\S*) *\|", API_DOCS.read_text(), re.MULTILINE
    )
    return {name: (expr, for_) for name, expr, for_ in rows}
