from __future__ import annotations

import dataclasses
import pathlib
import re

import pytest

from kmm.driver import config, reloading


@pytest.mark.parametrize(
    ("enabled", "wants", "access", "on", "warns"),
    [
        (None, False, True, False, False),  # unset: off unless the policy asks
        (None, True, True, True, False),
        (False, True, True, False, False),  # an explicit false always wins
        (True, False, True, True, False),
        (True, False, False, False, True),  # no cluster access: off, with a warning
        (None, True, False, False, True),
        (False, True, False, False, False),
    ],
)
def test_decide_dra(enabled: bool | None, wants: bool, access: bool, on: bool, warns: bool) -> None:
    decision = config.decide_dra(
        config.DRAConfig(enabled=enabled), policy_wants=wants, cluster_access=access
    )
    assert decision.enabled is on
    assert (decision.warning is not None) is warns


def test_changing_dra_enabled_at_runtime_is_refused() -> None:
    old = config.Config(node="n", driver_name="d.example.com", module="m")
    for enabled in (True, False):
        new = dataclasses.replace(old, dra=config.DRAConfig(enabled=enabled))
        with pytest.raises(config.ConfigError, match="needs a restart"):
            config.check_reconfigure(old, new)
    config.check_reconfigure(old, dataclasses.replace(old, dev_pattern="x*"))


def test_changing_the_watched_kernel_module_needs_a_restart() -> None:
    # The policy is built with it once; a reload must not pretend to change it.
    old = config.Config(node="n", driver_name="d.example.com", module="m", kernel_module="m")
    with pytest.raises(config.ConfigError, match="changing kernel_module needs a restart"):
        config.check_reconfigure(old, dataclasses.replace(old, kernel_module=None))


def test_the_settings_file_sets_the_tri_state_and_discovery(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "settings.yaml"
    path.write_text(
        "dra:\n  enabled: false\ndeviceClass: mydev\ndevicePattern: 'mydev*'\n"
        "pollInterval: 2.5\nlogLevel: debug\n"
    )
    found = config.load_file(path)
    assert found.dra.enabled is False
    assert (found.device_class, found.dev_pattern) == ("mydev", "mydev*")
    assert (found.poll_interval, found.log_level) == (2.5, "debug")
    path.write_text("dra: {}\n")
    assert config.load_file(path).dra.enabled is None  # absent: the policy decides
    path.write_text("")
    assert config.load_file(path) == config.FileSettings()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("dra:\n  enabled: maybe\n", "dra.enabled: Input should be a valid boolean"),
        ("devicePatern: x\n", "devicePatern: Extra inputs are not permitted"),
        ("dev_pattern: x\n", "dev_pattern: Extra inputs are not permitted"),  # only camelCase
        ("pollInterval: 0\n", "pollInterval: Input should be greater than 0"),
        ("- a list\n", "expected a mapping"),
        ("dra: [\n", "while parsing"),
    ],
)
def test_a_bad_settings_file_names_the_field_and_the_rule(
    tmp_path: pathlib.Path, text: str, message: str
) -> None:
    path = tmp_path / "settings.yaml"
    path.write_text(text)
    with pytest.raises(config.ConfigError, match=re.escape(message)):
        config.load_file(path)


def test_the_reloader_applies_a_change_and_keeps_the_old_settings_on_a_bad_file(
    tmp_path: pathlib.Path,
) -> None:
    path = tmp_path / "settings.yaml"
    path.write_text("devicePattern: a*\n")
    applied: list[config.Config] = []
    base = config.Config(node="n", driver_name="d.example.com", module="m")

    def make(settings: config.FileSettings) -> config.Config:
        return dataclasses.replace(base, dev_pattern=settings.dev_pattern)

    def apply(new: config.Config) -> bool:
        applied.append(new)
        return True

    following = reloading.Reloader(path, make, apply)
    assert following.check() is None  # unchanged since it started
    path.write_text("devicePattern: bb*\n")
    assert following.check() is True
    assert [c.dev_pattern for c in applied] == ["bb*"]
    path.write_text("devicePattern: [\n")
    assert following.check() is False
    assert len(applied) == 1
