"""Lint, render and validate the Helm chart offline, without a helm binary or a cluster.

Helm's own engine comes from the `helm-python-sdk` package (libhelm_c, Helm v4); the
rendered manifests are checked with `kubernetes-validate` in strict mode against the
Kubernetes versions given.

    python scripts/helm_tool.py lint helm/rsub-sidecar -f helm/examples/west.yaml
    python scripts/helm_tool.py template helm/rsub-sidecar -f helm/examples/west.yaml
    python scripts/helm_tool.py validate helm/rsub-sidecar -f helm/examples/*.yaml -k 1.31 -k 1.37
    python scripts/helm_tool.py ci helm/rsub-sidecar
    python scripts/helm_tool.py rules helm/rsub-sidecar -f helm/rsub-sidecar/ci/full-values.yaml

`ci` is what chart-testing's `ct lint` does, plus rendering and validation: each
`<chart>/ci/*-values.yaml` on its own, linted strict, rendered and validated. `rules` prints
the rendered PrometheusRule's `spec`, a Prometheus rules file (for `promtool`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate  # type: ignore[import-untyped]
import yaml

DEFAULT_KUBE_VERSIONS = ("1.29", "1.33", "1.37")
_SEVERITY = {0: "UNKNOWN", 1: "INFO", 2: "WARNING", 3: "ERROR"}


class ChartError(Exception):
    """The chart failed lint, schema, rendering or manifest validation."""


def load_values(files: Sequence[Path], sets: Sequence[str] = ()) -> dict[str, Any]:
    """Merge values files (later ones win, deeply) and `--set` expressions, as helm does."""
    merged: dict[str, Any] = {}
    for path in files:
        _deep_merge(merged, helm.values_from_yaml(path.read_text(encoding="utf-8")))
    for expression in sets:
        _deep_merge(merged, helm.parse_set_string(expression))
    return merged


def _deep_merge(into: dict[str, Any], new: dict[str, Any]) -> None:
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _deep_merge(into[key], value)
        else:
            into[key] = value


def lint(chart: Path, values: dict[str, Any], *, strict: bool = True) -> list[str]:
    """Helm lint findings as lines; raise ChartError if any is an error (or, strict, a warning)."""
    report = helm.lint(chart, values, strict=strict)
    lines = [
        f"[{_SEVERITY.get(m['severity'], m['severity'])}] {m['path']}: {m['error']}"
        for m in report["messages"]
    ]
    worst = max((m["severity"] for m in report["messages"]), default=0)
    if report["errors"] or worst >= (2 if strict else 3):
        # Errors usually repeat a message's text; show each once.
        said = {m["error"] for m in report["messages"]}
        extra = [e for e in report["errors"] if e not in said]
        raise ChartError("\n".join(["helm lint failed:", *lines, *extra]))
    return lines


def ci_values_files(chart: Path) -> list[Path]:
    """The chart's `ci/*-values.yaml`, as chart-testing finds them."""
    return sorted((chart / "ci").glob("*-values.yaml"))


def check_ci(
    chart: Path, kube_versions: Sequence[str], files: Sequence[Path] | None = None
) -> list[str]:
    """Lint (strict), render and validate each ci values file (default: all of them) as its
    own release; raise ChartError on the first failure."""
    files = ci_values_files(chart) if files is None else files
    if not files:
        raise ChartError(f"no ci/*-values.yaml in {chart}")
    lines: list[str] = []
    for path in files:
        values = load_values([path])
        try:
            lint(chart, values, strict=True)
            validate(render(chart, values, name=f"rsub-{path.stem}"), kube_versions)
        except ChartError as exc:
            raise ChartError(f"{path}:\n{exc}") from exc
        lines.append(f"ok       {path} (lint, render, validate on {', '.join(kube_versions)})")
    return lines


def render(
    chart: Path, values: dict[str, Any], *, name: str = "rsub", namespace: str = "rsub"
) -> dict[str, str]:
    """Template path -> rendered manifest, after checking values against values.schema.json."""
    return {
        path: text
        for path, text in sorted(_render_all(chart, values, name, namespace).items())
        if path.endswith((".yaml", ".yml")) and text.strip()
    }


def notes(
    chart: Path, values: dict[str, Any], *, name: str = "rsub", namespace: str = "rsub"
) -> str:
    """The rendered NOTES.txt, what `helm install` prints."""
    rendered = _render_all(chart, values, name, namespace)
    return next(text for path, text in rendered.items() if path.endswith("/NOTES.txt"))


def _render_all(chart: Path, values: dict[str, Any], name: str, namespace: str) -> dict[str, str]:
    with helm.Chart.load(chart) as loaded:
        merged = loaded.merge_values(values)
        try:
            loaded.validate_schema(merged)
            rendered: dict[str, str] = loaded.render(
                values, name=name, namespace=namespace, is_install=True
            )
        except helm.HelmError as exc:
            raise ChartError(str(exc)) from exc
    return rendered


def manifests(rendered: dict[str, str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(template path, object) for every Kubernetes object in the rendered templates."""
    for path, text in rendered.items():
        for doc in yaml.safe_load_all(text):
            if doc:
                yield path, doc


def prometheus_rules(rendered: dict[str, str]) -> dict[str, Any]:
    """The `spec` of the rendered PrometheusRule: a Prometheus rules file (`groups: ...`)."""
    found = [obj for _path, obj in manifests(rendered) if obj.get("kind") == "PrometheusRule"]
    if len(found) != 1:
        raise ChartError(f"{len(found)} PrometheusRule rendered (prometheusRule.enabled?)")
    spec: dict[str, Any] = found[0]["spec"]
    return spec


def validate(rendered: dict[str, str], kube_versions: Sequence[str]) -> list[str]:
    """Strict kubernetes-validate of every object for every version; raise ChartError on failure.

    Returns report lines; objects whose kind has no built-in schema (CRDs such as the
    ServiceMonitor) are reported as skipped, never as passed.
    """
    lines: list[str] = []
    failures: list[str] = []
    for path, obj in manifests(rendered):
        what = f"{path} {obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
        for version in kube_versions:
            try:
                checked = kubernetes_validate.validate(obj, version, strict=True)
                lines.append(f"ok       {what} (Kubernetes {checked}, strict)")
            except kubernetes_validate.SchemaNotFoundError:
                lines.append(f"skipped  {what}: no schema for {obj.get('apiVersion')} (CRD)")
            except kubernetes_validate.ValidationError as exc:
                where = ".".join(str(p) for p in exc.path)
                failures.append(f"INVALID  {what} (Kubernetes {version}): {where}: {exc.message}")
    if failures:
        raise ChartError("\n".join(failures))
    return lines


def to_yaml_stream(rendered: dict[str, str]) -> str:
    return "".join(f"---\n# Source: {path}\n{text.strip()}\n" for path, text in rendered.items())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ci = sub.add_parser("ci", help="lint, render and validate every ci/*-values.yaml")
    ci.add_argument("chart", type=Path)
    ci.add_argument(
        "-k", "--kube-version", action="append", help=f"default: {DEFAULT_KUBE_VERSIONS}"
    )
    for command in ("lint", "template", "validate", "rules"):
        p = sub.add_parser(command)
        p.add_argument("chart", type=Path)
        p.add_argument("-f", "--values", type=Path, action="append", default=[])
        p.add_argument("--set", action="append", default=[], help="helm --set expression")
        p.add_argument("--name", default="rsub", help="release name")
        p.add_argument("--namespace", default="rsub")
    sub.choices["validate"].add_argument(
        "-k", "--kube-version", action="append", help=f"default: {DEFAULT_KUBE_VERSIONS}"
    )
    sub.choices["lint"].add_argument("--no-strict", action="store_true")
    args = parser.parse_args(argv)
    try:
        if args.command == "ci":
            for line in check_ci(args.chart, args.kube_version or DEFAULT_KUBE_VERSIONS):
                print(line)
        elif args.command == "validate" and len(args.values) > 1:
            # Each values file is one release (one region): validate each on its own.
            for values_file in args.values:
                print(f"== {values_file}")
                _run(args, [values_file])
        else:
            _run(args, args.values)
    except ChartError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


def _run(args: argparse.Namespace, values_files: list[Path]) -> None:
    values = load_values(values_files, args.set)
    if args.command == "lint":
        for line in lint(args.chart, values, strict=not args.no_strict):
            print(line)
        print(f"lint ok: {args.chart}")
        return
    rendered = render(args.chart, values, name=args.name, namespace=args.namespace)
    if args.command == "template":
        print(to_yaml_stream(rendered), end="")
        return
    if args.command == "rules":
        print(yaml.safe_dump(prometheus_rules(rendered), sort_keys=False), end="")
        return
    for line in validate(rendered, args.kube_version or DEFAULT_KUBE_VERSIONS):
        print(line)


if __name__ == "__main__":
    raise SystemExit(main())
