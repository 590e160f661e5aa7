"""deploy/kubernetes/: every manifest valid against Kubernetes' own schemas (kubernetes-validate,
offline, strict: no unknown fields), and consistent with the server they run."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))
K8S_VERSION = "1.30.0"  # the oldest version these manifests are meant for (preStop `sleep` is 1.30+)


def validator():
    try:
        import kubernetes_validate
    except ImportError:
        pytest.fail("kubernetes-validate is missing: pip install -e '.[test]'")
    return kubernetes_validate


def load(name: str) -> dict:
    return yaml.safe_load((ROOT / "deploy" / "kubernetes" / name).read_text())


def container() -> dict:
    (only,) = load("deployment.yaml")["spec"]["template"]["spec"]["containers"]
    return only


def test_there_are_manifests_for_each_part():
    kinds = {yaml.safe_load(path.read_text())["kind"] for path in MANIFESTS}
    assert kinds == {"Deployment", "Service", "Ingress", "HorizontalPodAutoscaler", "PodDisruptionBudget"}


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda path: path.name)
@pytest.mark.parametrize("version", [K8S_VERSION, "1.37.0"])
def test_each_manifest_is_valid_against_the_kubernetes_schema(path, version):
    for document in yaml.safe_load_all(path.read_text()):
        validator().validate(document, version, strict=True)


def test_the_validator_rejects_a_broken_deployment():
    """The check above can fail: a misspelt field and a wrong type are caught."""
    module = validator()
    misspelt = copy.deepcopy(load("deployment.yaml"))
    misspelt["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"httpGet": {"path": "/readyz"}}
    with pytest.raises(module.ValidationError):
        module.validate(misspelt, K8S_VERSION, strict=True)
    wrong_type = copy.deepcopy(load("deployment.yaml"))
    wrong_type["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "forty-five"
    with pytest.raises(module.ValidationError):
        module.validate(wrong_type, K8S_VERSION, strict=True)


def test_probes_point_at_the_servers_health_and_readiness():
    spec = container()
    assert spec["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert spec["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert spec["readinessProbe"]["httpGet"]["path"] == "/readyz"
    # probes reach the pod by its IP; the server accepts only the Host names it is told
    env = {e["name"]: e for e in spec["env"]}
    allowed = env["VOICE_APP_ALLOWED_HOSTS"]["value"].split(",")
    for probe in ("livenessProbe", "startupProbe", "readinessProbe"):
        headers = {h["name"]: h["value"] for h in spec[probe]["httpGet"]["httpHeaders"]}
        assert headers["Host"] in allowed


def test_termination_grace_outlasts_the_drain():
    pod = load("deployment.yaml")["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in container()["env"]}
    drain_s = float(env["VOICE_APP_DRAIN_GRACE_S"])
    pre_stop_s = container()["lifecycle"]["preStop"]["sleep"]["seconds"]
    uvicorn_shutdown_s = 10  # voice_app/realtime/server.py uvicorn_config: timeout_graceful_shutdown
    assert pod["terminationGracePeriodSeconds"] > pre_stop_s + drain_s + uvicorn_shutdown_s


def test_every_setting_the_deployment_sets_exists():
    from voice_app.settings import Settings

    for entry in container()["env"]:
        field = entry["name"].removeprefix("VOICE_APP_").lower()
        assert entry["name"].startswith("VOICE_APP_") and field in Settings.model_fields, entry["name"]
    assert container()["command"][:2] == ["voice-app", "serve"]


def test_service_ingress_and_autoscaler_point_at_the_deployment():
    deployment, service, ingress, hpa, pdb = (load(name) for name in (
        "deployment.yaml", "service.yaml", "ingress.yaml", "hpa.yaml", "pdb.yaml"))
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    port_names = {port["name"] for port in container()["ports"]}
    assert service["spec"]["ports"][0]["targetPort"] in port_names
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend["name"] == service["metadata"]["name"]
    assert backend["port"]["name"] in {port["name"] for port in service["spec"]["ports"]}
    annotations = ingress["metadata"]["annotations"]
    assert int(annotations["nginx.ingress.kubernetes.io/proxy-read-timeout"]) >= 3600  # max_session_s
    assert "http_503" in annotations["nginx.ingress.kubernetes.io/proxy-next-upstream"]  # a draining pod
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    assert hpa["spec"]["minReplicas"] >= 2
