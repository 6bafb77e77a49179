"""The Grafana dashboard and the alert rules the chart ships: every query names metrics and
labels the sidecar really exports (checked against a real `SidecarMetrics` registry). That
each alert fires in its fault on real sidecars: test_alerts_fire.py."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import promql_parser
import pytest

from tests.support.promql_check import (
    documented_alerts,
    exported_series,
    labels_below,
    legend_labels,
    problems,
)
from tests.support.promtool_alerts import Expect, ScrapeRecorder, Target, promtool_check

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
    assert rules["RsubOriginSilent"] == (
        "rsub_origin_last_marker_age_seconds > 45"
        " and on (job, stream) rate(rsub_snapshots_started_total[5m]) > 0"
    )
    assert rules["RsubReplayGapHigh"] == "rsub_subscription_replay_gap_messages > 7"


def runbook_sections() -> dict[str, str]:
    """The sections of docs/operations.md by the anchor GitHub makes of their heading: the
    text down to the next heading (lines of code blocks are never headings)."""
    sections: dict[str, str] = {}
    anchor, fenced = "", False
    for line in (ROOT / "docs" / "operations.md").read_text().splitlines():
        fenced ^= line.startswith("```")
        heading = None if fenced else re.match(r"#+ (.+)$", line)
        if heading:
            title = heading.group(1).strip().lower()
            anchor = re.sub(r"[^\w\- ]", "", title).replace(" ", "-")
            sections[anchor] = ""
        elif anchor:
            sections[anchor] += line + "\n"
    return sections


def test_every_alert_links_to_its_own_runbook_section(helm_tool: ModuleType) -> None:
    """Each alert's runbook_url is prometheusRule.runbookBaseUrl and the anchor of a section
    of docs/operations.md that is its own: no other alert links there, and it names the
    alert."""
    rules = rendered_rules(helm_tool, "full-values.yaml")
    base = "https://git.example.com/data-platform/rsub/blob/v0.1.0/docs/operations.md#"
    sections = runbook_sections()
    anchors = {}
    for rule in rules:
        alert, url = rule["alert"], rule["annotations"].get("runbook_url", "")
        assert url.startswith(base), (alert, url)
        anchor = anchors[alert] = url.removeprefix(base)
        assert anchor in sections, (alert, url)
        assert f"`{alert}`" in sections[anchor], (alert, anchor)
    assert len(anchors) == len(rules) == len(documented_alerts())
    assert len(set(anchors.values())) == len(anchors), anchors
    # The page's own table of the alerts ("Dashboard and alerts") links the same sections.
    table = re.findall(
        r"^\| `(Rsub\w+)` \| \[[^]]+\]\(#([\w-]+)\) \|$",
        (ROOT / "docs" / "operations.md").read_text(),
        re.M,
    )
    assert dict(table) == anchors
    default = rendered_rules(helm_tool, "minimal-values.yaml")
    assert {r["alert"]: r["annotations"]["runbook_url"] for r in default} == {
        alert: f"docs/operations.md#{anchor}" for alert, anchor in anchors.items()
    }


def test_a_region_without_a_sidecar_up_fires(helm_tool: ModuleType, tmp_path: Path) -> None:
    """RsubRegionDown and RsubSidecarDown on scrapes as Prometheus records them: a region whose
    every target fails (east), one with no target left (central), one with a replica down
    (west: that replica only)."""
    values = helm_tool.load_values([CHART / "ci" / "minimal-values.yaml"])
    values["prometheusRule"] = {"enabled": True}
    rules = helm_tool.prometheus_rules(helm_tool.render(CHART, values))
    targets = [
        Target(f"rsub-{region}", pod, "", region)
        for region, pod in [
            ("west", "west-0"),
            ("west", "west-1"),
            ("central", "central-0"),
            ("east", "east-0"),
        ]
    ]
    recorder = ScrapeRecorder(targets)
    up = {t.pod: ("up", tuple(sorted(t.labels().items()))) for t in targets}
    healthy, broken = 6, 14  # scrapes (30 s each) before the fault and in it
    recorder.scrapes = [{key: 1.0 for key in up.values()} for _ in range(healthy)]
    recorder.scrapes += [
        {up["west-0"]: 1.0, up["west-1"]: 0.0, up["east-0"]: 0.0} for _ in range(broken)
    ]
    fault = healthy  # the first scrape of the fault
    expects = [
        Expect(fault - 1),  # nothing pending while every target answers
        # `for: 1m`: pending at the fault's first scrape, firing two scrapes (1m) later.
        Expect(fault + 1, "RsubRegionDown", {"rsub_region": "east"}, fires=False),
        Expect(fault + 2, "RsubRegionDown", {"rsub_region": "east"}),
        Expect(fault + 2, "RsubRegionDown", {"rsub_region": "central"}),
        Expect(fault + 2, "RsubRegionDown", {"rsub_region": "west"}, fires=False),
        # `for: 5m`: ten scrapes.
        Expect(fault + 9, "RsubSidecarDown", {"pod": "west-1"}, fires=False),
        Expect(fault + 10, "RsubSidecarDown", {"pod": "west-1"}),
        Expect(fault + 10, "RsubSidecarDown", {"pod": "east-0"}),
        Expect(fault + 10, "RsubSidecarDown", {"pod": "west-0"}, fires=False),
        Expect(fault + 10, "RsubSidecarDown", {"pod": "central-0"}, fires=False),
    ]
    code, output = promtool_check(rules, recorder, expects, tmp_path)
    assert code == 0, output
