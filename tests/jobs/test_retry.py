"""RetryPolicy: a frozen, checked value, and the one backoff schedule every retry loop uses."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest

from choreography_ray.jobs import InvalidOptionError, RetryPolicy
from choreography_ray.jobs.retry import Backoff, error_type_name


class CardDeclined(Exception):
    pass


def test_the_policy_waits_initial_then_grows_by_its_coefficient_up_to_its_maximum():
    policy = RetryPolicy(
        initial_interval=timedelta(seconds=2),
        backoff_coefficient=3,
        maximum_interval=30,
        maximum_attempts=5,
    )
    assert [policy.delay(n) for n in range(1, 6)] == [2, 6, 18, 30, 30]
    assert policy.maximum_interval == timedelta(seconds=30)  # seconds read as a duration


def test_the_defaults_are_the_options_defaults():
    policy = RetryPolicy()
    assert (policy.initial_interval, policy.maximum_interval) == (
        timedelta(seconds=1),
        timedelta(seconds=60),
    )
    assert (policy.backoff_coefficient, policy.maximum_attempts) == (2.0, 1)
    assert [policy.delay(n) for n in range(1, 9)] == [1, 2, 4, 8, 16, 32, 60, 60]


def test_the_policy_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        RetryPolicy().maximum_attempts = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("fields", "named", "says"),
    [
        ({"initial_interval": -1}, "initial_interval", ">= 0"),
        ({"initial_interval": "soon"}, "initial_interval", "timedelta or seconds"),
        ({"maximum_interval": 0.5}, "maximum_interval", "shorter than initial_interval"),
        ({"backoff_coefficient": 0.5}, "backoff_coefficient", ">= 1"),
        ({"backoff_coefficient": float("nan")}, "backoff_coefficient", ">= 1"),
        ({"maximum_attempts": 0}, "maximum_attempts", ">= 1"),
        ({"maximum_attempts": True}, "maximum_attempts", "whole number"),
        ({"non_retryable_error_types": "ValueError"}, "non_retryable_error_types", "tuple"),
        ({"non_retryable_error_types": (ValueError, 3)}, "non_retryable_error_types", "got 3"),
    ],
)
def test_a_bad_policy_is_refused_naming_the_field(fields, named, says):
    with pytest.raises(InvalidOptionError) as raised:
        RetryPolicy(**fields)
    assert raised.value.setting == f"RetryPolicy.{named}"
    assert says in str(raised.value)


def test_attempts_and_error_types_decide_whether_a_failure_may_be_retried():
    policy = RetryPolicy(
        maximum_attempts=3, non_retryable_error_types=(PermissionError, CardDeclined, "x.Y")
    )
    assert policy.non_retryable_error_types == (
        "PermissionError",
        f"{__name__}.CardDeclined",
        "x.Y",
    )
    assert policy.allows(1) and policy.allows(2) and not policy.allows(3)
    assert not policy.allows(1, error_type_name(CardDeclined))
    assert not policy.allows(1, "PermissionError")
    assert policy.allows(1, "ValueError")
    assert not policy.allows(1, non_retryable=True)


def test_a_backoff_grows_resets_and_answers_any_attempt():
    backoff = Backoff(1, 60)
    assert [backoff.next() for _ in range(8)] == [1, 2, 4, 8, 16, 32, 60, 60]
    backoff.reset()
    assert backoff.peek() == 1 and backoff.next() == 1 and backoff.peek() == 2
    assert backoff.nth(1000) == 60  # no overflow however long it failed
    assert RetryPolicy(maximum_interval=5).backoff().nth(4) == 5
    with pytest.raises(ValueError):
        Backoff(2, 1)
