"""Settings of the job system: defaults, sources, precedence, durations and refusals."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pydantic
import pytest

import choreography_ray.jobs.options as options_module
from choreography_ray.jobs import InvalidOptionError, JobsOptions, parse_duration

# Every setting: its kind (which values it takes) and its default.
#   duration   a non-negative timedelta
#   retention  a positive timedelta, or None for "keep forever"
#   count      a whole number, at least 1
#   optional   a whole number, at least 1, or None
#   size       a whole number of bytes, at least 0
#   timeout    a positive timedelta (a wait that must end, or a cadence)
#   names      importable module:callable names, as a list or comma-separated text
#   label      a node label key (an optional DNS prefix and /, a name)
#   director   one importable module:callable name, or None
SETTINGS: dict[str, tuple[str, Any]] = {
    "max_parallel_steps": ("optional", None),
    "dead_job_threshold": ("duration", timedelta(hours=1)),
    "cleanup_cadence": ("duration", timedelta(hours=1)),
    "step_checkpoint_batch_interval": ("count", 100),
    "step_checkpoint_flush_interval": ("duration", timedelta(seconds=5)),
    "max_concurrent_rehydration": ("count", 8),
    "max_recovery_attempts": ("count", 10),
    "max_concurrent_cleanup": ("count", 4),
    "terminal_job_retention": ("retention", timedelta(days=7)),
    "max_terminal_jobs_per_cleanup": ("count", 100),
    "max_concurrent_step_starts": ("count", 16),
    "step_stop_timeout": ("duration", timedelta(seconds=10)),
    "deactivation_timeout": ("duration", timedelta(seconds=10)),
    "max_active_steps_per_job": ("optional", 20_000),
    "max_step_attempts": ("count", 1),
    "step_retry_backoff": ("duration", timedelta(seconds=1)),
    "max_step_retry_backoff": ("duration", timedelta(seconds=60)),
    "step_lease_timeout": ("duration", timedelta(0)),
    "job_watchdog_interval": ("duration", timedelta(seconds=30)),
    "worker_wait_timeout": ("duration", timedelta(minutes=15)),
    "worker_idle_timeout": ("duration", timedelta(seconds=60)),
    "step_delivery_retry_delay": ("duration", timedelta(seconds=1)),
    "max_step_delivery_retry_delay": ("duration", timedelta(seconds=60)),
    "step_delivery_max_attempts": ("count", 10),
    "max_inline_step_plan_size": ("size", 1024 * 1024),
    "autoscale_max_worker_nodes": ("size", 10),
    "transient_retry_attempts": ("count", 5),
    "transient_retry_base_delay": ("duration", timedelta(milliseconds=100)),
    "max_transient_retry_delay": ("duration", timedelta(seconds=5)),
    "host_call_timeout": ("timeout", timedelta(seconds=10)),
    "job_ownership_lease": ("timeout", timedelta(seconds=60)),
    "reconciliation_interval": ("duration", timedelta(seconds=60)),
    "membership_interval": ("timeout", timedelta(seconds=1)),
    "concurrency_poll_interval": ("timeout", timedelta(seconds=1)),
    "step_key_lease": ("timeout", timedelta(seconds=30)),
    "priority_aging": ("points", 1.0),
    "finish_started_jobs": ("points", 0.0),
    "key_providers": ("names", ()),
    "role_label": ("label", "choreography.io/role"),
    "parallelism_label": ("label", "choreography.io/max-parallel-steps"),
    "job_director": ("director", None),
    "step_director": ("director", None),
}

# A valid value of each kind other than any default, as text and as what it reads as.
VALID_TEXT = {
    "duration": ("250ms", timedelta(milliseconds=250)),
    "retention": ("2d", timedelta(days=2)),
    "count": ("3", 3),
    "optional": ("3", 3),
    "size": ("2048", 2048),
    "timeout": ("250ms", timedelta(milliseconds=250)),
    "names": ("myapp.recovery:job_keys, other:keys", ("myapp.recovery:job_keys", "other:keys")),
    "label": ("example.com/tier", "example.com/tier"),
    "director": ("myapp.placement:Spot", "myapp.placement:Spot"),
    "points": ("2.5", 2.5),
}
VALID_TOML = {
    "duration": ('"90s"', timedelta(seconds=90)),
    "retention": ("3600", timedelta(hours=1)),
    "count": ("3", 3),
    "optional": ("3", 3),
    "size": ("0", 0),
    "timeout": ('"90s"', timedelta(seconds=90)),
    "names": ('["myapp.recovery:job_keys"]', ("myapp.recovery:job_keys",)),
    "label": ('"tier"', "tier"),
    "director": ('"myapp.placement:Spot"', "myapp.placement:Spot"),
    "points": ("2.5", 2.5),
}

# Bad values of each kind: in code, as environment text and as TOML.
BAD_IN_CODE = {
    "duration": [-1, "-5s", "soon", [10], True, float("inf"), float("nan"), 10**20],
    "retention": [0, -1, "0s", "soon", [10], True, float("inf")],
    "count": [0, -1, "many", 1.5, [1], True],
    "optional": [0, -1, "many", 1.5, [1], True],
    "size": [-1, "big", 1.5, [1], True],
    "timeout": [0, -1, "0s", "never", "soon", [10], True, float("inf"), None],
    "names": ["job_keys", "a b:c", "m:", [1], True, 3],
    "label": ["", "a b", "Bad_Prefix/x", "x/", "-x", [1], True, None],
    "director": ["Spot", "a b:c", "m:", ["m:f"], True, 3],
    "points": [-1, "many", [1], True, float("inf"), float("nan"), None],
}
BAD_IN_ENV = {
    "duration": ["-5s", "soon", "10 weeks", "99999999999d"],
    "retention": ["0", "soon"],
    "count": ["0", "-1", "many", "1.5"],
    "optional": ["0", "many"],
    "size": ["-1", "big"],
    "timeout": ["0", "0s", "-5s", "never", "soon"],
    "names": ["job_keys", "m:f, oops", "a/b:c"],
    "label": ["a b", "x/", "role="],
    "director": ["Spot", "m:f, other:g"],
    "points": ["-1", "many", "inf", "nan"],
}
BAD_IN_TOML = {
    "duration": ["-1", '"-5s"', '"soon"', "[10]", "true", "inf"],
    "retention": ["0", '"soon"', "true"],
    "count": ["0", "-1", '"many"', "1.5", "true"],
    "optional": ["0", '"many"', "true"],
    "size": ["-1", '"big"', "true"],
    "timeout": ["0", '"0s"', '"never"', "true"],
    "names": ['"job_keys"', "[1]", "true"],
    "label": ['"a b"', "[1]", "true"],
    "director": ['"Spot"', '["m:f"]', "true"],
    "points": ["-1", '"many"', "true", "inf"],
}


def settings_of(*kinds: str) -> list[str]:
    return [name for name, (kind, _) in SETTINGS.items() if kind in kinds]


def env_name(setting: str) -> str:
    return f"CHOREOGRAPHY_{setting.upper()}"


def bad_cases(table: dict[str, list[Any]]) -> list[Any]:
    return [
        pytest.param(name, value, id=f"{name}={value!r}")
        for name, (kind, _) in SETTINGS.items()
        for value in table[kind]
    ]


def write_toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "choreography.toml"
    path.write_text(text)
    return path


# -- defaults -----------------------------------------------------------------------------------


def test_the_table_of_these_tests_lists_every_setting() -> None:
    assert set(SETTINGS) == set(JobsOptions.model_fields)


@pytest.mark.parametrize(("setting", "default"), [(n, d) for n, (_, d) in SETTINGS.items()])
def test_every_setting_has_its_documented_default(setting: str, default: Any) -> None:
    assert getattr(JobsOptions(), setting) == default


def test_loading_with_no_sources_gives_the_defaults() -> None:
    assert JobsOptions.load(environ={}) == JobsOptions()


def test_step_stop_timeout_defaults_to_ten_seconds() -> None:
    assert JobsOptions().step_stop_timeout == timedelta(seconds=10)


def test_the_inline_step_plan_limit_defaults_to_one_mebibyte() -> None:
    assert JobsOptions().max_inline_step_plan_size == 1_048_576


def test_step_delivery_retries_start_at_one_second_and_stop_growing_at_a_minute() -> None:
    assert JobsOptions().step_delivery_retry_delay == timedelta(seconds=1)
    assert JobsOptions().max_step_delivery_retry_delay == timedelta(seconds=60)


def test_step_leases_are_off_by_default_and_zero_keeps_them_off() -> None:
    assert JobsOptions().step_lease_timeout == timedelta(0)
    assert JobsOptions(step_lease_timeout=0).step_lease_timeout == timedelta(0)


def test_rehydration_resumes_eight_jobs_at_once_by_default() -> None:
    assert JobsOptions().max_concurrent_rehydration == 8


@pytest.mark.parametrize(("cpus", "expected"), [(None, 1), (1, 1), (2, 1), (3, 2), (16, 15)])
def test_parallel_steps_default_to_one_less_than_the_cpus_but_at_least_one(
    monkeypatch: pytest.MonkeyPatch, cpus: int | None, expected: int
) -> None:
    monkeypatch.setattr(options_module.os, "cpu_count", lambda: cpus)
    assert JobsOptions().max_parallel_steps is None
    assert JobsOptions().effective_max_parallel_steps == expected


def test_a_configured_parallel_step_count_wins_over_the_cpu_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(options_module.os, "cpu_count", lambda: 64)
    assert JobsOptions(max_parallel_steps=3).effective_max_parallel_steps == 3


# -- sources ------------------------------------------------------------------------------------


def test_settings_are_given_in_code() -> None:
    configured = JobsOptions(
        max_parallel_steps=4, step_stop_timeout="30s", terminal_job_retention=timedelta(days=1)
    )
    assert configured.max_parallel_steps == 4
    assert configured.step_stop_timeout == timedelta(seconds=30)
    assert configured.terminal_job_retention == timedelta(days=1)


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_every_setting_is_read_from_its_environment_variable(setting: str) -> None:
    text, expected = VALID_TEXT[SETTINGS[setting][0]]
    loaded = JobsOptions.load(environ={env_name(setting): text})
    assert getattr(loaded, setting) == expected


def test_the_environment_reader_returns_only_the_settings_it_found() -> None:
    environ = {"CHOREOGRAPHY_STEP_STOP_TIMEOUT": "3s", "PATH": "/bin", "CHOREOGRAPHY_OTHER": "x"}
    assert JobsOptions.from_env(environ) == {"step_stop_timeout": "3s"}


def test_other_choreography_variables_in_the_environment_are_ignored() -> None:
    environ = {"CHOREOGRAPHY_TEST_POSTGRES_URL": "postgresql://x", "CHOREOGRAPHY_NOPE": "1"}
    assert JobsOptions.load(environ=environ) == JobsOptions()


@pytest.mark.parametrize("text", ["", "none", "None", "null", "  "])
@pytest.mark.parametrize("setting", settings_of("optional", "retention"))
def test_an_empty_or_none_environment_value_unsets_an_optional_setting(
    setting: str, text: str
) -> None:
    assert getattr(JobsOptions.load(environ={env_name(setting): text}), setting) is None


@pytest.mark.parametrize("text", ["infinite", "INFINITE", "forever", "never", "off"])
def test_terminal_job_retention_infinite_in_the_environment_keeps_jobs_forever(text: str) -> None:
    loaded = JobsOptions.load(environ={"CHOREOGRAPHY_TERMINAL_JOB_RETENTION": text})
    assert loaded.terminal_job_retention is None


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_every_setting_is_read_from_the_jobs_table_of_a_toml_file(
    tmp_path: Path, setting: str
) -> None:
    value, expected = VALID_TOML[SETTINGS[setting][0]]
    path = write_toml(tmp_path, f"[jobs]\n{setting} = {value}\n")
    assert getattr(JobsOptions.load(path, environ={}), setting) == expected


def test_settings_are_read_from_the_top_level_of_a_toml_file(tmp_path: Path) -> None:
    path = write_toml(
        tmp_path,
        'step_stop_timeout = "2m"\nmax_concurrent_rehydration = 2\n'
        'terminal_job_retention = "infinite"\n',
    )
    loaded = JobsOptions.load(path, environ={})
    assert loaded.step_stop_timeout == timedelta(minutes=2)
    assert loaded.max_concurrent_rehydration == 2
    assert loaded.terminal_job_retention is None


def test_the_jobs_table_is_used_when_the_file_has_one(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "[jobs]\nmax_concurrent_cleanup = 2\n\n[other]\nanything = 1\n")
    assert JobsOptions.load(path, environ={}).max_concurrent_cleanup == 2


def test_the_file_is_given_as_text_or_a_path(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "[jobs]\nmax_step_attempts = 3\n")
    assert JobsOptions.load(str(path), environ={}).max_step_attempts == 3
    assert JobsOptions.from_toml(path) == {"max_step_attempts": 3}


def test_an_empty_file_gives_the_defaults(tmp_path: Path) -> None:
    assert JobsOptions.load(write_toml(tmp_path, ""), environ={}) == JobsOptions()


def test_code_overrides_the_environment_which_overrides_the_file_which_overrides_defaults(
    tmp_path: Path,
) -> None:
    path = write_toml(
        tmp_path,
        '[jobs]\nstep_stop_timeout = "1s"\ndead_job_threshold = "1m"\ncleanup_cadence = "1m"\n',
    )
    environ = {
        "CHOREOGRAPHY_STEP_STOP_TIMEOUT": "2s",
        "CHOREOGRAPHY_DEAD_JOB_THRESHOLD": "2m",
        "CHOREOGRAPHY_MAX_CONCURRENT_CLEANUP": "2",
    }
    loaded = JobsOptions.load(path, environ=environ, step_stop_timeout="3s", max_step_attempts=3)
    assert loaded.step_stop_timeout == timedelta(seconds=3)  # code over env over file
    assert loaded.dead_job_threshold == timedelta(minutes=2)  # env over file
    assert loaded.cleanup_cadence == timedelta(minutes=1)  # file over default
    assert loaded.max_concurrent_cleanup == 2  # env over default
    assert loaded.max_step_attempts == 3  # code over default
    assert loaded.max_concurrent_rehydration == 8  # default


def test_a_good_override_hides_a_bad_value_from_the_environment_or_file(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "max_concurrent_cleanup = 0\n")
    environ = {"CHOREOGRAPHY_MAX_CONCURRENT_CLEANUP": "0"}
    loaded = JobsOptions.load(path, environ=environ, max_concurrent_cleanup=5)
    assert loaded == JobsOptions(max_concurrent_cleanup=5)


def test_an_override_can_unset_an_optional_setting_from_the_environment() -> None:
    environ = {"CHOREOGRAPHY_MAX_PARALLEL_STEPS": "4"}
    assert JobsOptions.load(environ=environ).max_parallel_steps == 4
    assert JobsOptions.load(environ=environ, max_parallel_steps=None).max_parallel_steps is None


def test_from_mapping_validates_plain_values() -> None:
    loaded = JobsOptions.from_mapping({"max_step_attempts": 2, "step_retry_backoff": "5s"})
    assert loaded == JobsOptions(max_step_attempts=2, step_retry_backoff=timedelta(seconds=5))


# -- durations ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("500ms", timedelta(milliseconds=500)),
        ("10s", timedelta(seconds=10)),
        ("5m", timedelta(minutes=5)),
        ("1h", timedelta(hours=1)),
        ("7d", timedelta(days=7)),
        ("1.5h", timedelta(minutes=90)),
        ("0.25s", timedelta(milliseconds=250)),
        ("90", timedelta(seconds=90)),
        (" 10 S ", timedelta(seconds=10)),
        ("2MS", timedelta(milliseconds=2)),
        ("0", timedelta(0)),
        (30, timedelta(seconds=30)),
        (2.5, timedelta(seconds=2.5)),
        (0, timedelta(0)),
        (timedelta(minutes=3), timedelta(minutes=3)),
    ],
)
def test_durations_are_numbers_of_seconds_text_with_a_unit_or_timedeltas(
    value: Any, expected: timedelta
) -> None:
    assert parse_duration(value) == expected
    assert JobsOptions(step_retry_backoff=value).step_retry_backoff == expected


@pytest.mark.parametrize(
    "value",
    ["", "soon", "10 weeks", "10sec", "s", "1e3s", "-5s", "1h30m", None, [1], {"s": 1}, True],
)
def test_anything_else_is_not_a_duration(value: Any) -> None:
    with pytest.raises(ValueError):
        parse_duration(value)


@pytest.mark.parametrize(
    "value", [float("inf"), float("-inf"), float("nan"), 10**20, "99999999999d"]
)
def test_infinite_or_huge_durations_are_refused_as_values_not_crashes(value: Any) -> None:
    with pytest.raises(ValueError):
        parse_duration(value)
    with pytest.raises(InvalidOptionError) as caught:
        JobsOptions(step_stop_timeout=value)
    assert caught.value.setting == "step_stop_timeout"


@pytest.mark.parametrize("value", ["infinite", "Infinite", " forever ", "never", "none", None])
def test_terminal_job_retention_infinite_means_keep_forever(value: Any) -> None:
    assert JobsOptions(terminal_job_retention=value).terminal_job_retention is None


def test_a_zero_duration_is_allowed_where_zero_means_off() -> None:
    configured = JobsOptions(step_checkpoint_flush_interval=0, step_lease_timeout="0s")
    assert configured.step_checkpoint_flush_interval == timedelta(0)
    assert configured.step_lease_timeout == timedelta(0)


def test_an_inline_plan_limit_of_zero_stores_every_plan_apart() -> None:
    assert JobsOptions(max_inline_step_plan_size=0).max_inline_step_plan_size == 0


# -- refusals -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("setting", "value"), bad_cases(BAD_IN_CODE))
def test_a_bad_value_in_code_is_refused_naming_the_setting(setting: str, value: Any) -> None:
    with pytest.raises(InvalidOptionError) as caught:
        JobsOptions(**{setting: value})
    assert caught.value.setting == setting
    assert str(caught.value).startswith(f"{setting}:")
    assert "(from" not in str(caught.value)


@pytest.mark.parametrize(("setting", "text"), bad_cases(BAD_IN_ENV))
def test_a_bad_environment_value_is_refused_naming_the_setting_and_the_variable(
    setting: str, text: str
) -> None:
    with pytest.raises(InvalidOptionError) as caught:
        JobsOptions.load(environ={env_name(setting): text})
    assert caught.value.setting == setting
    assert f"environment variable {env_name(setting)}" in str(caught.value)


@pytest.mark.parametrize(("setting", "value"), bad_cases(BAD_IN_TOML))
def test_a_bad_value_in_a_file_is_refused_naming_the_setting_and_the_file(
    tmp_path: Path, setting: str, value: str
) -> None:
    path = write_toml(tmp_path, f"[jobs]\n{setting} = {value}\n")
    with pytest.raises(InvalidOptionError) as caught:
        JobsOptions.load(path, environ={})
    assert caught.value.setting == setting
    assert str(path) in str(caught.value)


@pytest.mark.parametrize("setting", settings_of("duration", "count", "size", "timeout"))
def test_a_required_setting_cannot_be_unset(setting: str) -> None:
    with pytest.raises(InvalidOptionError) as caught:
        JobsOptions(**{setting: None})
    assert caught.value.setting == setting


@pytest.mark.parametrize("setting", settings_of("duration", "count", "size", "timeout"))
def test_an_empty_environment_value_of_a_required_setting_is_refused(setting: str) -> None:
    with pytest.raises(InvalidOptionError) as caught:
        JobsOptions.load(environ={env_name(setting): ""})
    assert caught.value.setting == setting
    assert env_name(setting) in str(caught.value)


def test_an_unknown_setting_in_code_is_refused() -> None:
    with pytest.raises(InvalidOptionError) as caught:
        JobsOptions(max_parallel_stepz=3)
    assert caught.value.setting == "max_parallel_stepz"
    assert "unknown setting" in str(caught.value)


def test_an_unknown_override_is_refused() -> None:
    with pytest.raises(InvalidOptionError) as caught:
        JobsOptions.load(environ={}, step_stop_timout="1s")
    assert caught.value.setting == "step_stop_timout"


@pytest.mark.parametrize("table", ["[jobs]\n", ""])
def test_an_unknown_setting_in_a_file_is_refused_naming_the_file_and_known_settings(
    tmp_path: Path, table: str
) -> None:
    path = write_toml(tmp_path, f"{table}step_stop_timout = 3\n")
    with pytest.raises(InvalidOptionError) as caught:
        JobsOptions.load(path, environ={})
    assert caught.value.setting == "step_stop_timout"
    message = str(caught.value)
    assert "unknown setting" in message
    assert str(path) in message
    assert "step_stop_timeout" in message


def test_a_malformed_toml_file_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "[jobs]\nstep_stop_timeout = = 3\n")
    with pytest.raises(InvalidOptionError) as caught:
        JobsOptions.load(path, environ={})
    assert str(path) in str(caught.value)
    assert "TOML" in str(caught.value)


def test_a_missing_file_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "missing.toml"
    with pytest.raises(InvalidOptionError) as caught:
        JobsOptions.load(path, environ={})
    assert str(path) in str(caught.value)
    assert "does not exist" in str(caught.value)


def test_a_jobs_entry_that_is_not_a_table_is_refused(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "jobs = 3\n")
    with pytest.raises(InvalidOptionError) as caught:
        JobsOptions.load(path, environ={})
    assert caught.value.setting == "jobs"
    assert str(path) in str(caught.value)


def test_a_bad_file_is_refused_even_when_the_environment_sets_the_same_setting(
    tmp_path: Path,
) -> None:
    path = write_toml(tmp_path, "[jobs\n")
    with pytest.raises(InvalidOptionError):
        JobsOptions.load(path, environ={"CHOREOGRAPHY_STEP_STOP_TIMEOUT": "1s"})


def test_a_refusal_message_shows_the_bad_value() -> None:
    with pytest.raises(InvalidOptionError, match=re.escape("-3")):
        JobsOptions(max_concurrent_cleanup=-3)


# -- changing -----------------------------------------------------------------------------------


def test_options_are_immutable() -> None:
    configured = JobsOptions()
    with pytest.raises(pydantic.ValidationError):
        configured.step_stop_timeout = timedelta(seconds=1)  # type: ignore[misc]


def test_with_changes_returns_a_copy_with_the_changes_and_keeps_the_rest() -> None:
    original = JobsOptions(max_concurrent_cleanup=2)
    changed = original.with_changes(step_stop_timeout="1m")
    assert changed.step_stop_timeout == timedelta(minutes=1)
    assert changed.max_concurrent_cleanup == 2
    assert original.step_stop_timeout == timedelta(seconds=10)


def test_with_changes_can_unset_an_optional_setting() -> None:
    assert JobsOptions(max_parallel_steps=2).with_changes(max_parallel_steps=None) == JobsOptions()


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("max_concurrent_rehydration", 0),
        ("step_stop_timeout", "-1s"),
        ("terminal_job_retention", 0),
        ("max_inline_step_plan_size", -1),
        ("max_parallel_steps", True),
        ("no_such_setting", 1),
    ],
)
def test_with_changes_validates_like_the_constructor(setting: str, value: Any) -> None:
    with pytest.raises(InvalidOptionError) as caught:
        JobsOptions().with_changes(**{setting: value})
    assert caught.value.setting == setting


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_every_setting_reads_back_from_its_own_json_form(setting: str) -> None:
    """`connect` stores the options as JSON in the cluster's configuration and every host reads
    them back: a duration set in code came back as ISO text ('PT30S') and was refused."""
    kind, _ = SETTINGS[setting]
    _, value = VALID_TEXT[kind]
    options = JobsOptions(**{setting: value})
    stored = options.model_dump(mode="json", exclude_unset=True)
    assert getattr(JobsOptions.from_mapping(stored), setting) == getattr(options, setting)
