"""Placement: controller and worker roles, directors, per-node step parallelism."""
