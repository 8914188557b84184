"""Recovery: rehydration of interrupted jobs, key providers, election, watchdog and leases."""
