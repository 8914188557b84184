"""A job's live activation: the lifecycle as an async state machine over storage and dispatch.

Durability contract (storage is the truth):
- the job is written PreparingJob before `prepare_steps` runs;
- the complete plan is saved before any step is prepared;
- steps are prepared and stored, in batches, with their planned identities;
- Running is written (dropping the inline plan) before the first step is dispatched;
- a step's outcome is persisted by its worker before the job hears of it, so the job's progress
  is a cache of step storage: a new activation recounts it from the steps.

One turn at a time: every operation and every batch of reports runs under the activation's
turn lock, so two calls never interleave on the job's state. Reports are queued and handled in
the job's own turn, so a step reporting while the job calls its worker cannot deadlock.
"""

from __future__ import annotations

from .activation import ActivationBase, JobStartResult, Released
from .outcomes import Outcomes
from .resuming import Resuming
from .stages import Staging
from .starting import Starting
from .stopping import Stopping


class JobActivation(Starting, Staging, Outcomes, Stopping, Resuming, ActivationBase):
    """The one live activation of one job: its lifecycle, phase by phase, over shared state."""


__all__ = ["JobActivation", "JobStartResult", "Released"]
