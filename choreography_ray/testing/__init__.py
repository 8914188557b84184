"""Public helpers for testing jobs: an in-process cluster, fault injection, a fake clock."""
