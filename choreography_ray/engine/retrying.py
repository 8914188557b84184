"""The one rule for another attempt of a failed step, for live reports and stored failures."""

from __future__ import annotations

import logging
from typing import Any

from ..jobs.job import Job, StepOutcome
from ..jobs.options import JobsOptions
from ..jobs.state import JobStepState


class RetryRule:
    """Attempts left, the step did not rule it out, and the job's `should_retry_step` agrees."""

    def __init__(
        self, job: Job[Any], options: JobsOptions, log: logging.LoggerAdapter[logging.Logger]
    ) -> None:
        self.job = job
        self.options = options
        self.log = log
        self.max_attempts = type(job).max_step_attempts or options.max_step_attempts

    def allows(self, outcome: StepOutcome, non_retryable: bool) -> bool:
        """Whether `outcome` is tried again (a `should_retry_step` that raises says no)."""
        if non_retryable or outcome.attempt >= self.max_attempts:
            return False
        try:
            return bool(self.job.should_retry_step(outcome, outcome.error))  # type: ignore[arg-type]
        except Exception:
            self.log.exception("job %s: should_retry_step failed; not retrying", self.job.info.id)
            return False

    def allows_stored(self, step: JobStepState) -> bool:
        """Whether a stored failed attempt is tried again on resume, by the same rule."""
        outcome = StepOutcome(
            step_id=step.id,
            name=step.name,
            stage=step.stage,
            status=step.status,
            attempt=step.attempt,
            error=step.error,
        )
        return self.allows(outcome, bool(step.error and step.error.non_retryable))

    def backoff(self, attempt: int) -> float:
        """Seconds before attempt `attempt + 1`: doubling from the base, up to the cap."""
        base = self.options.step_retry_backoff.total_seconds()
        cap = self.options.max_step_retry_backoff.total_seconds()
        return min(cap, base * 2.0 ** (attempt - 1))
