"""The Helm chart, rendered offline by Helm's engine (helm-python-sdk) for each example region."""

from __future__ import annotations

import copy
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from sidecar.config import Config, split_host_port, unrelated_env

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "rsub-sidecar"
EXAMPLES = ROOT / "helm" / "examples"
REGIONS = ("west", "central", "east")


def example_values(helm_tool: ModuleType, region: str) -> dict[str, Any]:
    values: dict[str, Any] = helm_tool.load_values([EXAMPLES / f"{region}.yaml"])
    return values


def objects(helm_tool: ModuleType, values: dict[str, Any], release: str) -> dict[str, Any]:
    """kind -> object (one of each kind in this chart)."""
    rendered = helm_tool.render(CHART, values, name=release, namespace="rsub")
    found: dict[str, Any] = {}
    for _path, obj in helm_tool.manifests(rendered):
        assert obj["kind"] not in found, f"two objects of kind {obj['kind']}"
        found[obj["kind"]] = obj
    return found


def sidecar_container(objs: dict[str, Any]) -> dict[str, Any]:
    (container,) = objs["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert isinstance(container, dict)
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


@pytest.mark.parametrize("region", REGIONS)
def test_region_reaches_a_config_the_sidecar_accepts(
    helm_tool: ModuleType, region: str, tmp_path: Path
) -> None:
    objs = objects(helm_tool, example_values(helm_tool, region), f"rsub-{region}")
    text = objs["ConfigMap"]["data"]["sidecar.yaml"]
    data = yaml.safe_load(text)
    assert data["region"] == region
    assert objs["Deployment"]["metadata"]["labels"]["rsub.io/region"] == region
    # Secrets are mounted files or env vars from the Secret: none is in the ConfigMap.
    for secret_key in ("password", "token", "user", "auth_token"):
        assert secret_key not in text
    # Files the chart points at live in mounted Secrets; stand them up under tmp_path.
    container = sidecar_container(objs)
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    for path in _file_paths(data):
        assert any(path.startswith(m + "/") for m in mounts), f"{path} is not in a mounted volume"
        (tmp_path / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path.lstrip("/")).write_text("x")
    relocated = _relocate(data, tmp_path)
    # Every env var the chart sets must be a key the sidecar knows (one it would ignore is a
    # chart bug; one that looks like a typo is fatal).
    env = {e["name"]: "from-secret" for e in container["env"]}
    assert unrelated_env(env) == []
    config = Config.from_mapping(relocated, env)
    assert config.region == region
    assert config.nats.creds_file == tmp_path / "etc/rsub/nats/nats.creds"
    assert config.grpc.auth_token is not None
    assert config.cluster_for(region) == f"nats-{region}"


def _file_paths(data: dict[str, Any]) -> list[str]:
    nats = data["nats"]
    return [nats["creds_file"], nats["tls"]["ca_file"]]


def _relocate(data: dict[str, Any], root: Path) -> dict[str, Any]:
    out = copy.deepcopy(data)
    nats = out["nats"]
    nats["creds_file"] = str(root / nats["creds_file"].lstrip("/"))
    nats["tls"]["ca_file"] = str(root / nats["tls"]["ca_file"].lstrip("/"))
    return out


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


@pytest.mark.parametrize("region", REGIONS)
def test_security_context_and_resources(helm_tool: ModuleType, region: str) -> None:
    objs = objects(helm_tool, example_values(helm_tool, region), f"rsub-{region}")
    pod = objs["Deployment"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["automountServiceAccountToken"] is False
    for container in [*pod["containers"], *objs["Pod"]["spec"]["containers"]]:
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
    # values.yaml defaults region to "", which the schema's pattern refuses.
    with pytest.raises(helm_tool.ChartError, match="at '/region': '' does not match pattern"):
        helm_tool.render(CHART, values)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda v: v["config"].update(regions=[]), "at '/config/regions'"),
        (
            lambda v: v["config"]["nats"].update(password="pw"),
            "at '/config/nats': additional properties 'password' not allowed",
        ),
        (
            lambda v: v["config"]["streams"].append({"name": "bad.name"}),
            "at '/config/streams/2/name'",
        ),
        (lambda v: v["natsSecret"].update(auth="kerberos"), "at '/natsSecret/auth'"),
    ],
)
def test_schema_rejects_bad_values(helm_tool: ModuleType, change: Any, message: str) -> None:
    values = example_values(helm_tool, "west")
    change(values)
    with pytest.raises(helm_tool.ChartError, match=message):
        helm_tool.render(CHART, values)


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
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"]}
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
