"""Which addresses a reading command reads the control store of, and which make it join."""

from __future__ import annotations

from typing import Any

import pytest

from choreography_ray.jobs.errors import (
    ClusterAuthenticationError,
    ClusterUnreachableError,
    ConfigurationError,
)
from choreography_ray.placement.capability import HostAdvert
from choreography_ray.runtime.adverts import ADVERT_PREFIX
from choreography_ray.runtime.config import ClusterConfig
from choreography_ray.runtime.constants import CONFIG_KEY
from choreography_ray.runtime.control_store import ControlStore, control_store_address

from .control_stores import NODE_ALIVE, NODE_DEAD, TOKEN, FakeControlStore, serving


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


def test_a_cluster_spoken_to_over_tls_makes_the_command_join(monkeypatch):
    monkeypatch.setenv("RAY_USE_TLS", "1")
    assert control_store_address("10.0.0.5:6379") is None


# -- against a control store that answers as Ray's does (its messages built by Ray's classes) --


@pytest.fixture
def fake_store():
    fake = FakeControlStore()
    with serving(fake) as address:
        yield fake, address


def _advert(name: str, node: bytes, **fields: Any) -> tuple[tuple[bytes, bytes], bytes]:
    advert = HostAdvert(name=name, node_id=node.hex(), **fields)
    return (b"ns", ADVERT_PREFIX + name.encode()), advert.model_dump_json().encode()


def test_the_configuration_and_a_package_are_read(fake_store):
    fake, address = fake_store
    config = ClusterConfig(storage="sqlite:///jobs.db", modules=["jobs_a"])
    fake.kv[(b"ns", CONFIG_KEY)] = config.model_dump_json().encode()
    fake.kv[(b"", b"gcs://_ray_pkg_1.zip")] = b"zip bytes"
    store = ControlStore(address)
    assert store.config("ns") == config
    assert store.package("gcs://_ray_pkg_1.zip") == b"zip bytes"
    assert store.package("gcs://_ray_pkg_gone.zip") is None


def test_a_namespace_without_configuration_says_what_to_run(fake_store):
    _, address = fake_store
    with pytest.raises(ConfigurationError, match="no choreography configuration in Ray namespace"):
        ControlStore(address).config("ns")


def test_adverts_are_those_of_hosts_on_live_nodes_that_read(fake_store):
    fake, address = fake_store
    fake.kv.update(
        [
            _advert("c:alive", NODE_ALIVE, failed_modules={"jobs_a": "boom"}),
            _advert("w:dead", NODE_DEAD),
        ]
    )
    fake.kv[(b"ns", ADVERT_PREFIX + b"w:garbled")] = b"{not json"
    fake.kv[(b"other", ADVERT_PREFIX + b"c:elsewhere")] = fake.kv[
        (b"ns", ADVERT_PREFIX + b"w:dead")
    ]
    found = ControlStore(address).adverts("ns")
    assert list(found) == ["c:alive"]
    assert found["c:alive"].failed_modules == {"jobs_a": "boom"}
    assert ControlStore(address).adverts("empty") == {}


def test_the_token_goes_with_every_call_as_ray_sends_it(fake_store, monkeypatch, tmp_path):
    fake, address = fake_store
    fake.token = TOKEN
    fake.kv[(b"ns", CONFIG_KEY)] = (
        ClusterConfig(storage="sqlite:///jobs.db").model_dump_json().encode()
    )
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    with pytest.raises(ClusterAuthenticationError, match="set RAY_AUTH_MODE=token"):
        ControlStore(address).config("ns")
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ray/auth_token
    with pytest.raises(ClusterAuthenticationError, match="refused this process's"):
        ControlStore(address).config("ns")
    (tmp_path / "token").write_text(f"{TOKEN}\n")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "token"))
    assert ControlStore(address).adverts("ns") == {}
    monkeypatch.setenv("RAY_AUTH_TOKEN", "wrong")  # the variable comes before the file
    with pytest.raises(ClusterAuthenticationError):
        ControlStore(address).config("ns")
    monkeypatch.setenv("RAY_AUTH_TOKEN", TOKEN)
    assert ControlStore(address).config("ns").storage == "sqlite:///jobs.db"
