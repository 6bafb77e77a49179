"""The Helm chart, rendered offline by Helm's engine (helm-python-sdk): the example regions,
the ci/ values chart-testing uses, the values schema and the chart's conventions."""

from __future__ import annotations

import copy
import dataclasses
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from sidecar.config.checks import ConfigError, setting
from sidecar.config.environment import unrelated_env
from sidecar.config.loading import config_from_mapping
from sidecar.config.schema import split_host_port

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "rsub-sidecar"
EXAMPLES = ROOT / "helm" / "examples"
REGIONS = ("west", "central", "east")
CI_FILES = sorted((CHART / "ci").glob("*-values.yaml"))
VALUES_FILES = [*(EXAMPLES / f"{r}.yaml" for r in REGIONS), *CI_FILES]
# networkPolicy.httpFrom admitting a Prometheus in the `monitoring` namespace.
PROMETHEUS_PEERS = [
    {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
]


def example_values(helm_tool: ModuleType, region: str) -> dict[str, Any]:
    return values_of(helm_tool, EXAMPLES / f"{region}.yaml")


def values_of(helm_tool: ModuleType, path: Path) -> dict[str, Any]:
    values: dict[str, Any] = helm_tool.load_values([path])
    return values


def minimal(helm_tool: ModuleType, **changes: Any) -> dict[str, Any]:
    """ci/minimal-values.yaml with top-level keys replaced."""
    values = values_of(helm_tool, CHART / "ci" / "minimal-values.yaml")
    values.update(changes)
    return values


def objects(helm_tool: ModuleType, values: dict[str, Any], release: str) -> dict[str, Any]:
    """kind -> object (one of each kind in this chart); the optional Grafana dashboard's
    ConfigMap is under "ConfigMap/dashboard"."""
    rendered = helm_tool.render(CHART, values, name=release, namespace="rsub")
    found: dict[str, Any] = {}
    for _path, obj in helm_tool.manifests(rendered):
        key = obj["kind"]
        if obj["metadata"]["labels"].get("app.kubernetes.io/component") == "dashboard":
            key = f"{key}/dashboard"
        assert key not in found, f"two objects of kind {key}"
        found[key] = obj
    return found


def sidecar_container(objs: dict[str, Any]) -> dict[str, Any]:
    """The sidecar's container: the pod's first (extraContainers come after it)."""
    container = objs["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert isinstance(container, dict) and container["name"] == "sidecar"
    return container


@pytest.mark.parametrize("region", REGIONS)
def test_example_lints_strict(helm_tool: ModuleType, region: str) -> None:
    helm_tool.lint(CHART, example_values(helm_tool, region), strict=True)


@pytest.mark.parametrize("region", REGIONS)
def test_manifests_validate_against_kubernetes_schemas(helm_tool: ModuleType, region: str) -> None:
    rendered = helm_tool.render(CHART, example_values(helm_tool, region), name=f"rsub-{region}")
    lines = helm_tool.validate(rendered, helm_tool.DEFAULT_KUBE_VERSIONS)
    kinds_ok = {line.split()[2].split("/")[0] for line in lines if line.startswith("ok")}
    assert kinds_ok == {
        "ConfigMap",
        "Deployment",
        "Service",
        "ServiceAccount",
        "PodDisruptionBudget",
        "NetworkPolicy",
        "Pod",
    }
    assert any(line.startswith("skipped") and "ServiceMonitor" in line for line in lines)


def test_strict_validation_catches_a_wrong_manifest(helm_tool: ModuleType) -> None:
    rendered = helm_tool.render(CHART, example_values(helm_tool, "west"), name="rsub-west")
    deployment_path = next(p for p in rendered if p.endswith("deployment.yaml"))
    broken = yaml.safe_load(rendered[deployment_path])
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["grpcc"] = {}
    with pytest.raises(helm_tool.ChartError, match="grpcc"):
        helm_tool.validate({deployment_path: yaml.safe_dump(broken)}, ["1.33"])


@pytest.mark.parametrize("values_file", VALUES_FILES, ids=lambda p: p.name)
def test_release_reaches_a_config_the_sidecar_accepts(
    helm_tool: ModuleType, values_file: Path, tmp_path: Path
) -> None:
    values = values_of(helm_tool, values_file)
    objs = objects(helm_tool, values, "rsub-release")
    text = objs["ConfigMap"]["data"]["sidecar.yaml"]
    data = yaml.safe_load(text)
    assert data["region"] == values["region"]
    assert objs["Deployment"]["metadata"]["labels"]["rsub.io/region"] == values["region"]
    # Secrets are mounted files or env vars from the Secret: none is in the ConfigMap.
    for secret_key in ("password", "token", "user", "auth_token"):
        assert secret_key not in text
    # Files the chart points at live in mounted Secrets; stand them up under tmp_path.
    container = sidecar_container(objs)
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    relocated = copy.deepcopy(data)
    for section, key, path in _file_settings(relocated):
        assert any(path.startswith(m + "/") for m in mounts), f"{path} is not in a mounted volume"
        (tmp_path / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path.lstrip("/")).write_text("x")
        section[key] = str(tmp_path / path.lstrip("/"))
    # Every env var the chart sets must be a key the sidecar knows (one it would ignore is a
    # chart bug; one that looks like a typo is fatal).
    env = {e["name"]: e.get("value", "from-secret") for e in container.get("env", [])}
    assert unrelated_env(env) == []
    config = config_from_mapping(relocated, env)
    assert config.region == values["region"]
    auth = values.get("natsSecret", {}).get("auth", "none")
    assert (config.nats.creds_file is not None) == (auth == "creds")
    assert (config.nats.user is not None) == (auth == "userPassword")
    assert (config.nats.token is not None) == (auth == "token")
    has_token = bool(values.get("grpcSecret", {}).get("authTokenName"))
    assert (config.grpc.auth_token is not None) == has_token
    assert config.lease.bucket == values["config"].get("lease", {}).get("bucket", "rsub-leases")


def _file_settings(data: dict[str, Any]) -> list[tuple[dict[str, Any], str, str]]:
    """(section, key, path) of every `*_file` setting in the sidecar configuration."""
    found: list[tuple[dict[str, Any], str, str]] = []
    for key, value in data.items():
        if isinstance(value, dict):
            found += _file_settings(value)
        elif key.endswith("_file"):
            found.append((data, key, value))
    return found


@pytest.mark.parametrize("region", REGIONS)
def test_probes_point_at_real_container_ports(helm_tool: ModuleType, region: str) -> None:
    objs = objects(helm_tool, example_values(helm_tool, region), f"rsub-{region}")
    container = sidecar_container(objs)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"grpc": 7070, "http": 8080}
    config = yaml.safe_load(objs["ConfigMap"]["data"]["sidecar.yaml"])
    assert split_host_port(config["grpc"]["listen"])[1] == ports["grpc"]
    assert split_host_port(config["http"]["listen"])[1] == ports["http"]
    readiness = container["readinessProbe"]
    assert readiness["grpc"]["port"] == ports["grpc"]  # native gRPC probe: grpc.health.v1
    liveness = container["livenessProbe"]["httpGet"]
    assert liveness["path"] == "/healthz" and liveness["port"] in ports
    service_ports = {p["name"]: p for p in objs["Service"]["spec"]["ports"]}
    assert {n: p["targetPort"] for n, p in service_ports.items()} == {
        "grpc": "grpc",
        "http": "http",
    }
    endpoints = objs["ServiceMonitor"]["spec"]["endpoints"]
    assert [(e["port"], e["path"]) for e in endpoints] == [("http", "/metrics")]
    # The helm test pod dials the release's Service on the gRPC port.
    test_pod = objs["Pod"]
    assert test_pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    target = test_pod["spec"]["containers"][0]["args"][1]
    assert target == f"{objs['Service']['metadata']['name']}.rsub.svc:{ports['grpc']}"


@pytest.mark.parametrize("values_file", VALUES_FILES, ids=lambda p: p.name)
def test_security_context_and_resources(helm_tool: ModuleType, values_file: Path) -> None:
    objs = objects(helm_tool, values_of(helm_tool, values_file), "rsub-release")
    pod = objs["Deployment"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["automountServiceAccountToken"] is False
    # The ci files' init and extra containers are hardened as the chart's own.
    containers = [*pod.get("initContainers", []), *pod["containers"]]
    for container in [*containers, *objs["Pod"]["spec"]["containers"]]:
        sc = container["securityContext"]
        assert sc["runAsNonRoot"] is True
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert sc["seccompProfile"]["type"] == "RuntimeDefault"
        assert set(container["resources"]) == {"requests", "limits"}


@pytest.mark.parametrize("region", REGIONS)
def test_pods_get_no_service_link_variables(helm_tool: ModuleType, region: str) -> None:
    # The release's own Service, rsub-<region>-rsub-sidecar, would otherwise give every pod of
    # the namespace RSUB_<REGION>_RSUB_SIDECAR_SERVICE_HOST and a dozen more RSUB_ variables.
    objs = objects(helm_tool, example_values(helm_tool, region), f"rsub-{region}")
    assert objs["Service"]["metadata"]["name"] == f"rsub-{region}-rsub-sidecar"
    pods = {
        "Deployment": objs["Deployment"]["spec"]["template"]["spec"],
        "Pod": objs["Pod"]["spec"],
    }
    assert {kind: pod.get("enableServiceLinks") for kind, pod in pods.items()} == {
        "Deployment": False,
        "Pod": False,
    }


@pytest.mark.parametrize("region", REGIONS)
def test_two_replicas_spread_over_zones_with_a_pdb(helm_tool: ModuleType, region: str) -> None:
    objs = objects(helm_tool, example_values(helm_tool, region), f"rsub-{region}")
    deployment = objs["Deployment"]
    assert deployment["spec"]["replicas"] == 2
    selector = deployment["spec"]["selector"]["matchLabels"]
    spread = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
    zone = next(c for c in spread if c["topologyKey"] == "topology.kubernetes.io/zone")
    assert zone["labelSelector"]["matchLabels"] == selector
    assert objs["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"] == selector
    assert objs["Service"]["spec"]["selector"] == selector
    assert objs["NetworkPolicy"]["spec"]["podSelector"]["matchLabels"] == selector
    # The test pod must not be picked up as a sidecar replica.
    test_labels = objs["Pod"]["metadata"]["labels"]
    assert not all(test_labels.get(k) == v for k, v in selector.items())


def test_schema_rejects_missing_region(helm_tool: ModuleType) -> None:
    values = example_values(helm_tool, "west")
    del values["region"]
    with pytest.raises(helm_tool.ChartError, match="missing property 'region'"):
        helm_tool.render(CHART, values)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda v: v["config"].update(regions=[]), "at '/config/regions': minItems"),
        (lambda v: v.update(region=""), "at '/region': '' does not match pattern"),
        (
            lambda v: v["config"]["nats"].update(password="pw"),
            "at '/config/nats': additional properties 'password' not allowed",
        ),
        (
            lambda v: v["config"]["streams"].append({"name": "bad.name"}),
            "at '/config/streams/2/name'",
        ),
        (lambda v: v["natsSecret"].update(auth="kerberos"), "at '/natsSecret/auth'"),
        (lambda v: v["config"].update(streams=[]), "at '/config/streams': minItems"),
        (
            lambda v: v["config"].update(discovery={"enabled": True, "match": ["a.b"]}),
            "at '/config/discovery/match/0'",
        ),
    ],
)
def test_schema_rejects_bad_values(helm_tool: ModuleType, change: Any, message: str) -> None:
    values = example_values(helm_tool, "west")
    change(values)
    with pytest.raises(helm_tool.ChartError, match=message):
        helm_tool.render(CHART, values)


def test_discovery_alone_renders_a_config_the_sidecar_accepts(helm_tool: ModuleType) -> None:
    values = minimal(helm_tool)
    values["config"].update(streams=[], discovery={"enabled": True, "match": ["orders-*"]})
    objs = objects(helm_tool, values, "rsub-west")
    data = yaml.safe_load(objs["ConfigMap"]["data"]["sidecar.yaml"])
    config = config_from_mapping(data)
    assert config.streams == ()
    assert config.discovery.enabled and config.discovery.match == ("orders-*",)


def test_region_outside_regions_fails_rendering(helm_tool: ModuleType) -> None:
    values = example_values(helm_tool, "west")
    values["region"] = "north"
    with pytest.raises(helm_tool.ChartError, match=r'region: "north" is not in config\.regions'):
        helm_tool.render(CHART, values)


def test_user_password_and_grpc_tls(helm_tool: ModuleType) -> None:
    values = example_values(helm_tool, "west")
    values["natsSecret"] = {"name": "nats-up", "auth": "userPassword", "tls": {"enabled": False}}
    values["grpcSecret"] = {"tlsName": "grpc-tls", "clientAuth": True}
    values["serviceMonitor"] = {"enabled": False}
    objs = objects(helm_tool, values, "rsub-west")
    assert "ServiceMonitor" not in objs
    container = sidecar_container(objs)
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container.get("env", [])}
    assert env == {
        "RSUB_NATS__USER": {"name": "nats-up", "key": "user"},
        "RSUB_NATS__PASSWORD": {"name": "nats-up", "key": "password"},
    }
    config = yaml.safe_load(objs["ConfigMap"]["data"]["sidecar.yaml"])
    assert "creds_file" not in config["nats"] and "tls" not in config["nats"]
    assert config["grpc"]["tls"] == {
        "cert_file": "/etc/rsub/grpc-tls/tls.crt",
        "key_file": "/etc/rsub/grpc-tls/tls.key",
        "client_ca_file": "/etc/rsub/grpc-tls/ca.crt",
    }
    # Native gRPC probes cannot do TLS: readiness falls back to HTTP /readyz.
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    test_args = objs["Pod"]["spec"]["containers"][0]["args"]
    assert test_args[2] == "/etc/rsub/grpc-tls/ca.crt"
    helm_tool.validate(helm_tool.render(CHART, values, name="rsub-west"), ["1.33"])


def test_config_change_rolls_the_pods(helm_tool: ModuleType) -> None:
    values = example_values(helm_tool, "west")
    before = objects(helm_tool, values, "rsub-west")["Deployment"]
    values["config"]["snapshot"] = {"interval_ms": 500}
    after = objects(helm_tool, values, "rsub-west")["Deployment"]
    key = "checksum/config"
    assert (
        before["spec"]["template"]["metadata"]["annotations"][key]
        != after["spec"]["template"]["metadata"]["annotations"][key]
    )


@pytest.mark.parametrize("region", REGIONS)
def test_network_policy_lets_prometheus_and_the_helm_test_in(
    helm_tool: ModuleType, region: str
) -> None:
    objs = objects(helm_tool, example_values(helm_tool, region), f"rsub-{region}")
    grpc_rule, http_rule = objs["NetworkPolicy"]["spec"]["ingress"]
    assert [p["port"] for p in http_rule["ports"]] == ["http"]
    # The ServiceMonitor is on, so Prometheus (another namespace) must reach /metrics.
    assert any("namespaceSelector" in peer for peer in http_rule["from"])
    test_labels = objs["Pod"]["metadata"]["labels"]
    assert any(
        peer.get("podSelector", {}).get("matchLabels", {}).items() <= test_labels.items()
        and "podSelector" in peer
        for peer in grpc_rule["from"]
    )


# ---- lint as chart-testing runs it: ci/ values, and defaults alone ---------------------------


def test_defaults_alone_fail_lint_naming_the_required_values(helm_tool: ModuleType) -> None:
    with pytest.raises(helm_tool.ChartError) as failed:
        helm_tool.lint(CHART, {}, strict=True)
    message = str(failed.value)
    assert "missing property 'region'" in message
    assert "at '/config': missing properties 'regions', 'streams'" in message
    assert "at '/config/nats': missing property 'servers'" in message
    # helm install/template refuse them the same way.
    with pytest.raises(helm_tool.ChartError, match="missing property 'region'"):
        helm_tool.render(CHART, {})


def test_ci_values_exist(helm_tool: ModuleType) -> None:
    assert [p.name for p in helm_tool.ci_values_files(CHART)] == [
        "full-values.yaml",
        "minimal-values.yaml",
        "mtls-values.yaml",
        "off-values.yaml",
        "podmonitor-values.yaml",
    ]


@pytest.mark.parametrize("values_file", CI_FILES, ids=lambda p: p.name)
def test_ci_values_lint_render_and_validate(helm_tool: ModuleType, values_file: Path) -> None:
    (line,) = helm_tool.check_ci(CHART, helm_tool.DEFAULT_KUBE_VERSIONS, files=[values_file])
    assert line.startswith("ok")


def test_ci_values_set_every_value(helm_tool: ModuleType, chart_readme: ModuleType) -> None:
    # "full" means it: each documented value is away from its default in some ci/ file.
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    ci_values = [values_of(helm_tool, p) for p in CI_FILES]
    rows = chart_readme.value_rows((CHART / "values.yaml").read_text())
    unset = []
    for row in rows:
        path = row.key.split(".")
        default = chart_readme.lookup(defaults, path)
        if not any(chart_readme.lookup(v, path) not in (default, (False, None)) for v in ci_values):
            unset.append(row.key)
    assert unset == []


@pytest.mark.parametrize(
    ("typo", "message"),
    [
        ("topologySpreed.enabled=false", "additional properties 'topologySpreed'"),
        (
            "podDisruptionBudget.maxUnavailabel=1",
            "at '/podDisruptionBudget': additional properties 'maxUnavailabel'",
        ),
        (
            "securityContext.readOnlyRootFileSystem=false",
            "at '/securityContext': additional properties 'readOnlyRootFileSystem'",
        ),
        (
            "probes.liveness.periodSecond=5",
            "at '/probes/liveness': additional properties 'periodSecond'",
        ),
        (
            "serviceMonitor.metricsRelabelings[0].action=drop",
            "at '/serviceMonitor': additional properties 'metricsRelabelings'",
        ),
        ("image.registy=r.example.com", "at '/image': additional properties 'registy'"),
        (
            "serviceMonitor.tlsConfig.insecureSkipVerfy=true",
            "at '/serviceMonitor/tlsConfig': additional properties 'insecureSkipVerfy'",
        ),
        (
            "serviceMonitor.targetLabel={app}",
            "at '/serviceMonitor': additional properties 'targetLabel'",
        ),
        # A PodMonitor's TLS is the CRD's SafeTLSConfig: no files of Prometheus' container.
        (
            "podMonitor.tlsConfig.caFile=/etc/ca.pem",
            "at '/podMonitor/tlsConfig': additional properties 'caFile'",
        ),
        (
            "podMonitor.targetLabels={app}",
            "at '/podMonitor': additional properties 'targetLabels'",
        ),
        ("podMonitor.honorLabel=true", "at '/podMonitor': additional properties 'honorLabel'"),
        (
            "topologySpreadConstraint[0].maxSkew=1",
            "additional properties 'topologySpreadConstraint'",
        ),
        ("extraContainer[0].name=x", "additional properties 'extraContainer'"),
        ("initContainer[0].name=x", "additional properties 'initContainer'"),
        ("lifeCycle.preStop.exec.command={sleep}", "additional properties 'lifeCycle'"),
    ],
)
def test_a_typo_in_values_fails_lint_and_install_naming_it(
    helm_tool: ModuleType, typo: str, message: str
) -> None:
    values = helm_tool.load_values([CHART / "ci" / "minimal-values.yaml"], [typo])
    with pytest.raises(helm_tool.ChartError, match=re.escape(message)):
        helm_tool.lint(CHART, values, strict=True)
    with pytest.raises(helm_tool.ChartError, match=re.escape(message)):
        helm_tool.render(CHART, values)


def test_maps_of_user_data_stay_open(helm_tool: ModuleType) -> None:
    values = minimal(
        helm_tool,
        commonLabels={"any/label": "x"},
        nodeSelector={"any/node-label": "y"},
        resources={"limits": {"ephemeral-storage": "1Gi"}},
    )
    values["global"] = {"anyGlobal": True}  # umbrella charts share global with every subchart
    helm_tool.lint(CHART, values, strict=True)


# ---- conventions -----------------------------------------------------------------------------


def test_probes_default_startup_readiness_liveness(helm_tool: ModuleType) -> None:
    container = sidecar_container(objects(helm_tool, minimal(helm_tool), "rsub-west"))
    # Startup waits for every stream rebuilt (/readyz), for the 10 min that covers 3,000
    # streams (docs/operations.md, "Rolling upgrades"); liveness and readiness start after.
    assert container["startupProbe"] == {
        "httpGet": {"path": "/readyz", "port": "http"},
        "initialDelaySeconds": 0,
        "periodSeconds": 5,
        "timeoutSeconds": 3,
        "failureThreshold": 120,
    }
    assert container["readinessProbe"]["grpc"] == {"port": 7070}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["livenessProbe"]["periodSeconds"] == 10


def test_a_rolling_update_stops_an_old_pod_only_once_a_new_one_is_ready(
    helm_tool: ModuleType,
) -> None:
    """One pod more at a time and none fewer: the replicas that lead keep leading until a
    new one has rebuilt every stream (only then does it claim shards)."""
    deployment = objects(helm_tool, minimal(helm_tool, replicaCount=3), "rsub-west")["Deployment"]
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }


@pytest.mark.parametrize("probe", ["startup", "readiness", "liveness"])
def test_each_probe_can_be_disabled_or_replaced(helm_tool: ModuleType, probe: str) -> None:
    key = f"{probe}Probe"
    off = sidecar_container(
        objects(helm_tool, minimal(helm_tool, probes={probe: {"enabled": False}}), "r")
    )
    assert key not in off
    assert {"startupProbe", "readinessProbe", "livenessProbe"} - {key} <= off.keys()
    custom = {"tcpSocket": {"port": "grpc"}, "periodSeconds": 7}
    replaced = sidecar_container(
        objects(helm_tool, minimal(helm_tool, probes={probe: {"custom": custom}}), "r")
    )
    assert replaced[key] == custom
    # Timings change the chart's probe and keep its handler.
    tuned = sidecar_container(
        objects(helm_tool, minimal(helm_tool, probes={probe: {"periodSeconds": 9}}), "r")
    )
    assert tuned[key]["periodSeconds"] == 9
    assert tuned[key].keys() & {"httpGet", "grpc"}


def test_extra_volumes_mounts_env_from(helm_tool: ModuleType) -> None:
    values = minimal(
        helm_tool,
        extraVolumes=[{"name": "ca", "configMap": {"name": "corp-ca"}}],
        extraVolumeMounts=[{"name": "ca", "mountPath": "/etc/ssl/corp", "readOnly": True}],
        extraEnvFrom=[{"secretRef": {"name": "rsub-env"}}],
        extraEnv=[{"name": "TZ", "value": "UTC"}],
    )
    rendered = helm_tool.render(CHART, values, name="r")
    helm_tool.validate(rendered, ["1.33"])
    objs = objects(helm_tool, values, "r")
    pod = objs["Deployment"]["spec"]["template"]["spec"]
    container = sidecar_container(objs)
    assert [v["name"] for v in pod["volumes"]] == ["config", "tmp", "ca"]
    assert [m["name"] for m in container["volumeMounts"]] == ["config", "tmp", "ca"]
    assert container["envFrom"] == [{"secretRef": {"name": "rsub-env"}}]
    assert container["env"] == [{"name": "TZ", "value": "UTC"}]
    # Without extras: no envFrom at all.
    assert "envFrom" not in sidecar_container(objects(helm_tool, minimal(helm_tool), "r"))


def test_common_labels_and_annotations_on_every_object(helm_tool: ModuleType) -> None:
    values = minimal(
        helm_tool,
        commonLabels={"team": "data", "app.kubernetes.io/name": "hijack"},
        commonAnnotations={"owner": "data"},
        service={"annotations": {"owner": "svc"}},
        serviceMonitor={"enabled": True},
        networkPolicy={"httpFrom": PROMETHEUS_PEERS},
    )
    objs = objects(helm_tool, values, "rsub-west")
    assert set(objs) == {
        "ConfigMap",
        "Deployment",
        "Service",
        "ServiceAccount",
        "PodDisruptionBudget",
        "NetworkPolicy",
        "ServiceMonitor",
        "Pod",
    }
    for kind, obj in objs.items():
        labels, annotations = obj["metadata"]["labels"], obj["metadata"]["annotations"]
        assert labels["team"] == "data", kind
        # The chart's own labels win: selectors and the helm test pod rely on them.
        assert labels["app.kubernetes.io/name"] == "rsub-sidecar", kind
        assert annotations["owner"] == ("svc" if kind == "Service" else "data"), kind
    pod_template = objs["Deployment"]["spec"]["template"]["metadata"]
    assert pod_template["labels"]["team"] == "data"
    assert "owner" not in pod_template["annotations"]
    assert objs["Deployment"]["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] == (
        "rsub-sidecar"
    )
    assert objs["Pod"]["metadata"]["annotations"]["helm.sh/hook"] == "test"  # still a test hook
    assert objs["Pod"]["metadata"]["labels"]["app.kubernetes.io/component"] == "test"
    # Without them: no empty annotations on the objects.
    plain = objects(helm_tool, minimal(helm_tool), "rsub-west")
    assert "annotations" not in plain["ConfigMap"]["metadata"]


def test_service_monitor_namespace_and_relabelings(helm_tool: ModuleType) -> None:
    relabel = [{"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"}]
    drop = [{"sourceLabels": ["__name__"], "regex": "go_.*", "action": "drop"}]
    values = minimal(
        helm_tool,
        serviceMonitor={
            "enabled": True,
            "namespace": "monitoring",
            "relabelings": relabel,
            "metricRelabelings": drop,
        },
        networkPolicy={"httpFrom": PROMETHEUS_PEERS},
    )
    objs = objects(helm_tool, values, "rsub-west")
    sm = objs["ServiceMonitor"]
    assert sm["metadata"]["namespace"] == "monitoring"
    # The Service it selects stays in the release's namespace.
    assert sm["spec"]["namespaceSelector"] == {"matchNames": ["rsub"]}
    (endpoint,) = sm["spec"]["endpoints"]
    # The chart's own first: the Service's region label (as Prometheus' service discovery
    # names it, `.` and `/` as `_`) onto every series as `rsub_region`; then the values'.
    region_label = {
        "sourceLabels": ["__meta_kubernetes_service_label_rsub_io_region"],
        "targetLabel": "rsub_region",
    }
    assert objs["Service"]["metadata"]["labels"]["rsub.io/region"] == "west"
    assert endpoint["relabelings"] == [region_label, *relabel]
    assert endpoint["metricRelabelings"] == drop
    default = objects(
        helm_tool,
        minimal(
            helm_tool,
            serviceMonitor={"enabled": True},
            networkPolicy={"httpFrom": PROMETHEUS_PEERS},
        ),
        "r",
    )
    assert default["ServiceMonitor"]["metadata"]["namespace"] == "rsub"
    assert default["ServiceMonitor"]["spec"]["endpoints"][0]["relabelings"] == [region_label]


def test_service_monitor_needs_the_network_policy_to_let_prometheus_in(
    helm_tool: ModuleType,
) -> None:
    """Left empty, httpFrom admits only this namespace's pods: a Prometheus elsewhere would
    find every target down, so the chart refuses, saying what to set."""
    values = minimal(helm_tool, serviceMonitor={"enabled": True})
    with pytest.raises(helm_tool.ChartError) as failed:
        helm_tool.render(CHART, values)
    message = str(failed.value)
    assert "serviceMonitor.enabled with networkPolicy.httpFrom empty" in message
    assert "Set networkPolicy.httpFrom to Prometheus' pods" in message
    assert "[{podSelector: {}}] when Prometheus runs in this namespace" in message
    # Either answer renders: Prometheus' peers, this namespace named explicitly, no policy.
    network_policies: list[dict[str, Any]] = [
        {"httpFrom": PROMETHEUS_PEERS},
        {"httpFrom": [{"podSelector": {}}]},
        {"enabled": False},
    ]
    for network_policy in network_policies:
        values = minimal(helm_tool, serviceMonitor={"enabled": True}, networkPolicy=network_policy)
        assert "ServiceMonitor" in objects(helm_tool, values, "r")


def test_network_policy_extra_rules(helm_tool: ModuleType) -> None:
    ingress = {"from": [{"ipBlock": {"cidr": "10.0.0.0/8"}}], "ports": [{"port": "http"}]}
    egress = {"to": [{"ipBlock": {"cidr": "10.1.0.0/16"}}], "ports": [{"port": 4317}]}
    values = minimal(helm_tool, networkPolicy={"extraIngress": [ingress], "extraEgress": [egress]})
    spec = objects(helm_tool, values, "r")["NetworkPolicy"]["spec"]
    plain = objects(helm_tool, minimal(helm_tool), "r")["NetworkPolicy"]["spec"]
    assert spec["ingress"] == [*plain["ingress"], ingress]
    assert spec["egress"] == [*plain["egress"], egress]
    helm_tool.validate(helm_tool.render(CHART, values, name="r"), ["1.33"])


def test_service_monitor_job_target_labels_honor_labels_and_tls(helm_tool: ModuleType) -> None:
    tls = {
        "caFile": "/etc/prom-certs/root-cert.pem",
        "certFile": "/etc/prom-certs/cert-chain.pem",
        "keyFile": "/etc/prom-certs/key.pem",
        "insecureSkipVerify": True,
    }
    monitor = {
        "enabled": True,
        "jobLabel": "rsub.io/region",
        "targetLabels": ["app.kubernetes.io/version"],
        "honorLabels": True,
        "tlsConfig": tls,
    }
    values = minimal(
        helm_tool, serviceMonitor=monitor, networkPolicy={"httpFrom": PROMETHEUS_PEERS}
    )
    objs = objects(helm_tool, values, "rsub-west")
    spec = objs["ServiceMonitor"]["spec"]
    assert spec["jobLabel"] == "rsub.io/region"
    # The job label's value differs per region: the Service has it.
    assert objs["Service"]["metadata"]["labels"]["rsub.io/region"] == "west"
    assert spec["targetLabels"] == ["app.kubernetes.io/version"]
    (endpoint,) = spec["endpoints"]
    assert endpoint["honorLabels"] is True
    # TLS means https: Prometheus ignores a tlsConfig on an http scrape.
    assert (endpoint["scheme"], endpoint["tlsConfig"]) == ("https", tls)
    assert (endpoint["port"], endpoint["path"]) == ("http", "/metrics")
    # Left at their defaults, none of them is rendered (plain http, the Service's name as job).
    default = objects(
        helm_tool,
        minimal(
            helm_tool,
            serviceMonitor={"enabled": True},
            networkPolicy={"httpFrom": PROMETHEUS_PEERS},
        ),
        "r",
    )["ServiceMonitor"]["spec"]
    assert not default.keys() & {"jobLabel", "targetLabels", "podTargetLabels"}
    assert not default["endpoints"][0].keys() & {"honorLabels", "scheme", "tlsConfig"}


def test_pod_monitor_scrapes_the_sidecar_pods(helm_tool: ModuleType) -> None:
    values = values_of(helm_tool, CHART / "ci" / "podmonitor-values.yaml")
    objs = objects(helm_tool, values, "rsub-central")
    assert "ServiceMonitor" not in objs
    pm = objs["PodMonitor"]
    assert pm["apiVersion"] == "monitoring.coreos.com/v1"
    assert pm["metadata"]["namespace"] == "monitoring"
    assert pm["metadata"]["labels"]["release"] == "prometheus"
    spec = pm["spec"]
    pod = objs["Deployment"]["spec"]["template"]
    # It selects the sidecar pods of this release (not the helm test pod), in the release's
    # namespace.
    assert spec["selector"]["matchLabels"] == objs["Deployment"]["spec"]["selector"]["matchLabels"]
    assert spec["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert not spec["selector"]["matchLabels"].items() <= objs["Pod"]["metadata"]["labels"].items()
    assert spec["namespaceSelector"] == {"matchNames": ["rsub"]}
    assert spec["jobLabel"] == "rsub.io/region"
    assert spec["podTargetLabels"] == ["app.kubernetes.io/version"]
    assert "targetLabels" not in spec and "endpoints" not in spec
    (endpoint,) = spec["podMetricsEndpoints"]
    # `port` names a port of the sidecar container, the one serving /metrics.
    ports = {p["name"]: p["containerPort"] for p in sidecar_container(objs)["ports"]}
    assert (endpoint["port"], endpoint["path"]) == ("http", "/metrics")
    assert ports["http"] == 8080
    assert (endpoint["interval"], endpoint["scrapeTimeout"]) == ("20s", "15s")
    assert endpoint["honorLabels"] is True
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"] == values["podMonitor"]["tlsConfig"]
    # The region as `rsub_region` (RsubRegionDown), from the pod's label this time; then the
    # values' relabelings.
    assert pod["metadata"]["labels"]["rsub.io/region"] == "central"
    assert endpoint["relabelings"] == [
        {
            "sourceLabels": ["__meta_kubernetes_pod_label_rsub_io_region"],
            "targetLabel": "rsub_region",
        },
        *values["podMonitor"]["relabelings"],
    ]
    assert endpoint["metricRelabelings"] == values["podMonitor"]["metricRelabelings"]
    # Defaults: the release's namespace, plain http, no extra keys.
    default = objects(
        helm_tool,
        minimal(helm_tool, podMonitor={"enabled": True}, networkPolicy={"enabled": False}),
        "r",
    )["PodMonitor"]
    assert default["metadata"]["namespace"] == "rsub"
    assert not default["spec"].keys() & {"jobLabel", "podTargetLabels"}
    (plain,) = default["spec"]["podMetricsEndpoints"]
    assert plain["relabelings"] == endpoint["relabelings"][:1]
    assert not plain.keys() & {"honorLabels", "scheme", "tlsConfig", "metricRelabelings"}


def test_service_monitor_and_pod_monitor_exclude_each_other(helm_tool: ModuleType) -> None:
    values = minimal(
        helm_tool,
        serviceMonitor={"enabled": True},
        podMonitor={"enabled": True},
        networkPolicy={"httpFrom": PROMETHEUS_PEERS},
    )
    with pytest.raises(helm_tool.ChartError) as failed:
        helm_tool.render(CHART, values)
    message = str(failed.value)
    assert "serviceMonitor.enabled and podMonitor.enabled are both true: choose one" in message
    assert "scrape every sidecar twice" in message


def test_pod_monitor_needs_the_network_policy_to_let_prometheus_in(helm_tool: ModuleType) -> None:
    values = minimal(helm_tool, podMonitor={"enabled": True})
    with pytest.raises(helm_tool.ChartError) as failed:
        helm_tool.render(CHART, values)
    assert "podMonitor.enabled with networkPolicy.httpFrom empty" in str(failed.value)
    values["networkPolicy"] = {"httpFrom": PROMETHEUS_PEERS}
    assert "PodMonitor" in objects(helm_tool, values, "r")


def test_topology_spread_constraints_of_ones_own(helm_tool: ModuleType) -> None:
    def spread(values: dict[str, Any]) -> Any:
        pod = objects(helm_tool, values, "rsub-west")["Deployment"]["spec"]["template"]["spec"]
        return pod.get("topologySpreadConstraints")

    selector = {
        "app.kubernetes.io/name": "rsub-sidecar",
        "app.kubernetes.io/instance": "rsub-west",
        "app.kubernetes.io/component": "sidecar",
    }
    # Without them: the chart's, as before (zones, then nodes).
    chart = spread(minimal(helm_tool))
    assert [(c["topologyKey"], c["maxSkew"], c["whenUnsatisfiable"]) for c in chart] == [
        ("topology.kubernetes.io/zone", 1, "ScheduleAnyway"),
        ("kubernetes.io/hostname", 1, "ScheduleAnyway"),
    ]
    assert all(c["labelSelector"] == {"matchLabels": selector} for c in chart)
    assert spread(minimal(helm_tool, topologySpread={"enabled": False})) is None
    # With them: theirs instead of the chart's (topologySpread.enabled or not); one without a
    # labelSelector counts this release's sidecar pods of the same revision.
    rack = {"maxSkew": 1, "topologyKey": "example.com/rack", "whenUnsatisfiable": "DoNotSchedule"}
    zone = {
        "maxSkew": 2,
        "topologyKey": "topology.kubernetes.io/zone",
        "whenUnsatisfiable": "ScheduleAnyway",
        "labelSelector": {"matchLabels": {"app.kubernetes.io/part-of": "rsub"}},
    }
    for enabled in (True, False):
        values = minimal(
            helm_tool, topologySpreadConstraints=[rack, zone], topologySpread={"enabled": enabled}
        )
        assert spread(values) == [
            {
                **rack,
                "labelSelector": {"matchLabels": selector},
                "matchLabelKeys": ["pod-template-hash"],
            },
            zone,
        ]
    helm_tool.validate(helm_tool.render(CHART, values, name="rsub-west"), ["1.33"])


def test_topology_spread_constraints_need_the_kubernetes_fields(helm_tool: ModuleType) -> None:
    values = minimal(helm_tool, topologySpreadConstraints=[{"topologyKey": "example.com/rack"}])
    with pytest.raises(helm_tool.ChartError, match="at '/topologySpreadConstraints/0': missing"):
        helm_tool.render(CHART, values)


def test_init_containers_extra_containers_and_lifecycle(helm_tool: ModuleType) -> None:
    init = {"name": "wait", "image": "busybox:1.37", "command": ["sh", "-c", "true"]}
    extra = {"name": "forwarder", "image": "forwarder:2", "args": ["--to", "collector:4317"]}
    lifecycle = {"preStop": {"exec": {"command": ["sleep", "5"]}}}
    values = minimal(helm_tool, initContainers=[init], extraContainers=[extra], lifecycle=lifecycle)
    objs = objects(helm_tool, values, "r")
    pod = objs["Deployment"]["spec"]["template"]["spec"]
    assert pod["initContainers"] == [init]
    # The sidecar first (probes, the helm test and `kubectl logs` default to it), then theirs.
    assert [c["name"] for c in pod["containers"]] == ["sidecar", "forwarder"]
    assert pod["containers"][1] == extra
    assert sidecar_container(objs)["lifecycle"] == lifecycle
    helm_tool.validate(helm_tool.render(CHART, values, name="r"), ["1.29", "1.37"])
    # Without them: the sidecar alone, no hooks.
    plain = objects(helm_tool, minimal(helm_tool), "r")
    plain_pod = plain["Deployment"]["spec"]["template"]["spec"]
    assert "initContainers" not in plain_pod
    assert [c["name"] for c in plain_pod["containers"]] == ["sidecar"]
    assert "lifecycle" not in sidecar_container(plain)


@pytest.mark.parametrize(
    ("own", "global_secrets", "expected"),
    [
        ([], None, None),
        ([{"name": "own"}], None, ["own"]),
        ([], ["shared"], ["shared"]),
        # The chart's first, then global's in either form, each name once.
        (
            [{"name": "own"}],
            ["shared", {"name": "own"}, {"name": "other"}],
            ["own", "shared", "other"],
        ),
    ],
)
def test_global_image_pull_secrets(
    helm_tool: ModuleType, own: list[Any], global_secrets: list[Any] | None, expected: Any
) -> None:
    values = minimal(helm_tool, imagePullSecrets=own)
    if global_secrets is not None:
        values["global"] = {"imagePullSecrets": global_secrets}
    objs = objects(helm_tool, values, "r")
    # The sidecar pods and the helm test pod (the same image by default) pull alike.
    for pod in (objs["Deployment"]["spec"]["template"]["spec"], objs["Pod"]["spec"]):
        secrets = pod.get("imagePullSecrets")
        assert (secrets and [s["name"] for s in secrets]) == expected
    helm_tool.validate(helm_tool.render(CHART, values, name="r"), ["1.33"])


def test_global_image_pull_secrets_must_name_a_secret(helm_tool: ModuleType) -> None:
    values = minimal(helm_tool)
    values["global"] = {"imagePullSecrets": [{"nmae": "shared"}]}
    with pytest.raises(helm_tool.ChartError, match="at '/global/imagePullSecrets/0'"):
        helm_tool.render(CHART, values)


@pytest.mark.parametrize(
    ("global_registry", "image", "expected"),
    [
        ("", {}, "rsub-sidecar:0.1.0"),
        ("", {"registry": "reg.example.com"}, "reg.example.com/rsub-sidecar:0.1.0"),
        (
            "mirror.example.com",
            {"registry": "reg.example.com", "tag": "1.2"},
            "mirror.example.com/rsub-sidecar:1.2",
        ),
        (
            "mirror.example.com/",
            {"digest": "sha256:" + "a" * 64},
            f"mirror.example.com/rsub-sidecar@sha256:{'a' * 64}",
        ),
    ],
)
def test_global_image_registry(
    helm_tool: ModuleType, global_registry: str, image: dict[str, str], expected: str
) -> None:
    values = minimal(helm_tool, image=image)
    values["global"] = {"imageRegistry": global_registry}
    objs = objects(helm_tool, values, "r")
    assert sidecar_container(objs)["image"] == expected
    # The helm test pod runs the same image unless tests.image says otherwise.
    assert objs["Pod"]["spec"]["containers"][0]["image"] == expected


def test_notes_name_the_regions_lease_bucket(helm_tool: ModuleType) -> None:
    # The sidecar opens `<lease.bucket>-<region>` (sidecar/runtime/root.py).
    text = helm_tool.notes(CHART, minimal(helm_tool), name="rsub-west")
    assert '"rsub-leases-west"' in text
    values = minimal(helm_tool)
    values["config"]["lease"] = {"bucket": "leases"}
    assert '"leases-west"' in helm_tool.notes(CHART, values, name="rsub-west")


# ---- README ----------------------------------------------------------------------------------


def test_readme_is_generated_from_values(chart_readme: ModuleType) -> None:
    # Like proto-check: run `python scripts/chart_readme.py` after changing values.yaml.
    assert (CHART / "README.md").read_text() == chart_readme.render_readme(CHART)


def test_readme_rows_follow_the_comments(chart_readme: ModuleType) -> None:
    text = """\
# A plain comment.
# -- **Required.** The region.
# region: west
top:
  # -- A number.
  # It goes on.
  n: 1
  # -- A described map is one row.
  keys:
    a: x
"""
    rows = chart_readme.value_rows(text)
    assert [(r.key, r.type, r.default, r.description) for r in rows] == [
        ("region", "string", 'required, e.g. `"west"`', "**Required.** The region."),
        ("top.n", "int", "`1`", "A number. It goes on."),
        ("top.keys", "object", '`{"a": "x"}`', "A described map is one row."),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("top:\n  # -- Described.\n  a: 1\n  b: 2\n", "top.b has no `# --` description"),
        ("# -- Dangling.\n\na: 1\n", "a description not followed by a key"),
        ("# -- **Required.** But has a default.\na: 1\n", "a required key is a `# key: example`"),
    ],
)
def test_readme_refuses_undocumented_values(
    chart_readme: ModuleType, text: str, message: str
) -> None:
    with pytest.raises(chart_readme.ValuesDocError, match=re.escape(message)):
        chart_readme.value_rows(text)


def test_the_config_schema_is_what_the_settings_model_gives(config_schema: ModuleType) -> None:
    """values.schema.json's `config` part is written from `sidecar.config` (`make
    config-schema`): it fails here as soon as either changes alone."""
    current = (CHART / "values.schema.json").read_text()
    assert config_schema.written(current) == current, "run `make config-schema`"


def test_the_table_of_keys_is_what_the_settings_model_gives(config_schema: ModuleType) -> None:
    """docs/configuration.md's table of keys is written from the fields of `sidecar.config`
    (`make config-schema`): it fails here as soon as either changes alone."""
    current = (ROOT / "docs" / "configuration.md").read_text()
    assert config_schema.written_doc(current) == current, "run `make config-schema`"


def test_the_table_refuses_a_key_without_a_meaning(config_schema: ModuleType) -> None:
    @dataclasses.dataclass(frozen=True)
    class Section:
        documented: int = dataclasses.field(default=1, metadata=setting("counted"))
        silent: int = 2

    with pytest.raises(ValueError, match=r"^sub\.silent: no meaning"):
        config_schema.table_rows(Section, "sub.")


@pytest.mark.parametrize(
    "change",
    [
        lambda c: c["lease"].update(replicas=6),
        lambda c: c["lease"].update(ttl_s=0),
        lambda c: c["lease"].update(bucket="a.b"),
        lambda c: c["snapshot"].update(interval_ms=0),
        lambda c: c["failback"].update(hold_s=-1),
        lambda c: c["log"].update(level="loud"),
        lambda c: c["progress"].update(interval_ms="soon"),
        lambda c: c["nats"].update(servers=["http://h:4222"]),
        lambda c: c.update(cluster_for_region={"west": "a b"}),
        lambda c: c["streams"].append({"name": "x", "replicas": 0}),
        lambda c: c["streams"].append({"name": "x", "write_stream": "{name}-w"}),
        lambda c: c["discovery"].update(match=[]),
        lambda c: c.update(snapshots={}),
    ],
)
def test_the_chart_refuses_what_the_sidecar_refuses(helm_tool: ModuleType, change: Any) -> None:
    """The same bad settings, given to Helm (the values schema) and to the sidecar's loader."""
    values = example_values(helm_tool, "west")
    config = values["config"]
    for section in ("discovery", "lease", "snapshot", "failback", "log", "progress"):
        config.setdefault(section, {})
    helm_tool.render(CHART, values)
    config_from_mapping({**config, "region": "west"})
    change(config)
    with pytest.raises(helm_tool.ChartError, match="at '/config"):
        helm_tool.render(CHART, values)
    with pytest.raises(ConfigError):
        config_from_mapping({**config, "region": "west"})
