"""A namespace without a cluster configuration: one error, mapped by each caller."""

from __future__ import annotations

from typing import Any

import pytest

from choreography_ray.jobs.errors import ConfigurationError, ShuttingDownError
from choreography_ray.runtime import config as cluster
from choreography_ray.runtime.host_process import cluster_config


class _EmptyStore:
    """Ray's key-value store of a namespace that no `connect` configured."""

    def _internal_kv_get(self, key: bytes, namespace: str) -> Any:
        return None


@pytest.fixture
def unconfigured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster, "_kv", _EmptyStore)


def test_a_missing_configuration_says_how_to_make_one(unconfigured: None) -> None:
    with pytest.raises(ConfigurationError, match=r"^no choreography configuration in Ray names"):
        cluster.require_config("jobs")


def test_a_host_without_a_configuration_is_shutting_down(unconfigured: None) -> None:
    with pytest.raises(ShuttingDownError, match="'jobs'; start hosts with"):
        cluster_config("jobs")
