"""Recovery: rehydration of interrupted jobs, key providers, election, watchdog and leases.

Importing it hands `Rehydration` to every jobs manager built without a recovery of its own.
"""

from ..engine.manager import JobsManager
from .rehydration import Rehydration, RehydrationReport

JobsManager.default_recovery = Rehydration

__all__ = ["Rehydration", "RehydrationReport"]
