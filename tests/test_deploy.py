"""`ray-cluster.yaml`, `deploy/kuberay.yaml` and `deploy/kuberay-rayjob.yaml`: valid for Ray
(its own cluster-config schema, its label syntax, its reading of a RayCluster) and for KubeRay
(the schema of its CRDs, vendored in tests/kuberay/, and its operator's checks), and declaring
the roles, labels and settings this project reads."""

from __future__ import annotations

import copy
import functools
import hashlib
import importlib.metadata
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
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
    workers = " ".join(cluster["worker_start_ray_commands"])
    assert "choreography up" not in workers  # the controller host starts a joined node's hosts
    for commands in (head, workers):
        assert "RAY_gcs_rpc_server_reconnect_timeout_s=" in commands
    assert any("choreography-ray" in command for command in cluster["setup_commands"])


# -- deploy/kuberay.yaml and deploy/kuberay-rayjob.yaml: KubeRay 1.5 -----------------------------

KUBERAY_FILES = ("deploy/kuberay.yaml", "deploy/kuberay-rayjob.yaml")
KUBERAY = ROOT / "tests" / "kuberay"
# KubeRay's CRDs of v1.5.2 (commit 9f65eca1d6226d20f9e7c340f2af27cc4a1c9985), unmodified: the
# file and its git blob id (tests/kuberay/README.md).
CRDS = {
    "RayCluster": ("ray.io_rayclusters.yaml", "45f5406c4115ec36a2477421d2a475b8189f8701"),
    "RayJob": ("ray.io_rayjobs.yaml", "1f4c84321683e1dad850c8244fd61101ca43c170"),
}
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the CRDs are 2 MB of YAML


def _documents(name: str) -> list[dict[str, Any]]:
    documents = [d for d in yaml.load_all((ROOT / name).read_text(), _LOADER) if d is not None]
    assert documents and all(isinstance(d, dict) for d in documents), name
    return documents


@pytest.fixture(scope="module")
def kuberay() -> dict[str, Any]:
    (document,) = _documents("deploy/kuberay.yaml")
    return document


@pytest.fixture(scope="module")
def rayjob() -> dict[str, Any]:
    (document,) = _documents("deploy/kuberay-rayjob.yaml")
    return document


def _strict(schema: Any) -> Any:
    """`schema` refusing unknown fields, as the API server's strict field validation (kubectl's
    default) does: an object schema that lists its properties takes no other, unless it says
    `x-kubernetes-preserve-unknown-fields`."""
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    strict = {
        key: {name: _strict(sub) for name, sub in value.items()}
        if key == "properties"
        else _strict(value)
        for key, value in schema.items()
    }
    if (
        "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        strict["additionalProperties"] = False
    return strict


def _list_type(validator: Any, list_type: str, instance: Any, schema: dict[str, Any]) -> Any:
    """`x-kubernetes-list-type`: the items of a `set` differ, those of a `map` by their keys."""
    import jsonschema

    if list_type not in ("set", "map") or not validator.is_type(instance, "array"):
        return
    keys = schema.get("x-kubernetes-list-map-keys", [])
    seen: set[str] = set()
    for item in instance:
        identity = [item.get(key) for key in keys] if list_type == "map" else item
        text = json.dumps(identity, sort_keys=True)
        if text in seen:
            yield jsonschema.ValidationError(f"two items of this {list_type} list are {text}")
        seen.add(text)


@functools.cache
def _validator(kind: str) -> Any:
    """A validator for KubeRay's `kind`: its CRD's v1 OpenAPI schema, read as JSON Schema draft 4
    (OpenAPI 3.0's base). Other `x-kubernetes-*` keys are not JSON Schema and are ignored."""
    from jsonschema import Draft4Validator, validators

    name, _ = CRDS[kind]
    crd = yaml.load((KUBERAY / name).read_bytes(), _LOADER)
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    extended = validators.extend(Draft4Validator, {"x-kubernetes-list-type": _list_type})
    return extended(_strict(version["schema"]["openAPIV3Schema"]))


def _schema_errors(document: dict[str, Any]) -> list[str]:
    errors = _validator(document["kind"]).iter_errors(document)
    return sorted(f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in errors)


def _cluster_specs(document: dict[str, Any]) -> list[dict[str, Any]]:
    """The RayCluster specs of a document: a RayCluster's, or the one a RayJob creates."""
    if document["kind"] == "RayCluster":
        return [document["spec"]]
    return [document["spec"]["rayClusterSpec"]] if "rayClusterSpec" in document["spec"] else []


def _groups(spec: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    workers = spec.get("workerGroupSpecs", [])
    return [("Head", spec["headGroupSpec"]), *((g["groupName"], g) for g in workers)]


def _containers(group: dict[str, Any]) -> list[dict[str, Any]]:
    return group["template"]["spec"]["containers"]


def _command(container: dict[str, Any]) -> str:
    return " ".join(container.get("command", []) + container.get("args", []))


def _walk(node: Any) -> Iterator[tuple[str, Any]]:
    """Every (key, value) pair of a document, at any depth."""
    items = node.items() if isinstance(node, dict) else []
    for key, value in items:
        yield key, value
        yield from _walk(value)
    for item in node if isinstance(node, list) else []:
        yield from _walk(item)


def _ray_start_labels(labels: dict[str, str]) -> dict[str, str]:
    """Group labels as KubeRay 1.5 hands them to `ray start --labels`, read back as Ray does."""
    from ray._private.label_utils import parse_node_labels_string

    return parse_node_labels_string(",".join(f"{k}={v}" for k, v in sorted(labels.items())))


def test_the_vendored_crds_are_kuberays_own() -> None:
    for name, blob_id in CRDS.values():
        data = (KUBERAY / name).read_bytes()
        assert hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest() == blob_id, name


@pytest.mark.parametrize("name", KUBERAY_FILES)
def test_kuberay_manifests_are_valid_for_kuberays_crd_schema(name) -> None:
    for document in _documents(name):
        assert document.get("apiVersion") == "ray.io/v1" and document.get("kind") in CRDS
        assert not _schema_errors(document), "\n".join(_schema_errors(document))


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("spec", "headGroupSpec", "lables"), {"choreography.io/role": "controller"}),
        (("spec", "workerGroupSpecs", 0, "minReplicas"), "0"),
        (("spec", "workerGroupSpecs", 0, "resources", "choreography_worker"), 1),
        (("spec", "autoscalerOptions", "version"), "v3"),
        (("spec", "headGroupSpec", "template", "spec", "containers", 1, "name"), "ray-head"),
    ],
    ids=["unknown-field", "string-for-integer", "number-for-string", "enum", "duplicate-name"],
)
def test_the_schema_check_refuses_what_the_api_server_refuses(kuberay, path, value) -> None:
    document = copy.deepcopy(kuberay)
    parent = functools.reduce(lambda node, key: node[key], path[:-1], document)
    parent[path[-1]] = value
    assert _schema_errors(document)


def test_kuberay_manifests_pass_the_operators_own_checks() -> None:
    """What KubeRay 1.5.2's operator refuses beyond the schema, for the fields these files set
    (ray-operator/controllers/ray/utils/validation.go at the vendored commit)."""
    from ray._private.label_utils import validate_node_label_syntax

    for name in KUBERAY_FILES:
        for document in _documents(name):
            limit = 53 if document["kind"] == "RayCluster" else 47
            assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", document["metadata"]["name"])
            assert len(document["metadata"]["name"]) <= limit
            for spec in _cluster_specs(document):
                options = spec.get("autoscalerOptions", {})
                v2 = spec.get("enableInTreeAutoscaling") and options.get("version") == "v2"
                for group_name, group in _groups(spec):
                    params = group.get("rayStartParams", {})
                    # "rayStartParams['labels'] is not supported for worker group; please use
                    # the top-level Labels field instead"
                    assert "labels" not in params, group_name
                    if group.get("resources"):  # not in both places
                        assert not {"num-cpus", "num-gpus", "memory", "resources"} & set(params)
                    validate_node_label_syntax(group.get("labels", {}))
                    pod = group["template"]["spec"]
                    assert pod["containers"], group_name
                    if v2:  # autoscaler v2: pods that are not started again
                        assert pod.get("restartPolicy", "Never") == "Never", group_name
            if document["kind"] == "RayJob":
                spec = document["spec"]
                selector = spec.get("clusterSelector", {})
                assert selector or "rayClusterSpec" in spec
                if selector:
                    assert selector.get("ray.io/cluster")
                    assert spec.get("submissionMode") != "SidecarMode"


def test_kuberay_groups_declare_their_roles_by_label(kuberay) -> None:
    from ray._private.label_utils import validate_node_labels

    spec = kuberay["spec"]
    for group_name, group in _groups(spec):
        labels = group["labels"]
        validate_node_labels(labels)
        assert _ray_start_labels(labels) == labels, group_name
        resources = {key: float(value) for key, value in group.get("resources", {}).items()}
        wanted = (True, False) if group_name == "Head" else (False, True)
        assert _roles(labels, {}) == wanted, group_name  # the label alone says it
        assert _roles({}, resources) in (None, wanted), group_name
        if group_name != "Head":
            assert (_parallelism(labels) or 0) >= 1, group_name
    assert spec["workerGroupSpecs"], "no worker group"


def test_rays_kuberay_autoscaler_reads_each_groups_labels_and_resources(kuberay) -> None:
    """Ray's own reading of a RayCluster (the autoscaler's node types, v1 and v2 alike)."""
    from ray.autoscaler._private.kuberay.autoscaling_config import (
        _derive_autoscaling_config_from_ray_cr,
    )

    resource = copy.deepcopy(kuberay)
    resource["metadata"].setdefault("namespace", "default")
    config = _derive_autoscaling_config_from_ray_cr(resource)  # validated by Ray, too
    types = config["available_node_types"]
    head = types.pop("headgroup")
    assert _roles(head["labels"], {}) == (True, False)
    assert head["resources"]["choreography_controller"] == 1
    workers = {group["groupName"]: group for group in kuberay["spec"]["workerGroupSpecs"]}
    assert types.keys() == workers.keys()
    for group_name, node_type in types.items():
        assert node_type["labels"] == workers[group_name]["labels"]
        assert _roles(node_type["labels"], {}) == (False, True)
        assert (_parallelism(node_type["labels"]) or 0) >= 1
        assert node_type["resources"]["choreography_worker"] == 1
        assert node_type["resources"]["CPU"] >= 1
        assert node_type["min_workers"] == 0 < node_type["max_workers"]
    idle = kuberay["spec"]["autoscalerOptions"]["idleTimeoutSeconds"]
    assert config["idle_timeout_minutes"] == idle / 60


def test_kuberay_head_lowers_rays_health_checks(kuberay) -> None:
    value = kuberay["spec"]["headGroupSpec"]["rayStartParams"]["system-config"]
    # KubeRay writes each rayStartParam as --key=value into the shell command that starts Ray.
    (argument,) = shlex.split(f"--system-config={value}")
    assert set(json.loads(argument.removeprefix("--system-config="))) == _health_keys()


def test_kuberay_manifests_pin_the_installed_ray() -> None:
    version = importlib.metadata.version("ray")
    boundary = rf"(?<![\d.]){re.escape(version)}(?![\d.])"
    images = []
    for name in KUBERAY_FILES:
        for document in _documents(name):
            for spec in _cluster_specs(document):
                assert spec.get("rayVersion") == version, name
            images += [value for key, value in _walk(document) if key == "image"]
    assert images
    for image in images:
        tag = image.rpartition("/")[2].partition(":")[2]
        assert re.search(boundary, tag), f"image {image} names no Ray {version} in its tag"


def test_kuberay_cluster_autoscales_its_workers_from_zero(kuberay) -> None:
    spec = kuberay["spec"]
    assert spec["enableInTreeAutoscaling"] is True
    assert spec["autoscalerOptions"]["version"] == "v2"
    assert spec["autoscalerOptions"]["idleTimeoutSeconds"] > 0
    for group in spec["workerGroupSpecs"]:
        assert group["minReplicas"] == group.get("replicas", 0) == 0 < group["maxReplicas"]


def test_kuberay_cluster_survives_a_restarting_control_store(kuberay) -> None:
    """GCS fault tolerance on, and every pod's Ray waits for a restarting GCS longer than
    Ray's 60 s default, read from its environment (docs/recovery.md)."""
    options = kuberay["spec"]["gcsFaultToleranceOptions"]
    assert options["redisAddress"] and options["externalStorageNamespace"]
    groups = [kuberay["spec"]["headGroupSpec"], *kuberay["spec"]["workerGroupSpecs"]]
    for group in groups:
        ray_container = _containers(group)[0]
        env = {item["name"]: item.get("value") for item in ray_container.get("env", [])}
        assert int(env["RAY_gcs_rpc_server_reconnect_timeout_s"]) > 60


def test_no_kuberay_pod_runs_a_start_hook_nor_a_command_of_ours_on_a_worker() -> None:
    for name in KUBERAY_FILES:
        for document in _documents(name):
            # A postStart hook that fails kills its container.
            assert "postStart" not in {key for key, _ in _walk(document)}, name
            for spec in _cluster_specs(document):
                for group in spec.get("workerGroupSpecs", []):
                    # Hosts start on a joining node by themselves (the membership watch).
                    assert not any("choreography" in _command(c) for c in _containers(group))


def _configuring_container(kuberay: dict[str, Any]) -> dict[str, Any]:
    head = _containers(kuberay["spec"]["headGroupSpec"])
    configuring = [c for c in head if "choreography up" in _command(c)]
    assert len(configuring) == 1, "not one container of the head runs `choreography up`"
    assert configuring[0] is not head[0], "the Ray container (KubeRay's first) runs it"
    return configuring[0]


def test_the_head_configures_the_cluster_from_a_container_of_its_own(kuberay) -> None:
    pod = kuberay["spec"]["headGroupSpec"]["template"]["spec"]
    container = _configuring_container(kuberay)
    command = _command(container)
    assert "--address auto" in command and "--module" in command
    env = {variable["name"] for variable in container.get("env", [])}
    assert "--storage" in command or "CHOREOGRAPHY_STORAGE" in env
    # `--address auto` reaches Ray on this pod through /tmp/ray, shared with the Ray container
    # under the name KubeRay gives it (its autoscaler container mounts the same volume).
    for mounted in (pod["containers"][0], container):
        mounts = {mount["mountPath"]: mount["name"] for mount in mounted["volumeMounts"]}
        assert mounts.get("/tmp/ray") == "ray-logs", mounted["name"]
    assert {"name": "ray-logs", "emptyDir": {}} in pod["volumes"]
    assert pod["restartPolicy"] == "Never" and "exec" in container["readinessProbe"]


def _stand_ins(tmp_path: Path, exits: list[int]) -> dict[str, str]:
    """An environment where `choreography` records its arguments and exits with each of `exits`
    in turn, and `sleep` records its argument and returns at once."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "exits").write_text("".join(f"{code}\n" for code in exits))
    scripts = {
        "choreography": 'echo "$*" >> "$STAND_INS/calls"\n'
        'code=$(head -n 1 "$STAND_INS/exits")\n'
        'tail -n +2 "$STAND_INS/exits" > "$STAND_INS/rest" && mv "$STAND_INS/rest" '
        '"$STAND_INS/exits"\n'
        'exit "$code"\n',
        "sleep": 'echo "$*" >> "$STAND_INS/sleeps"\n',
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body)
        (bin_dir / name).chmod(0o755)
    path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    return {"PATH": path, "STAND_INS": str(tmp_path), "TMPDIR": str(tmp_path)}


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)


def test_the_configuring_container_tries_up_again_until_it_succeeds(kuberay, tmp_path) -> None:
    container = _configuring_container(kuberay)
    env = _stand_ins(tmp_path, [4, 4, 1, 0])
    probe = container["readinessProbe"]["exec"]["command"]
    assert _run(probe, env).returncode != 0  # not ready before
    result = _run(container["command"] + container["args"], env)
    assert result.returncode == 0, result.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    assert len(calls) == 4 and set(calls) == {calls[0]}
    assert calls[0].startswith("up --address auto --module ")
    assert (tmp_path / "sleeps").read_text().split() == ["10", "10", "10", "infinity"]
    assert "attempt 1 failed (exit 4)" in result.stdout
    assert "attempt 3 failed (exit 1)" in result.stdout
    assert result.stdout.rstrip().endswith("the cluster is configured")
    assert _run(probe, env).returncode == 0  # ready after


def test_the_configuring_container_stops_at_a_mistake_in_the_manifest(kuberay, tmp_path) -> None:
    container = _configuring_container(kuberay)
    env = _stand_ins(tmp_path, [4, 2, 0])
    result = _run(container["command"] + container["args"], env)
    assert result.returncode == 2
    assert len((tmp_path / "calls").read_text().splitlines()) == 2
    assert "not tried again" in result.stdout
    assert _run(container["readinessProbe"]["exec"]["command"], env).returncode != 0


def test_the_rayjob_runs_submit_py_on_the_kuberay_cluster(kuberay, rayjob) -> None:
    spec = rayjob["spec"]
    assert spec["clusterSelector"] == {"ray.io/cluster": kuberay["metadata"]["name"]}
    assert "rayClusterSpec" not in spec
    argv = shlex.split(spec["entrypoint"])
    assert argv[0] == "python" and Path(argv[1]).name == "submit.py"
    # The driver runs on the head and takes the storage from its CHOREOGRAPHY_STORAGE.
    assert "--storage" not in argv
    ray_head = _containers(kuberay["spec"]["headGroupSpec"])[0]
    assert "CHOREOGRAPHY_STORAGE" in {variable["name"] for variable in ray_head["env"]}
    script = ROOT / "examples" / "submit.py"
    shown = _run([sys.executable, str(script), "--help"], dict(os.environ))
    assert shown.returncode == 0, shown.stderr
    for flag in (a.partition("=")[0] for a in argv[2:] if a.startswith("--")):
        assert flag in shown.stdout, f"submit.py takes no {flag}"
