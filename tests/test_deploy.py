"""`ray-cluster.yaml` and `deploy/kuberay.yaml`: valid for Ray (its own cluster-config schema,
its label syntax) and declaring the roles, labels and settings this project reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from choreography_ray.jobs import JobsOptions
from choreography_ray.placement.parallelism import node_parallelism
from choreography_ray.placement.roles import NodeFacts, declared_roles
from choreography_ray.testing import HealthChecks

ROOT = Path(__file__).resolve().parents[1]
OPTIONS = JobsOptions()


def _load(name: str) -> dict[str, Any]:
    loaded = yaml.safe_load((ROOT / name).read_text())
    assert isinstance(loaded, dict)
    return loaded


def _roles(labels: dict[str, str], resources: dict[str, float]) -> tuple[bool, bool] | None:
    return declared_roles(NodeFacts("n", labels=labels, resources=resources), OPTIONS.role_label)


def _parallelism(labels: dict[str, str]) -> int | None:
    return node_parallelism("n", labels, OPTIONS.parallelism_label, fallback=None)


def _health_keys() -> set[str]:
    return set(HealthChecks().system_config())


# -- ray-cluster.yaml -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster() -> dict[str, Any]:
    return _load("ray-cluster.yaml")


def test_ray_cluster_yaml_is_valid_for_rays_own_schema(cluster) -> None:
    import jsonschema
    import ray.autoscaler

    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    jsonschema.validate(cluster, schema)
    assert cluster["head_node_type"] in cluster["available_node_types"]


def test_ray_cluster_yaml_puts_controllers_on_the_head_and_steps_on_workers(cluster) -> None:
    from ray._private.label_utils import validate_node_labels

    types = cluster["available_node_types"]
    head = types.pop(cluster["head_node_type"])
    validate_node_labels(head["labels"])
    assert _roles(head["labels"], head["resources"]) == (True, False)
    assert _roles(head["labels"], {}) == (True, False)  # the label alone says it
    assert types, "no worker node type"
    for worker in types.values():
        validate_node_labels(worker["labels"])
        assert _roles(worker["labels"], worker["resources"]) == (False, True)
        assert _roles(worker["labels"], {}) == (False, True)
        assert (_parallelism(worker["labels"]) or 0) >= 1
        assert worker.get("min_workers", 0) == 0  # scales from zero: jobs wait for a worker


def test_ray_cluster_yaml_starts_the_hosts_with_lowered_health_checks(cluster) -> None:
    head = " ".join(cluster["head_start_ray_commands"])
    assert "choreography up" in head and "--storage" in head and "--module" in head
    assert all(key in head for key in _health_keys())
    assert "choreography up" in " ".join(cluster["worker_start_ray_commands"])
    assert any("choreography-ray" in command for command in cluster["setup_commands"])


# -- deploy/kuberay.yaml --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kuberay() -> dict[str, Any]:
    return _load("deploy/kuberay.yaml")


def _start_params(group: dict[str, Any]) -> tuple[dict[str, str], dict[str, float]]:
    from ray._private.label_utils import parse_node_labels_string

    params = group["rayStartParams"]
    labels = parse_node_labels_string(params["labels"])
    resources = json.loads(json.loads(params["resources"]))  # quoted for the pod's command line
    return labels, resources


def test_kuberay_yaml_is_a_ray_cluster_with_the_same_groups_and_labels(kuberay) -> None:
    assert kuberay["apiVersion"] == "ray.io/v1" and kuberay["kind"] == "RayCluster"
    spec = kuberay["spec"]
    head_labels, head_resources = _start_params(spec["headGroupSpec"])
    assert _roles(head_labels, head_resources) == (True, False)
    system_config = json.loads(json.loads(spec["headGroupSpec"]["rayStartParams"]["system-config"]))
    assert set(system_config) == _health_keys()
    assert spec["workerGroupSpecs"]
    for group in spec["workerGroupSpecs"]:
        labels, resources = _start_params(group)
        assert _roles(labels, resources) == (False, True)
        assert (_parallelism(labels) or 0) >= 1
        assert group["minReplicas"] == 0 <= group["maxReplicas"]
        assert group["template"]["spec"]["containers"]


def test_kuberay_yaml_starts_the_hosts_on_the_head_and_on_each_worker(kuberay) -> None:
    def post_start(group: dict[str, Any]) -> str:
        container = group["template"]["spec"]["containers"][0]
        return " ".join(container["lifecycle"]["postStart"]["exec"]["command"])

    head = post_start(kuberay["spec"]["headGroupSpec"])
    assert "choreography up" in head and "--storage" in head
    assert all("choreography up" in post_start(g) for g in kuberay["spec"]["workerGroupSpecs"])
