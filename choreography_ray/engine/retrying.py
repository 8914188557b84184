"""One decision for a step's outcome: count it, retry it at a time, or count it as a final
failure — made once, stored with the outcome, and read back everywhere else.

`decide` is the one function that answers; it runs live (`Outcomes.handle`), in the recount
(`Recount.load`, on resume and on a stop after a crash) and in the worker (`stored_steps`). A
failed attempt that already carries a decision (`JobStepState.decision`, stored by the job that
heard it) is decided as stored: the job's `should_retry_step` is author code, and a recovery
that asked it again could answer otherwise than the live run did, or wait another backoff.

`RetryRule` gives `decide` a step's policy: the step class's `retry_policy`, else the job
class's, else the options'; the failure's own `retry_after` sets the wait of that one retry.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum
from typing import Any

from ..jobs.errors import ChoreographyError
from ..jobs.job import Job, StepOutcome
from ..jobs.options import JobsOptions
from ..jobs.registry import TypeKind, TypeRegistry
from ..jobs.retry import RetryPolicy
from ..jobs.state import StepDecision
from ..jobs.status import JobStepStatus
from .messages import StepReport


class Verdict(Enum):
    COUNT = "count"
    """A success, a stop, an unreachable step: counted as it is."""
    RETRY = "retry"
    """A failed attempt tried again at `Decision.at`."""
    FINAL = "final"
    """A failure counted as the step's outcome."""


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    at: datetime | None = None
    """When the next attempt is due (a retry); None for a retry the job has not timed (what
    a worker, which does not know the job's policy, reads from an undecided record)."""

    def stored(self, attempt: int) -> StepDecision:
        return StepDecision(attempt=attempt, retry=self.verdict is Verdict.RETRY, retry_at=self.at)


COUNT = Decision(Verdict.COUNT)
FINAL = Decision(Verdict.FINAL)


def decide(
    outcome: StepReport,
    policy: RetryPolicy | None,
    *,
    now: datetime | None = None,
    should_retry: Callable[[], bool] | None = None,
) -> Decision:
    """What the job does with `outcome`. A decision stored for its attempt wins. Otherwise a
    failed attempt is retried when `policy` allows it (attempts left, not non-retryable, not
    an error type it names) and `should_retry` (the job's hook) agrees, at `now` plus the
    error's `retry_after` or the policy's backoff. Without a policy (a worker host) an
    undecided failure is left to the job: a start of a later attempt is its retry."""
    status = outcome.status
    if status != JobStepStatus.COMPLETED_WITH_FAILURE:
        return FINAL if status == JobStepStatus.FAILED else COUNT
    stored = outcome.decision
    if stored is not None and stored.attempt == outcome.attempt:
        return Decision(Verdict.RETRY, stored.retry_at) if stored.retry else FINAL
    if policy is None:
        return Decision(Verdict.RETRY)
    error = outcome.error
    if not policy.allows(
        outcome.attempt,
        error.error_type if error else "",
        non_retryable=bool(error and error.non_retryable),
    ):
        return FINAL
    if should_retry is not None and not should_retry():
        return FINAL
    delay = error.retry_after if error and error.retry_after is not None else None
    if delay is None:
        delay = policy.delay(outcome.attempt)
    assert now is not None, "a retry is timed from now"
    return Decision(Verdict.RETRY, now + timedelta(seconds=delay))


def options_policy(job_class: type[Job[Any]], options: JobsOptions) -> RetryPolicy:
    """The job class's policy, or the one the options (and the class's `max_step_attempts`)
    describe."""
    if job_class.retry_policy is not None:
        return job_class.retry_policy
    cap = options.max_step_retry_backoff
    return RetryPolicy(
        initial_interval=min(options.step_retry_backoff, cap),
        maximum_interval=cap,
        maximum_attempts=job_class.max_step_attempts or options.max_step_attempts,
    )


class RetryRule:
    """Decides a job's step outcomes: each step's policy, and the job's `should_retry_step`
    (a hook that raises says no)."""

    def __init__(
        self,
        job: Job[Any],
        options: JobsOptions,
        registry: TypeRegistry,
        log: logging.LoggerAdapter[logging.Logger],
    ) -> None:
        self.job = job
        self.log = log
        self._registry = registry
        self._job_policy = options_policy(type(job), options)
        self._step_policies: dict[str, RetryPolicy] = {}

    def policy_for(self, step_type: str) -> RetryPolicy:
        """The step class's policy, else the job's (a step type this host cannot resolve
        is decided by the job's, and said so once)."""
        policy = self._step_policies.get(step_type)
        if policy is None:
            policy = self._job_policy
            try:
                step_class = self._registry.resolve(step_type, TypeKind.STEP)
            except ChoreographyError as error:
                self.log.warning(
                    "job %s: step type %r unknown here (%s); its failures follow the job's "
                    "retry policy",
                    self.job.info.id,
                    step_type,
                    error,
                )
            else:
                policy = getattr(step_class, "retry_policy", None) or policy
            self._step_policies[step_type] = policy
        return policy

    def decide(
        self,
        outcome: StepReport,
        step_type: str,
        now: datetime,
        hook_outcome: Callable[[], StepOutcome],
    ) -> Decision:
        """`decide` with the step's policy and the job's hook (asked only when the policy
        leaves a retry; `hook_outcome` builds what it is shown)."""
        return decide(
            outcome,
            self.policy_for(step_type),
            now=now,
            should_retry=lambda: self._asks(hook_outcome()),
        )

    def _asks(self, outcome: StepOutcome) -> bool:
        try:
            return bool(self.job.should_retry_step(outcome, outcome.error))  # type: ignore[arg-type]
        except Exception:
            self.log.exception("job %s: should_retry_step failed; not retrying", self.job.info.id)
            return False
