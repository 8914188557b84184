"""A step's first start carries the record its job just prepared, so the worker need not read
it back; the record's version keeps that as safe as the read it replaces."""

from __future__ import annotations

from typing import Any

from choreography_ray.engine.messages import StepStart, pack_starts, unpack_starts
from choreography_ray.engine.stored_steps import prepared_record
from choreography_ray.jobs import JobsOptions, JobStatus, JobStepStatus
from choreography_ray.testing import InProcessCluster

from .fixtures import ScenarioJob, ScenarioRequest, request, wrap_steps


class CountedReads:
    """Step storage that counts the step records read by `get_many`."""

    def __init__(self, inner: Any, reads: list[str]) -> None:
        self._inner = inner
        self._reads = reads

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def get_many(self, job_id: str, step_ids: Any) -> Any:
        self._reads.extend(step_ids)
        return await self._inner.get_many(job_id, step_ids)


def run_counting_reads(run: Any, job_request: ScenarioRequest) -> tuple[Any, Any, list[str]]:
    """Run a job to its end in a cluster whose worker counts the step records it reads back:
    the job's final state, its stored step records, and the ids read."""
    reads: list[str] = []
    cluster = InProcessCluster(
        options=JobsOptions(max_parallel_steps=8),
        wrap_storage=wrap_steps(lambda steps: CountedReads(steps, reads)),
    )

    async def scenario():
        await cluster.provider.initialize()
        started = await cluster.start(ScenarioJob, job_request)
        state = await cluster.wait(started.job_id)
        stored = await cluster.storage().steps.get_for_job(started.job_id)
        return state, stored

    try:
        state, stored = run(scenario())
    finally:
        run(cluster.close())
    return state, stored, reads


def test_the_first_starts_of_a_new_job_are_not_read_back_by_the_worker(run, script):
    state, stored, reads = run_counting_reads(run, request(*(f"k{n}" for n in range(40))))
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert state.progress.successful_steps == 40
    assert {s.status for s in stored} == {JobStepStatus.COMPLETED_SUCCESSFULLY}
    assert reads == []  # every record came with its start
    # Each record keeps its place in the plan through the worker's writes.
    assert sorted(s.position for s in stored) == list(range(40))


def test_a_job_with_more_steps_than_records_kept_whole_carries_them_all(run, script, monkeypatch):
    """Its records are kept as their states' JSON at their places in the plan: the limit on
    records kept whole does not apply, and each start carries its record, named and staged."""
    import choreography_ray.engine.fresh as fresh

    monkeypatch.setattr(fresh, "WHOLE_LIMIT", 5)
    keys = [f"k{n}" for n in range(40)]
    stages = {key: 1 + n % 3 for n, key in enumerate(keys)}
    names = {key: f"step {key}" for key in keys[::2]}  # the others are named by their key
    job_request = ScenarioRequest(keys=keys, stages=stages, names=names)
    state, stored, reads = run_counting_reads(run, job_request)
    assert state.status == JobStatus.COMPLETED_SUCCESSFULLY
    assert state.progress.successful_steps == 40
    assert reads == []  # every record came with its start
    assert sorted(k for k, _ in script.runs) == sorted(keys)
    assert sorted(s.position for s in stored) == list(range(40))
    assert sorted((s.name, s.stage) for s in stored) == sorted(
        (names.get(key, key), stages[key]) for key in keys
    )


def test_a_worker_of_the_previous_release_is_sent_the_six_fields_it_reads():
    prepared = ("step.Type", "name", 1, "state.Type", {"n": 1}, 3, 7)
    start = StepStart("s1", 2, 1, prepared)
    [old] = pack_starts([start], urgency=False, positions=False)
    assert old == ["s1", 2, 1, list(prepared[:6])]
    [new] = pack_starts([start])
    assert new == ["s1", 2, 1, list(prepared), False]
    assert prepared_record("job", "s1", unpack_starts([new])[0].prepared).position == 7
    # A job host of the previous release sends six: the record has no place in the plan.
    record = prepared_record("job", "s1", prepared[:6])
    assert (record.position, record.stage, record.version) == (0, 1, 3)


def test_a_prepared_record_changed_before_its_first_start_is_not_overwritten(run, cluster, script):
    """Between the job's insert and the worker's first write, the record changed in storage
    (another writer): the worker's write is a compare-and-set on the version the job stored,
    so the run finds it stale and writes nothing over it."""
    real = cluster.start_steps
    changed: list[str] = []

    async def changing_one(job_key, job_id, job_type, starts, sticky, step_types=None):
        first = starts[0]
        assert first.prepared is not None
        [state] = await cluster.storage().steps.get_many(job_id, [first.step_id])
        state.name = "changed elsewhere"
        await cluster.storage().steps.save(state)
        changed.append(first.step_id)
        return await real(job_key, job_id, job_type, starts, sticky, step_types)

    cluster.start_steps = changing_one

    async def scenario():
        started = await cluster.start(ScenarioJob, request("a", "b", "c"))
        await cluster.settle()
        return await cluster.storage().steps.get_many(started.job_id, changed)

    [record] = run(scenario())
    assert record.name == "changed elsewhere"
    assert record.status == JobStepStatus.UNKNOWN  # the run wrote nothing over it
    assert record.version == 2
