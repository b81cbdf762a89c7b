"""``kmm driver``'s flags and environment reach the policy it runs."""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from typing import Any

import pytest
from typer.testing import CliRunner

from kmm import cli
from kmm.cli import driving
from kmm.driver import config as driver_config
from kmm.driver import kmod


def _run_with(
    monkeypatch: pytest.MonkeyPatch, root: pathlib.Path, env: dict[str, str]
) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    class Policy(kmod.KmodPolicy):
        def __init__(self, **kwargs: Any) -> None:
            seen.update(kwargs)
            super().__init__(**kwargs)

    async def run(self: Any, *, install_signals: Callable[..., None] | None = None) -> str:
        seen["config"] = self.config
        return "SIGTERM"

    monkeypatch.setattr(kmod, "KmodPolicy", Policy)
    monkeypatch.setattr(driving.owning.Driver, "run", run)
    monkeypatch.setattr(driving, "_api_client", lambda kubeconfig, context: None)
    result = CliRunner().invoke(
        cli.build("driver"),
        ["driver", "--node=n", "--driver-name=d.example.com", "--module=foo", f"--root={root}"],
        env=env,
    )
    assert result.exit_code == 0, result.output
    return seen


def test_the_daemonsets_module_name_is_the_module_watched(
    monkeypatch: pytest.MonkeyPatch, root: pathlib.Path
) -> None:
    seen = _run_with(monkeypatch, root, {"KMM_MODULE_NAME": "kmm_ci_a"})
    assert seen["kernel_module"] == "kmm_ci_a"
    assert isinstance(seen["config"], driver_config.Config)
    assert seen["config"].kernel_module == "kmm_ci_a"


def test_without_it_no_module_is_watched(
    monkeypatch: pytest.MonkeyPatch, root: pathlib.Path
) -> None:
    seen = _run_with(monkeypatch, root, {"KMM_MODULE_NAME": ""})
    assert seen["kernel_module"] is None
