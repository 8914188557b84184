"""Persisted state of jobs and steps.

These models are what storage holds, as JSON. Fields only ever get added, with defaults, so a
record written by an older release still reads. Values of user types (requests, step state,
results) are kept as `Payload`s: a registered type name and JSON data.
"""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .errors import InvalidJobIdError
from .registry import Payload, shared_fields, trusted_sharing
from .status import JobStatus, JobStepStatus

DEFAULT_SCOPE = "default"
DEFAULT_NAMESPACE = "default"

MAX_ID_LENGTH = 200
"""The longest job id, step id, scope or namespace: ids from other systems (UUIDs, paths
joined with dashes, ticket numbers) fit with room to spare, and every store indexes them."""


def check_job_id(job_id: object) -> str:
    """`job_id` if it can name a job: any printable text of 1 to 200 characters without a path
    separator (`/` or `\\`) and without whitespace at either end. The client and the
    in-process cluster check a caller's id with it before anything is sent or written."""
    if not isinstance(job_id, str):
        raise InvalidJobIdError(job_id, f"is a {type(job_id).__name__}, not a string")
    if not job_id:
        raise InvalidJobIdError(job_id, "is empty")
    if len(job_id) > MAX_ID_LENGTH:
        raise InvalidJobIdError(
            job_id[:20] + "…", f"is {len(job_id)} characters long; at most {MAX_ID_LENGTH}"
        )
    if job_id != job_id.strip():
        raise InvalidJobIdError(job_id, "has whitespace at its start or end")
    if not job_id.isprintable():
        raise InvalidJobIdError(job_id, "contains a control or other non-printable character")
    if "/" in job_id or "\\" in job_id:
        raise InvalidJobIdError(job_id, "contains a path separator ('/' or '\\')")
    return job_id


def utc(value: datetime) -> datetime:
    """Naive datetimes are taken as UTC; aware ones are converted to UTC."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def to_micros(value: datetime) -> int:
    """Microseconds since the epoch: how every provider stores and compares times."""
    delta = value - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", validate_assignment=False)


class JobKey(_Model):
    """The storage partition a job lives in. No query or write crosses two keys."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    scope: str = DEFAULT_SCOPE
    namespace: str = DEFAULT_NAMESPACE

    @field_validator("scope", "namespace")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value or not value.strip():
            raise ValueError("must not be empty")
        if len(value) > MAX_ID_LENGTH:
            raise ValueError(f"must be at most {MAX_ID_LENGTH} characters")
        return value

    def __str__(self) -> str:
        return f"{self.scope}/{self.namespace}"

    def __hash__(self) -> int:
        # Keys index every hot dictionary of a host; hash the two strings directly.
        return hash((self.scope, self.namespace))

    def __eq__(self, other: object) -> bool:
        # Every batch that crosses a process brings its own equal copy of a key, so lookups
        # compare: the two strings, not pydantic's generic comparison (several times slower).
        if other.__class__ is JobKey:
            return self.scope == other.scope and self.namespace == other.namespace
        return super().__eq__(other)


class StatusChange(_Model):
    """One entry of a status history, with the error that caused it if any."""

    status: int
    occurred: datetime
    exception_messages: list[str] = Field(default_factory=list)
    exception_stack_trace: str = ""
    host: str = ""
    """The controller host that made the change (empty for a step's, and in records of
    earlier releases): a change of host in a job's history is a recovery elsewhere."""

    _utc = field_validator("occurred")(classmethod(lambda cls, v: utc(v)))


class JobStageProgress(_Model):
    stage: int
    is_started: bool = False
    total_steps: int = 0
    successful_steps: int = 0
    failed_steps: int = 0
    unreachable_steps: int = 0

    @property
    def is_completed(self) -> bool:
        return (
            self.successful_steps + self.failed_steps + self.unreachable_steps == self.total_steps
        )

    @property
    def has_failures(self) -> bool:
        return self.failed_steps > 0

    @property
    def remaining_steps(self) -> int:
        return self.total_steps - self.successful_steps - self.failed_steps - self.unreachable_steps


class JobProgress(_Model):
    total_steps: int = 0
    successful_steps: int = 0
    failed_steps: int = 0
    stopped_steps: int = 0
    unreachable_steps: int = 0
    stages: list[JobStageProgress] = Field(default_factory=list)
    message: str = ""

    @property
    def done_steps(self) -> int:
        """Steps with an outcome the job counts."""
        return self.successful_steps + self.failed_steps + self.unreachable_steps

    @property
    def is_completed(self) -> bool:
        """Every step has an outcome the job counts."""
        return self.done_steps == self.total_steps

    @property
    def is_stopped(self) -> bool:
        """Every step has an outcome or a counted stop, or belongs to a stage never started."""
        not_started = sum(s.remaining_steps for s in self.stages if not s.is_started)
        accounted = (
            self.successful_steps
            + self.failed_steps
            + self.unreachable_steps
            + self.stopped_steps
            + not_started
        )
        return accounted == self.total_steps

    @property
    def has_failures(self) -> bool:
        return self.failed_steps > 0 or self.unreachable_steps > 0


class JobOwner(_Model):
    """The live activation of a job: at most one per job, claimed by compare-and-set."""

    host: str
    activation_epoch: int = 0
    lease_expires: datetime | None = None

    @field_validator("lease_expires")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        return None if value is None else utc(value)


class PlannedStep(_Model):
    """One entry of a saved plan: everything needed to prepare the step again."""

    step_id: str
    stage: int = 0
    step_type: str
    name: str = ""
    request: Payload


class WorkerWait(_Model):
    """A job waiting for a worker host that can run its steps: why none can, and since when."""

    reason: str
    since: datetime

    _utc = field_validator("since")(classmethod(lambda cls, v: utc(v)))


class KeyWait(_Model):
    """A job waiting for its concurrency key: the key, its limit, since when."""

    key: str
    limit: int
    since: datetime

    _utc = field_validator("since")(classmethod(lambda cls, v: utc(v)))

    def text(self) -> str:
        return f"waiting: key {self.key} at its limit {self.limit}"


class WindowState(_Model):
    """A job's adaptive window of active steps, as it stands (`AdaptiveConcurrency`)."""

    window: int
    limit: int
    throttled: int = 0
    """Outcomes that counted as throttled so far."""

    def text(self) -> str:
        return f"window {self.window}/{self.limit}, throttled {self.throttled} times"


class Quarantine(_Model):
    """A job recovery gave up on: why, after how many attempts in a row, and since when."""

    reason: str
    attempts: int
    since: datetime

    _utc = field_validator("since")(classmethod(lambda cls, v: utc(v)))


class JobState(_Model):
    """The stored record of a job."""

    id: str
    key: JobKey = Field(default_factory=JobKey)
    type: str
    details: str = ""
    status: JobStatus = JobStatus.NONE
    created: datetime
    status_changes: list[StatusChange] = Field(default_factory=list)
    progress: JobProgress = Field(default_factory=JobProgress)
    request: Payload | None = None
    plan: list[PlannedStep] | None = None
    """The inline copy of the plan; dropped by the write that makes the job Running."""
    has_stored_step_plan: bool = False
    stored_step_plan_incarnation: int | None = None
    stop_finalized: bool = False
    stopped_steps_counted: list[str] = Field(default_factory=list)
    execution_generation: int = 0
    max_active_steps: int | None = None
    """This job's window of active steps, given when it started (`jobs.map`); None leaves it
    to the job class, then the options."""
    pending_drain: bool = False
    owner: JobOwner | None = None
    waiting_for_worker: WorkerWait | None = None
    """Set while no worker host qualifies for the job's steps (`worker_wait_timeout`)."""
    recovery_attempts: int = 0
    """Recoveries begun since the last one that completed, counted before each begins (so a
    host that dies mid-activation counts too); see `max_recovery_attempts`."""
    recovery_error: str = ""
    """Why the last counted recovery failed, when it failed with an error (a host that died
    leaves none); part of the quarantine's reason."""
    quarantine: Quarantine | None = None
    """Set once recovery gave up on the job: no recovery and no report activates it again
    until an explicit resume takes it out."""
    priority: int = 0
    """Higher goes first while jobs wait for the same workers; a waiting job's priority rises
    with its wait (docs/scheduling.md). From `start(priority=...)` or the job class."""
    concurrency_key: str | None = None
    """The job's concurrency key (`Job.concurrency`, or the one `start` named)."""
    waiting_for_key: KeyWait | None = None
    """Set while the job waits for its key: as many jobs of its key as its limit run."""
    adaptive_windows: dict[str, WindowState] = Field(default_factory=dict)
    """Each adaptive step class's window by type; `adaptive_window`: earlier versions' one."""
    adaptive_window: WindowState | None = None
    rerun_steps: list[str] = Field(default_factory=list)
    """Failed (and unreachable) steps a `retry_failed` runs again, written with the Running
    that begins it and emptied once their records are reset: a recovery in between resets
    them (see `Resuming.rerun`)."""
    progress_history: list[tuple[int, int]] = Field(default_factory=list)
    """(seconds since `created`, steps done) as the job's writes saw them, at most one point
    per `history.PROGRESS_EVERY` seconds and `PROGRESS_POINTS` in all, the older ones thinned: what
    the console draws its chart and reckons its rate from."""
    changed: datetime | None = None
    """When a write last changed its status or progress (None before one): see `last_change`."""
    version: int = Field(default=0, exclude=True)
    """Compare-and-set token: 0 for a record never saved, then the stored version. Kept
    beside the record, never in its JSON (excluded in the schema: an `exclude=` argument
    per dump nearly doubled the cost of encoding a step record)."""

    _utc = field_validator("created", "changed")(classmethod(lambda cls, v: v and utc(v)))

    @property
    def last_change(self) -> datetime:
        """The latest of creation, last status change and last progress write (`changed`)."""
        last = self.status_changes[-1].occurred if self.status_changes else self.created
        return max(last, self.created, self.changed or self.created)

    @property
    def is_preparing_or_running(self) -> bool:
        return self.status.is_running

    @property
    def is_finished(self) -> bool:
        """Nothing more happens by itself: terminal, or stopped with its stop finalized."""
        return self.status.is_terminal or (self.status == JobStatus.STOPPED and self.stop_finalized)

    @property
    def is_prepared(self) -> bool:
        """The job crossed StartingSteps at some point of its history."""
        return any(c.status == JobStatus.STARTING_STEPS for c in self.status_changes)


class JobStepProgress(_Model):
    percentage: float = 0.0
    message: str = ""


_NO_PROGRESS = JobStepProgress()


class StepLease(_Model):
    """Who runs a step and when it last said so; kept with the outcome, it names the run that
    stored it (with the record's attempt and generation: the run identity)."""

    node: str
    activation: str
    heartbeat: datetime
    host: str = ""
    """The worker host that runs the step (empty in records of earlier releases): a start
    sent again goes back to it while it lives."""

    _utc = field_validator("heartbeat")(classmethod(lambda cls, v: utc(v)))


class StepError(_Model):
    """Why a step failed or stopped, with what it had done so far."""

    messages: list[str] = Field(default_factory=list)
    stack_trace: str = ""
    partial_result: Payload | None = None
    cancelled: bool = False
    non_retryable: bool = False
    """The step said no retry could help (`StepFailed(non_retryable=True)`)."""
    error_type: str = ""
    """The exception's type as `module.QualName` (a builtin's bare name), which a retry
    policy's `non_retryable_error_types` names; empty for a stop and in older records."""
    retry_after: float | None = None
    """Seconds the step asked to wait before its next attempt (`StepFailed(retry_after=...)`),
    instead of its retry policy's backoff."""
    throttled: bool = False
    """The service behind the step asked it to slow down (`StepFailed(throttled=True)`)."""


class StepDecision(_Model):
    """What the job decided for a failed attempt, stored with it: a recovery reads it instead
    of deciding again (the job's `should_retry_step` is author code, free to answer otherwise
    the second time), and waits for the same retry time."""

    attempt: int
    """The attempt it was decided for: a record whose attempt moved on holds a newer outcome."""
    retry: bool
    retry_at: datetime | None = None
    """When the next attempt is due (set when `retry`)."""

    _utc = field_validator("retry_at")(classmethod(lambda cls, v: None if v is None else utc(v)))


class JobStepState(_Model):
    """The stored record of a step."""

    id: str
    job_id: str
    type: str
    name: str = ""
    stage: int = 0
    position: int = 0
    """The step's place in its job's plan, set when it is prepared: listings order a stage's
    steps by it (0 in records of earlier releases, which then list by id)."""
    status: JobStepStatus = JobStepStatus.UNKNOWN
    status_changes: list[StatusChange] = Field(default_factory=list)
    progress: JobStepProgress = Field(default_factory=JobStepProgress)
    is_prepared: bool = False
    attempt: int = 1
    lease: StepLease | None = None
    generation: int = 0
    state: Payload | None = None
    """The step's own state (its checkpoint), built from the request when prepared."""
    result: Payload | None = None
    error: StepError | None = None
    decision: StepDecision | None = None
    """The job's decision on the stored failed attempt; None for any other outcome, and in
    records of earlier releases (decided then as they were)."""
    waiting_for_key: KeyWait | None = None
    """Its run waits on a worker host for a place of its step-level concurrency key."""
    version: int = Field(default=0, exclude=True)
    """As `JobState.version`: beside the record, never in its JSON."""

    @property
    def last_change(self) -> datetime | None:
        """When its status last changed; None for a step prepared and never run."""
        return self.status_changes[-1].occurred if self.status_changes else None

    @classmethod
    def prepared(
        cls,
        *,
        id: str,
        job_id: str,
        type: str,
        name: str,
        stage: int,
        state: Payload,
        position: int = 0,
        version: int = 0,
    ) -> JobStepState:
        """A newly prepared record, every other field at its default. Built without validation
        (the values come checked from the plan), from a dict literal (half `trusted`'s time)."""
        values = {
            "id": id,
            "job_id": job_id,
            "type": type,
            "name": name,
            "stage": stage,
            "position": position,
            "status": JobStepStatus.UNKNOWN,
            "status_changes": [],
            "progress": _NO_PROGRESS,  # replaced, never changed in place: one is shared
            "is_prepared": True,
            "attempt": 1,
            "lease": None,
            "generation": 0,
            "state": state,
            "result": None,
            "error": None,
            "decision": None,
            "waiting_for_key": None,
            "version": version,
        }
        return trusted_sharing(cls, shared_fields(cls), values)
