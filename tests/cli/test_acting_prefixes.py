"""Every command that acts on a job through the cluster takes a unique prefix of its id, as
`jobs list` prints it, and acts on the whole id; an ambiguous one acts on nothing. The
cluster's client is replaced by one that records what it was asked."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from typer.testing import CliRunner

from choreography_ray.cli import app
from choreography_ray.jobs import DrainJobResult, JobStatus

runner = CliRunner()
IDS = ["3f2a9c1e5d7b4a60", "3f2a9c1e77777777", "9b1d00c0ffee0000"]


class Recording:
    """A Jobs client of three jobs: what each call named is kept in `asked`."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str]] = []

    def find(self, job_id: str, **_: Any) -> Any:
        return SimpleNamespace(id=job_id) if job_id in IDS else None

    def list(self, query: Any, **_: Any) -> list[Any]:
        return [SimpleNamespace(id=i) for i in IDS if i.startswith(query.id_prefix)]

    def _did(self, action: str, job_id: str, answer: Any = None) -> Any:
        self.asked.append((action, job_id))
        return answer

    def stop(self, job_id: str, **_: Any) -> Any:
        return self._did("stop", job_id)

    def resume(self, job_id: str, **_: Any) -> Any:
        return self._did("resume", job_id)

    def remove(self, job_id: str, **_: Any) -> Any:
        return self._did("remove", job_id)

    def retry_failed(self, job_id: str, **_: Any) -> list[str]:
        return self._did("retry-failed", job_id, [])

    def set_priority(self, job_id: str, priority: int, **_: Any) -> None:
        self._did("set-priority", job_id)

    def drain(self, job_id: str, **_: Any) -> Any:
        drained = SimpleNamespace(result=DrainJobResult.DRAINED, drained=[], not_drained=[])
        return self._did("drain", job_id, drained)

    def wait(self, job_id: str, **_: Any) -> Any:
        return self._did("watch", job_id, SimpleNamespace(status=JobStatus.COMPLETED_SUCCESSFULLY))


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch) -> Recording:
    from choreography_ray.cli import jobs

    recording = Recording()
    monkeypatch.setattr(jobs, "connect", lambda *args, **kwargs: recording)
    return recording


ACTIONS = [
    ("stop",),
    ("resume",),
    ("remove",),
    ("drain",),
    ("retry-failed",),
    ("set-priority", "5"),
    ("watch",),
]


@pytest.mark.parametrize("action", ACTIONS, ids=[a[0] for a in ACTIONS])
def test_a_unique_prefix_names_the_job_acted_on(client, action):
    name, *rest = action
    done = runner.invoke(app, ["jobs", name, "9b1d", *rest], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    assert client.asked == [(name, IDS[2])]


@pytest.mark.parametrize("action", ACTIONS, ids=[a[0] for a in ACTIONS])
def test_an_ambiguous_prefix_acts_on_nothing(client, action):
    name, *rest = action
    refused = runner.invoke(app, ["jobs", name, "3f2a9c1e", *rest], catch_exceptions=False)
    assert refused.exit_code == 2, refused.output
    assert IDS[0] in refused.stderr and IDS[1] in refused.stderr
    assert client.asked == []
