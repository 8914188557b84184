"""Which addresses a reading command reads the control store of, and which make it join."""

from __future__ import annotations

import pytest

from choreography_ray.jobs.errors import ClusterUnreachableError
from choreography_ray.runtime.control_store import ControlStore, control_store_address


@pytest.mark.parametrize("address", [None, "ray://head:10001", "local"])
def test_addresses_without_a_control_store_to_read_make_the_command_join(address):
    assert control_store_address(address) is None


def test_a_host_and_port_is_the_control_store_itself():
    assert control_store_address("10.0.0.5:6379") == "10.0.0.5:6379"


def test_auto_through_a_ray_client_address_in_the_environment_joins(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    assert control_store_address("auto") is None


def test_a_dead_address_is_one_line_at_once_not_forty_seconds_of_retries():
    with pytest.raises(ClusterUnreachableError, match="cannot reach the Ray cluster at"):
        ControlStore("127.0.0.1:1")
