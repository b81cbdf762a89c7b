"""The CLI loads only the command asked for, and still lists every command."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kmm import cli

_PROBE = """
import sys
sys.argv = ["kmm", {command!r}, "--help"]
from kmm import cli
try:
    cli.main()
except SystemExit:
    pass
print(sorted(m for m in ("grpc", "kmm.driver", "kmm.operator", "kmm.sandbox") if m in sys.modules))
"""


def _loaded_by(command: str) -> str:
    probe = subprocess.run(
        [sys.executable, "-c", _PROBE.format(command=command)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return probe.stdout.strip().splitlines()[-1]


def test_the_operator_does_not_load_grpc_or_the_driver() -> None:
    assert _loaded_by("operator") == "['kmm.operator']"


# Packages `kmm operator` never calls: each import is resident memory for
# the process's life (cryptography's bindings alone ~9 MiB; issue 33's
# budget is 64 MiB with 5,000 Nodes cached, bench/bench_operator.py).
_NOT_FOR_THE_OPERATOR = (
    "cryptography",
    "grpc",
    "google.protobuf",
    "kubernetes_asyncio",
    "rich",
    "kmm.driver",
    "kmm.kubelet",
    "kmm.kubeletplugin",
    "kmm.sandbox",
    "kmm.cli.sandboxing",
    "kmm.cli.driving",
)
_OPERATOR_PROBE = """
import sys
from kmm import cli
from kmm.operator import running
cli.build("operator")
print(sorted(m for m in {names!r} if m in sys.modules))
"""


def test_the_operator_process_loads_nothing_it_never_uses() -> None:
    probe = subprocess.run(
        [sys.executable, "-c", _OPERATOR_PROBE.format(names=_NOT_FOR_THE_OPERATOR)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert probe.stdout.strip().splitlines()[-1] == "[]"


def test_the_driver_does_not_load_the_operator() -> None:
    assert _loaded_by("driver") == "['grpc', 'kmm.driver']"


def test_help_lists_every_command() -> None:
    result = CliRunner().invoke(cli.build(), ["--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for command in ("sandbox", "operator", "apply", "modules", "driver", "manifests"):
        assert f" {command} " in result.output


def test_a_command_loaded_alone_is_still_a_subcommand() -> None:
    result = CliRunner().invoke(cli.build("manifests"), ["manifests"])
    assert result.exit_code == 0, result.output
    assert "CustomResourceDefinition" in result.output


def test_kubectl_plugin_is_installed_as_kubectl_kmm() -> None:
    # kubectl finds plugins by executable name: the package must install it.
    (script,) = metadata.entry_points(group="console_scripts", name="kubectl-kmm")
    assert script.value == "kmm.cli:kubectl_plugin"
    assert (Path(sys.executable).parent / "kubectl-kmm").is_file()


def test_kubectl_plugin_names_itself_as_typed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["kubectl-kmm", "modules", "--help"])
    with pytest.raises(SystemExit) as exited:
        cli.kubectl_plugin()
    assert exited.value.code == 0
    assert "Usage: kubectl kmm modules [OPTIONS]" in capsys.readouterr().out


def test_operator_lease_timing_that_leaves_no_room_is_refused() -> None:
    result = CliRunner().invoke(
        cli.build("operator"),
        ["operator", "--lease-duration", "5", "--renew-deadline", "5"],
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 2
    assert "need lease duration (5 s) > renew deadline (5 s)" in result.output


def test_operator_help_shows_the_lease_timing() -> None:
    result = CliRunner().invoke(
        cli.build("operator"), ["operator", "--help"], env={"COLUMNS": "250"}
    )
    assert result.exit_code == 0
    for flag in ("--lease-duration", "--renew-deadline", "--retry-period"):
        assert flag in result.output
    assert "[default: 15.0]" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--fake-module", "Foo=1"], "--fake-module 'Foo=1': NAME=COUNT"),
        (["--fake-module", "foo=1"], "--fake-module needs --runtime containerd"),
    ],
)
def test_sandbox_up_refuses_a_bad_fake_module_before_starting_anything(
    tmp_path: Path, args: list[str], message: str
) -> None:
    result = CliRunner().invoke(
        cli.build("sandbox"),
        ["sandbox", "up", "--dir", str(tmp_path / "s"), "--nodes", "0", *args],
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 1
    assert message in result.output
    assert not (tmp_path / "s").exists()
