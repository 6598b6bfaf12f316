"""deploy/k8s: manifests against the Kubernetes schemas (kubernetes-validate ships them)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from mqguard_tests.deploy import (
    DEPLOY,
    FakeStompBroker,
    assert_admin_on_loopback,
    hostport,
    load_toml_text,
    sidecar_options,
    upstream,
    yaml_documents,
)

K8S = DEPLOY / "k8s"
MANIFESTS = sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
#: The oldest Kubernetes minor still commonly run, and the newest the package knows.
VERSIONS = ("1.27.0", kubernetes_validate.latest_version())


def all_documents() -> list[tuple[str, dict[str, Any]]]:
    return [(f"{p.name}:{d['kind']}/{d['metadata']['name']}", d)
            for p in MANIFESTS for d in yaml_documents(p)]


def find(kind: str, name: str) -> dict[str, Any]:
    return next(d for _, d in all_documents()
                if d["kind"] == kind and d["metadata"]["name"] == name)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("document", [pytest.param(d, id=label) for label, d in all_documents()])
def test_manifest_is_valid_kubernetes(document: dict[str, Any], version: str) -> None:
    # strict: unknown fields are errors too (a misspelt key is silently dropped by kubectl).
    kubernetes_validate.validate(document, version, strict=True)


def test_the_schema_check_can_fail() -> None:
    deployment = find("Deployment", "activemq")
    broken = {**deployment, "spec": {**deployment["spec"], "replica": 1}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSIONS[-1], strict=True)


def test_kustomization_lists_every_manifest() -> None:
    (kustomization,) = yaml_documents(K8S / "kustomization.yaml")
    assert sorted(kustomization["resources"]) == sorted(p.name for p in MANIFESTS)


def _pod() -> dict[str, Any]:
    return find("Deployment", "activemq")["spec"]["template"]


def _containers() -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in _pod()["spec"]["containers"]}


def _port(container: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    return next(p["containerPort"] for p in container["ports"] if p["name"] == port)


def test_sidecar_runs_in_the_broker_pod_against_localhost() -> None:
    containers = _containers()
    assert set(containers) == {"activemq", "mqguard"}
    options = sidecar_options(containers["mqguard"]["args"])
    host, port, _, _ = upstream(options)
    assert host == "127.0.0.1"
    assert port == _port(containers["activemq"], "stomp")
    sidecar_ports = {p["containerPort"] for p in containers["mqguard"]["ports"]}
    assert hostport(options["listen"])[1] in sidecar_ports


def test_admin_port_stays_inside_the_pod() -> None:
    sidecar = _containers()["mqguard"]
    admin = assert_admin_on_loopback(sidecar_options(sidecar["args"]))
    # Not declared, not in any Service, not advertised for scraping: exposing the
    # unauthenticated /metrics and /health is a deliberate step (docs/operations.md).
    assert admin not in {p["containerPort"] for p in sidecar["ports"]}
    for _, document in all_documents():
        if document["kind"] == "Service":
            ports = document["spec"]["ports"]
            assert admin not in {p["port"] for p in ports} | {p.get("targetPort") for p in ports}
    assert "prometheus.io/scrape" not in _pod()["metadata"].get("annotations", {})
    text = (K8S / "broker-with-sidecar.yaml").read_text()
    assert "docs/operations.md" in text and "NetworkPolicy" in text


def test_probes_ask_health_from_inside_the_container() -> None:
    sidecar = _containers()["mqguard"]
    admin = assert_admin_on_loopback(sidecar_options(sidecar["args"]))
    for probe in ("readinessProbe", "startupProbe"):
        command = sidecar[probe]["exec"]["command"]
        assert command[:2] == ["python", "-c"]
        assert f"http://127.0.0.1:{admin}/health" in command[2]
        # The probe's own timeout ends before the kubelet's.
        timeout = float(re.search(r"timeout=(\d+(?:\.\d+)?)", command[2]).group(1))
        assert timeout < sidecar[probe]["timeoutSeconds"]
    # Liveness asks whether the sidecar answers at all (its STOMP listener), not /health:
    # a broker outage must not restart the sidecar.
    port = sidecar["livenessProbe"]["tcpSocket"]["port"]
    assert _port(sidecar, port) == hostport(sidecar_options(sidecar["args"])["listen"])[1]


def test_probe_command_follows_the_sidecars_health(tmp_path: Path) -> None:
    """The readiness probe's own command, run against a real sidecar: 0 while the broker
    answers CONNECT, non-zero once it does not."""
    import subprocess
    import sys
    import time

    from mqguard.config import parse_config
    from mqguard.sidecar.server import Sidecar, SidecarThread, parse_upstream

    command = _containers()["mqguard"]["readinessProbe"]["exec"]["command"]
    broker = FakeStompBroker()
    config = parse_config({"mqguard": {"message-expiry-scan-period": -1, "event-log": {
        "directory": str(tmp_path / "events")}}})
    proxy = Sidecar(config, parse_upstream(f"stomp://127.0.0.1:{broker.port}"),
                    admin=("127.0.0.1", 0))
    with SidecarThread(proxy) as running:
        probe = [sys.executable, command[1],
                 command[2].replace(":9464/", f":{running.admin_port}/")]
        assert subprocess.run(probe, capture_output=True, timeout=30).returncode == 0
        broker.close()
        time.sleep(1.2)
        failed = subprocess.run(probe, capture_output=True, timeout=30)
        assert failed.returncode != 0 and b"503" in failed.stderr, failed.stderr


def test_service_reaches_only_the_sidecar() -> None:
    service = find("Service", "activemq-guarded")
    sidecar = _containers()["mqguard"]
    names = {p["name"] for p in sidecar["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= names
    assert service["spec"]["selector"].items() <= _pod()["metadata"]["labels"].items()


def test_sidecar_is_locked_down_like_the_image() -> None:
    context = _containers()["mqguard"]["securityContext"]
    assert context["runAsNonRoot"] is True and context["runAsUser"] == 10001  # Dockerfile USER
    assert context["readOnlyRootFilesystem"] is True
    writable = {m["mountPath"] for m in _containers()["mqguard"]["volumeMounts"]
                if not m.get("readOnly")}
    assert writable == {"/var/lib/mqguard"}  # the event log; nothing else is written


def test_volumes_referenced_exist() -> None:
    pod = _pod()["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    for container in pod["containers"]:
        for mount in container["volumeMounts"]:
            assert mount["name"] in volumes, mount
    for volume in volumes.values():
        if "configMap" in volume:
            find("ConfigMap", volume["configMap"]["name"])
        if "persistentVolumeClaim" in volume:
            find("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])


def test_configmap_mqguard_toml_loads_and_matches_the_pod() -> None:
    text = find("ConfigMap", "mqguard-config")["data"]["mqguard.toml"]
    config = load_toml_text(text, "deploy/k8s/configmap.yaml")
    store = re.match(r"redis://([^:/]+):(\d+)", config.core.store)
    assert store, config.core.store
    service = find("Service", store.group(1))
    assert int(store.group(2)) in {p["port"] for p in service["spec"]["ports"]}
    grace = _pod()["spec"]["terminationGracePeriodSeconds"] * 1000
    assert grace > config.core.sidecar.drain_timeout_ms
    mount = next(m for m in _containers()["mqguard"]["volumeMounts"]
                 if m["name"] == "mqguard-config")
    args = sidecar_options(_containers()["mqguard"]["args"])
    assert Path(args["config_path"]).parent == Path(mount["mountPath"])


def test_redis_uses_aof() -> None:
    redis = find("StatefulSet", "mqguard-redis")["spec"]["template"]["spec"]["containers"][0]
    assert redis["args"][redis["args"].index("--appendonly") + 1] == "yes"


def test_activemq_configuration_is_the_compose_one() -> None:
    text = find("ConfigMap", "activemq-config")["data"]["activemq.xml"]
    assert text == (DEPLOY / "compose" / "activemq" / "activemq.xml").read_text()
