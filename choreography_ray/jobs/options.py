"""Settings of the job system, with their defaults.

Options come from code (`JobsOptions(...)`), from environment variables (`CHOREOGRAPHY_` and the
setting's name in capitals) and from a TOML file (a `[jobs]` table, or top-level keys). A bad
value is refused with an `InvalidOptionError` that names the setting and, for the environment or
a file, where the value came from.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, field_validator

from .errors import InvalidOptionError

ENV_PREFIX = "CHOREOGRAPHY_"

_DURATION = re.compile(r"^\s*(?P<n>\d+(?:\.\d+)?)\s*(?P<unit>ms|s|m|h|d)?\s*$", re.IGNORECASE)
_ISO_DURATION = TypeAdapter(timedelta)
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}
_FOREVER = {"infinite", "forever", "never", "none", "off"}
LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
"""A node label key as Ray and Kubernetes take it: an optional DNS prefix and `/`, a name."""
CALLABLE_NAME = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
"""An importable callable named as `module:callable`, e.g. `myapp.recovery:job_keys`."""


def parse_duration(value: Any) -> timedelta:
    """Seconds as a number, a `timedelta`, or text such as `500ms`, `10s`, `5m`, `1h`, `7d`."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool):
        raise ValueError("expected a duration, got a boolean")
    seconds: float | None = None
    if isinstance(value, int | float):
        seconds = value
    elif isinstance(value, str):
        match = _DURATION.match(value)
        if match:
            unit = match["unit"].lower() if match["unit"] else None
            seconds = float(match["n"]) * _UNIT_SECONDS[unit]
        elif value.strip().upper().startswith(("P", "-P")):
            # ISO 8601, as the options' own JSON form writes durations (the cluster's stored
            # configuration reads back what `connect` wrote).
            try:
                return _ISO_DURATION.validate_python(value.strip())
            except ValidationError:
                pass
    if seconds is None:
        raise ValueError(f"expected a duration such as 10s, 5m, 1h or 7d; got {value!r}")
    if isinstance(seconds, float) and not math.isfinite(seconds):
        raise ValueError(f"expected a finite duration; got {value!r}")
    try:
        return timedelta(seconds=seconds)
    except OverflowError:
        raise ValueError(f"duration {value!r} is too large") from None


def default_max_parallel_steps() -> int:
    """Synchronous steps a node performs at once by default: its CPUs but one (each runs as a
    Ray task on a CPU). Async steps have a far wider default window (docs/configuration.md)."""
    return max(1, (os.cpu_count() or 1) - 1)


class JobsOptions(BaseModel):
    """Every setting of the job system. Immutable; build a new one to change a value."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_parallel_steps: int | None = None
    """Steps one worker node performs at once, of every kind. None: derived from the node's
    CPUs and the step's kind — async steps 128 per CPU, synchronous steps max(1, cpus - 1)."""
    dead_job_threshold: timedelta = timedelta(hours=1)
    """A preparing job older than this with no stored step is dead and cleaned up."""
    cleanup_cadence: timedelta = timedelta(hours=1)
    step_checkpoint_batch_interval: int = 100
    """A step persists its checkpoint every N checkpoints it reports (1 = every one)."""
    step_checkpoint_flush_interval: timedelta = timedelta(seconds=5)
    """An idle step's pending checkpoint is flushed after this; zero disables the timer."""
    max_concurrent_rehydration: int = 8
    max_recovery_attempts: int = 10
    """Recoveries of a job begun in a row without one completing before recovery gives up on
    it and quarantines it (a poison job); an explicit resume takes it out."""
    max_concurrent_cleanup: int = 4
    terminal_job_retention: timedelta | None = timedelta(days=7)
    """Completed and failed jobs older than this are removed; None keeps them forever."""
    max_terminal_jobs_per_cleanup: int = 100
    max_concurrent_step_starts: int = 16
    step_stop_timeout: timedelta = timedelta(seconds=10)
    deactivation_timeout: timedelta = timedelta(seconds=10)
    """How long a worker host that shuts down waits for the work of its steps (cancelled) and
    their callbacks to end before it closes storage; it writes no final status."""
    max_active_steps_per_job: int | None = 20_000
    """A sliding window of active steps per job; None means no window. The default bounds what
    a job of a million steps tracks and queues on its worker hosts at once (docs/decisions.md),
    far above what a node performs at once."""
    max_step_attempts: int = 1
    step_retry_backoff: timedelta = timedelta(seconds=1)
    max_step_retry_backoff: timedelta = timedelta(seconds=60)
    step_lease_timeout: timedelta = timedelta(0)
    """Heartbeat lease of running steps; zero turns leases off."""
    job_watchdog_interval: timedelta = timedelta(seconds=30)
    worker_wait_timeout: timedelta = timedelta(minutes=15)
    """How long a starting job waits, durably, for a worker host that can run its steps
    before they count failed; zero fails them at once (the reference system's behaviour)."""
    autoscale_max_worker_nodes: int = 10
    """The most worker nodes the unfinished steps ask Ray's autoscaler for (a resource request
    of `choreography_worker` bundles); zero asks for none."""
    worker_idle_timeout: timedelta = timedelta(seconds=60)
    """How long a worker node runs no step before its hosts leave it, while Ray's autoscaler
    runs and fewer worker nodes are wanted, so that the autoscaler can remove it."""
    step_delivery_retry_delay: timedelta = timedelta(seconds=1)
    max_step_delivery_retry_delay: timedelta = timedelta(seconds=60)
    step_delivery_max_attempts: int = 10
    max_inline_step_plan_size: int = 1024 * 1024
    """Bytes; a larger plan is stored apart where the provider can. Zero externalizes all."""
    transient_retry_attempts: int = 5
    """Attempts of a storage operation that failed with a transient error."""
    transient_retry_base_delay: timedelta = timedelta(milliseconds=100)
    max_transient_retry_delay: timedelta = timedelta(seconds=5)
    host_call_timeout: timedelta = timedelta(seconds=10)
    """How long a host waits for another host's answer before treating it as gone."""
    job_ownership_lease: timedelta = timedelta(seconds=60)
    """How long a controller's claim on a job it runs holds without renewal; its activation
    renews it every third of that. A job whose lease expired is claimed by the sweep."""
    reconciliation_interval: timedelta = timedelta(seconds=60)
    """How often one controller host sweeps storage for unfinished jobs that no live
    activation holds (expired ownership lease) and resumes them; zero turns the sweep off."""
    membership_interval: timedelta = timedelta(seconds=1)
    """How often every controller host reads the cluster's nodes and host actors, to notice a
    node that died or joined and a host actor that was killed."""
    priority_aging: float = 1.0
    """Points of priority a job waiting for a worker slot gains per minute of waiting: one of
    priority 0 behind priority-N work waits at most N / this minutes (docs/scheduling.md)."""
    finish_started_jobs: float = 0.0
    """Points of priority a job gains in proportion to the share of its steps done (all of
    them at 100 %): started jobs finish before new ones take the workers; 0 turns it off."""
    concurrency_poll_interval: timedelta = timedelta(seconds=1)
    """How often a job waiting for its concurrency key asks again whether a place is free
    (at once when a job of its key on the same controller host finishes); a worker host's
    steps waiting for their step-level key ask as often."""
    step_key_lease: timedelta = timedelta(seconds=30)
    """How long a worker host's place of a step-level concurrency key holds without renewal
    (renewed every third of it): a host that dies gives its places back when they expire."""
    key_providers: tuple[str, ...] = ()
    """Key providers every controller host asks for partitions to recover, as importable
    `module:callable` names (beside the entry points of `choreography_ray.key_providers`)."""
    role_label: str = "choreography.io/role"
    """The Ray node label whose value (controller, worker, both) gives a node its roles."""
    parallelism_label: str = "choreography.io/max-parallel-steps"
    """The Ray node label that sets a worker node's own `max_parallel_steps`."""
    job_director: str | None = None
    """The director that chooses a new job's controller host, as `module:callable`."""
    step_director: str | None = None
    """The director that chooses the worker hosts of a job's steps, as `module:callable`."""

    @field_validator(
        "dead_job_threshold",
        "cleanup_cadence",
        "step_checkpoint_flush_interval",
        "step_stop_timeout",
        "deactivation_timeout",
        "step_retry_backoff",
        "max_step_retry_backoff",
        "step_lease_timeout",
        "job_watchdog_interval",
        "worker_wait_timeout",
        "worker_idle_timeout",
        "step_delivery_retry_delay",
        "max_step_delivery_retry_delay",
        "transient_retry_base_delay",
        "max_transient_retry_delay",
        "reconciliation_interval",
        mode="before",
    )
    @classmethod
    def _duration(cls, value: Any) -> timedelta:
        duration = parse_duration(value)
        if duration < timedelta(0):
            raise ValueError("must not be negative")
        return duration

    @field_validator("host_call_timeout", "job_ownership_lease", "step_key_lease", mode="before")
    @classmethod
    def _positive_duration(cls, value: Any) -> timedelta:
        duration = parse_duration(value)
        if duration <= timedelta(0):
            raise ValueError("must be positive: a wait on another host cannot last forever")
        return duration

    @field_validator("membership_interval", "concurrency_poll_interval", mode="before")
    @classmethod
    def _cadence(cls, value: Any) -> timedelta:
        duration = parse_duration(value)
        if duration <= timedelta(0):
            raise ValueError("must be positive: the cluster is read this often")
        return duration

    @field_validator("priority_aging", "finish_started_jobs", mode="before")
    @classmethod
    def _points(cls, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise ValueError(f"expected a number of points, got {value!r}")
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"expected a number of points, got {value!r}") from None
        if not 0.0 <= number < float("inf"):
            raise ValueError("must be a finite number, 0 or more")
        return number

    @field_validator("key_providers", mode="before")
    @classmethod
    def _provider_names(cls, value: Any) -> tuple[str, ...]:
        if value is None:
            return ()
        names = value.split(",") if isinstance(value, str) else value
        if not isinstance(names, list | tuple) or not all(isinstance(n, str) for n in names):
            raise ValueError(f"expected module:callable names, got {value!r}")
        names = tuple(name.strip() for name in names if name.strip())
        for name in names:
            if not CALLABLE_NAME.match(name):
                raise ValueError(
                    f"expected an importable callable as module:callable, got {name!r}"
                )
        return names

    @field_validator("job_director", "step_director", mode="before")
    @classmethod
    def _director_name(cls, value: Any) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str) or not CALLABLE_NAME.match(value.strip()):
            raise ValueError(f"expected an importable director as module:callable, got {value!r}")
        return value.strip()

    @field_validator("role_label", "parallelism_label", mode="before")
    @classmethod
    def _label_key(cls, value: Any) -> str:
        if not isinstance(value, str) or not LABEL_KEY.match(value.strip()):
            raise ValueError(f"expected a node label key such as example.com/role, got {value!r}")
        return value.strip()

    @field_validator("terminal_job_retention", mode="before")
    @classmethod
    def _retention(cls, value: Any) -> timedelta | None:
        if value is None or (isinstance(value, str) and value.strip().lower() in _FOREVER):
            return None
        duration = parse_duration(value)
        if duration <= timedelta(0):
            raise ValueError("must be positive, or 'infinite' to keep jobs forever")
        return duration

    @field_validator(
        "max_parallel_steps",
        "max_active_steps_per_job",
        "step_checkpoint_batch_interval",
        "max_concurrent_rehydration",
        "max_recovery_attempts",
        "max_concurrent_cleanup",
        "max_terminal_jobs_per_cleanup",
        "max_concurrent_step_starts",
        "max_step_attempts",
        "step_delivery_max_attempts",
        "max_inline_step_plan_size",
        "transient_retry_attempts",
        "autoscale_max_worker_nodes",
        mode="before",
    )
    @classmethod
    def _not_a_boolean(cls, value: Any) -> Any:
        # pydantic reads True as 1; a boolean where a count belongs is a mistake, not a count.
        if isinstance(value, bool):
            raise ValueError(f"expected a whole number, got a boolean ({value!r})")
        return value

    @field_validator(
        "step_checkpoint_batch_interval",
        "max_concurrent_rehydration",
        "max_recovery_attempts",
        "max_concurrent_cleanup",
        "max_terminal_jobs_per_cleanup",
        "max_concurrent_step_starts",
        "max_step_attempts",
        "step_delivery_max_attempts",
        "transient_retry_attempts",
    )
    @classmethod
    def _at_least_one(cls, value: int) -> int:
        if value < 1:
            raise ValueError("must be at least 1")
        return value

    @field_validator("max_parallel_steps", "max_active_steps_per_job")
    @classmethod
    def _positive_or_none(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            raise ValueError("must be at least 1, or unset")
        return value

    @field_validator("max_inline_step_plan_size", "autoscale_max_worker_nodes")
    @classmethod
    def _size(cls, value: int) -> int:
        if value < 0:
            raise ValueError("must not be negative")
        return value

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as error:
            raise option_error(error) from None

    @property
    def effective_max_parallel_steps(self) -> int:
        """Steps one node surely performs at once, whatever their kind: what the autoscaler
        plans nodes by (async steps would fit many more)."""
        return self.max_parallel_steps or default_max_parallel_steps()

    def with_changes(self, **changes: Any) -> JobsOptions:
        """A copy with some settings changed, validated like the original."""
        values = self.model_dump(exclude_unset=True)
        values.update(changes)
        return JobsOptions(**values)

    # -- loading ---------------------------------------------------------------------------

    @classmethod
    def from_mapping(
        cls, values: Mapping[str, Any], *, origins: Mapping[str, str] | None = None
    ) -> JobsOptions:
        """Validate `values`; `origins` says where each came from, for error messages."""
        origins = origins or {}
        unknown = sorted(set(values) - set(cls.model_fields))
        if unknown:
            where = f" (from {origins[unknown[0]]})" if unknown[0] in origins else ""
            raise InvalidOptionError(
                unknown[0],
                f"unknown setting{where}; known settings: {', '.join(sorted(cls.model_fields))}",
            )
        try:
            return cls(**dict(values))
        except InvalidOptionError as error:
            if error.setting in origins:
                raise InvalidOptionError(
                    error.setting, f"{error.reason} (from {origins[error.setting]})"
                ) from None
            raise

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
        """The settings named by `CHOREOGRAPHY_<SETTING>` variables, as raw values."""
        environ = os.environ if environ is None else environ
        found: dict[str, Any] = {}
        for name in cls.model_fields:
            raw = environ.get(ENV_PREFIX + name.upper())
            if raw is None:
                continue
            found[name] = None if raw.strip().lower() in {"", "none", "null"} else raw
        return found

    @classmethod
    def from_toml(cls, path: str | Path) -> dict[str, Any]:
        """The settings of a TOML file: its `[jobs]` table, or its top-level keys."""
        path = Path(path)
        try:
            with path.open("rb") as handle:
                document = tomllib.load(handle)
        except FileNotFoundError:
            raise InvalidOptionError("config", f"file {str(path)!r} does not exist") from None
        except tomllib.TOMLDecodeError as error:
            raise InvalidOptionError(
                "config", f"{str(path)!r} is not valid TOML: {error}"
            ) from None
        table = document.get("jobs", document)
        if not isinstance(table, dict):
            raise InvalidOptionError("jobs", f"{str(path)!r}: [jobs] must be a table")
        return dict(table)

    @classmethod
    def load(
        cls,
        path: str | Path | None = None,
        *,
        environ: Mapping[str, str] | None = None,
        **overrides: Any,
    ) -> JobsOptions:
        """Defaults, then the TOML file, then the environment, then `overrides`."""
        values: dict[str, Any] = {}
        origins: dict[str, str] = {}
        if path is not None:
            for name, value in cls.from_toml(path).items():
                values[name] = value
                origins[name] = f"file {str(path)!r}"
        for name, value in cls.from_env(environ).items():
            values[name] = value
            origins[name] = f"environment variable {ENV_PREFIX}{name.upper()}"
        for name, value in overrides.items():
            values[name] = value
            origins.pop(name, None)
        return cls.from_mapping(values, origins=origins)


def option_error(error: ValidationError, what: str = "options") -> InvalidOptionError:
    """A pydantic validation error as one line naming the setting (or `what`) that is wrong:
    the same for job options and for the other settings a caller passes, such as a job key."""
    first = error.errors()[0]
    setting = ".".join(str(p) for p in first.get("loc", ())) or what
    message = first.get("msg", "invalid value")
    message = message.removeprefix("Value error, ")
    if first.get("type") == "extra_forbidden":
        message = "unknown setting"
    if "got " not in message:
        message = f"{message} (got {first.get('input')!r})"
    return InvalidOptionError(setting, message)
