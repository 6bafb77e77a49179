"""The Grafana dashboard and the alert rules the chart ships: every query names metrics and
labels the sidecar really exports (checked against a real `SidecarMetrics` registry)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import promql_parser
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sidecar.api.metrics import SidecarMetrics
from tests.support.promql_check import (
    Scrape,
    documented_alerts,
    exported_series,
    firing,
    labels_below,
    legend_labels,
    problems,
)

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "rsub-sidecar"
DASHBOARD = CHART / "dashboards" / "rsub.json"
# Grafana's own variables, as the dashboard uses them, by what they stand for in a query.
GRAFANA_VARIABLES = {"__rate_interval": "5m", "__interval": "1m", "__range": "1h"}


def grafana_to_promql(query: str) -> str:
    """A panel query with its `$variables` replaced: intervals by durations, the
    dashboard's own variables (label values) by a regex matching anything."""
    return re.sub(r"\$\{?(\w+)\}?", lambda m: GRAFANA_VARIABLES.get(m.group(1), ".*"), query)


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def dashboard_queries(dashboard: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(panel title, expr, legend) of every target."""
    return [
        (panel["title"], target["expr"], target.get("legendFormat", ""))
        for panel in panels(dashboard)
        for target in panel.get("targets", [])
    ]


def test_every_dashboard_query_names_exported_metrics_and_labels() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    series = exported_series()
    queries = dashboard_queries(dashboard)
    assert len(queries) >= 15
    found = {}
    for title, expr, legend in queries:
        promql = grafana_to_promql(expr)
        trouble = problems(promql, series)
        absent = legend_labels(legend) - labels_below(promql_parser.parse(promql), series)
        if trouble or absent:
            found[title] = [*trouble, *(f"legend shows absent label {a!r}" for a in absent)]
    assert found == {}


def test_dashboard_variables_query_exported_labels() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    series = exported_series()
    variables = [v for v in dashboard["templating"]["list"] if v["type"] == "query"]
    assert {v["name"] for v in variables} == {"job", "stream"}
    for variable in variables:
        match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", variable["query"]["query"])
        assert match, variable["query"]
        selector = grafana_to_promql(match.group(1))
        assert problems(selector, series) == []
        assert match.group(2) in labels_below(promql_parser.parse(selector), series)


def test_the_checks_catch_a_wrong_metric_or_label() -> None:
    series = exported_series()
    assert problems('rsub_updates_applied_total{origin="east"}', series) == []
    assert problems("rsub_updates_applied{}", series) == ["no metric 'rsub_updates_applied'"]
    assert problems('rsub_updates_sent_total{origin="east"}', series) == [
        "rsub_updates_sent_total has no label 'origin'"
    ]
    assert problems("sum by (reason) (rsub_updates_sent_total)", series) == [
        "grouping by absent label 'reason'"
    ]


def test_docs_dashboard_is_the_charts(helm_tool: ModuleType) -> None:
    assert (ROOT / "docs" / "grafana-dashboard.json").read_text() == DASHBOARD.read_text()
    values = helm_tool.load_values([CHART / "ci" / "full-values.yaml"])
    rendered = helm_tool.render(CHART, values, name="rsub-central", namespace="rsub")
    (config_map,) = [
        obj
        for _path, obj in helm_tool.manifests(rendered)
        if obj["kind"] == "ConfigMap" and obj["metadata"]["name"].endswith("-dashboard")
    ]
    assert config_map["metadata"]["namespace"] == "monitoring"
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "rsub"
    assert config_map["metadata"]["annotations"]["grafana_folder"] == "NATS"
    assert json.loads(config_map["data"]["rsub.json"]) == json.loads(DASHBOARD.read_text())


# ---- the alert rules (PrometheusRule) --------------------------------------------------------


def rendered_rules(helm_tool: ModuleType, values_file: str, **rule_values: Any) -> list[Any]:
    values = helm_tool.load_values([CHART / "ci" / values_file])
    values["prometheusRule"] = {**values.get("prometheusRule", {}), "enabled": True, **rule_values}
    rendered = helm_tool.render(CHART, values, name="rsub-central", namespace="rsub")
    (rule,) = [obj for _p, obj in helm_tool.manifests(rendered) if obj["kind"] == "PrometheusRule"]
    (group,) = rule["spec"]["groups"]
    rules: list[Any] = group["rules"]
    return rules


def test_rules_are_the_documented_alerts(helm_tool: ModuleType) -> None:
    documented = documented_alerts()
    assert len(documented) >= 11
    rendered = {
        rule["alert"]: (str(promql_parser.parse(rule["expr"])), rule.get("for", ""))
        for rule in rendered_rules(helm_tool, "minimal-values.yaml")
    }
    assert rendered == {
        name: (str(promql_parser.parse(expr)), for_) for name, (expr, for_) in documented.items()
    }


@pytest.mark.parametrize("values_file", ["minimal-values.yaml", "full-values.yaml"])
def test_every_rule_names_exported_metrics_and_labels(
    helm_tool: ModuleType, values_file: str
) -> None:
    series = exported_series()
    rules = rendered_rules(helm_tool, values_file)
    found = {}
    for rule in rules:
        expr = promql_parser.parse(rule["expr"])
        shown = set(re.findall(r"\$labels\.(\w+)", rule["annotations"]["summary"]))
        trouble = [
            *problems(rule["expr"], series),
            *(f"summary shows absent label {a!r}" for a in shown - labels_below(expr, series)),
        ]
        if trouble:
            found[rule["alert"]] = trouble
    assert found == {}
    assert all(rule["labels"]["severity"] in ("warning", "critical") for rule in rules)


def test_rule_thresholds_come_from_values(helm_tool: ModuleType) -> None:
    rules = {
        rule["alert"]: rule["expr"]
        for rule in rendered_rules(
            helm_tool, "minimal-values.yaml", originSilentSeconds=45, replayGapMessages=7
        )
    }
    assert rules["RsubOriginSilent"] == "rsub_origin_last_marker_age_seconds > 45"
    assert rules["RsubReplayGapHigh"] == "rsub_subscription_replay_gap_messages > 7"


class Region:
    """Two replicas' real registries on one fake clock, scraped as Prometheus would see
    them (a `pod` label each); `healthy()` is a tick of a region where all is well."""

    def __init__(self) -> None:
        self.now = 0.0
        self.leader, self.follower = (SidecarMetrics(clock=lambda: self.now) for _ in range(2))

    def scrape(self) -> Scrape:
        found: Scrape = {}
        for pod, metrics in (("p0", self.leader), ("p1", self.follower)):
            text = generate_latest(metrics.registry).decode()
            for family in text_string_to_metric_families(text):
                for s in family.samples:
                    found[(s.name, frozenset({**s.labels, "pod": pod}.items()))] = s.value
        return found

    def healthy(self) -> None:
        self.now += 1
        self.leader.snapshot_started("orders")
        self.leader.snapshot_completed("orders", 0.05)
        self.leader.marker_seen("orders", "east")
        self.leader.set_replay_gap("orders", "billing", "east", 10)
        self.leader.set_failover_exposure("orders", "billing", 3)
        for metrics, leads in ((self.leader, True), (self.follower, False)):
            metrics.set_leader(leads, 3)
            metrics.set_nats_connected(True)
            metrics.track_readiness(lambda: True)
            metrics.cursor_commit("orders", "ok")


def stall(region: Region) -> None:
    region.now += 200
    region.leader.snapshot_started("orders")


def silence(region: Region) -> None:
    region.now += 400


# What makes each alert fire, done to a healthy region (the documented thresholds).
FAULTS: dict[str, Callable[[Region], None]] = {
    "RsubSnapshotsStalled": stall,
    "RsubSnapshotsTimingOut": lambda r: r.leader.snapshot_timed_out("orders"),
    "RsubOriginSilent": silence,
    "RsubReplayGapHigh": lambda r: r.leader.set_replay_gap("orders", "billing", "east", 200_000),
    "RsubFailoverExposureHigh": lambda r: r.leader.set_failover_exposure(
        "orders", "billing", 200_000
    ),
    "RsubDataOfUnknownOrigin": lambda r: r.leader.data_unknown_origin("orders"),
    "RsubMarkersRejected": lambda r: r.leader.marker_rejected("orders", "stale_epoch"),
    "RsubNoLeader": lambda r: r.leader.set_leader(False, 3),
    "RsubTwoLeaders": lambda r: r.follower.set_leader(True, 4),
    "RsubNatsDown": lambda r: r.follower.set_nats_connected(False),
    "RsubNotReady": lambda r: r.follower.track_readiness(lambda: False),
}
# histogram_quantile and ratios are beyond the evaluator; metrics and labels checked above.
NOT_EVALUATED = {"RsubSnapshotsSlow", "RsubCursorCommitsFailing"}


def test_every_alert_is_quiet_when_healthy_and_fires_on_its_fault() -> None:
    alerts = documented_alerts()
    assert set(FAULTS) == set(alerts) - NOT_EVALUATED
    for name, (expr, _for) in alerts.items():
        if name in NOT_EVALUATED:
            with pytest.raises(ValueError, match="not evaluated"):
                firing(expr, {}, {}, 60)
            continue
        region = Region()
        region.healthy()
        start = region.scrape()
        region.healthy()
        healthy = region.scrape()
        assert firing(expr, start, healthy, 60) == set(), name
        FAULTS[name](region)
        assert firing(expr, healthy, region.scrape(), 60) != set(), name
