"""Recovery: rehydration of interrupted jobs, key providers, election, watchdog and leases.

A jobs manager is handed its recovery (`JobsManager(ctx, recovery=Rehydration)`): the engine
never imports this package.
"""

from .rehydration import Rehydration, RehydrationReport

__all__ = ["Rehydration", "RehydrationReport"]
