from __future__ import annotations

import dataclasses

import pytest

from kmm.driver import config


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
