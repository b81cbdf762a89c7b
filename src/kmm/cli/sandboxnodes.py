"""``kmm sandbox node``: reach a VM node's own OS (run a command, reboot it)."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from kmm.cli import paths, sandboxcommon
from kmm.sandbox import cluster, errors, state
from kmm.sandbox.vmnodes import kernels, toolkitimages
from kmm.sandbox.vmnodes import kind as vmkind
from kmm.sandbox.vmnodes import planning as vmplanning

app = typer.Typer(
    help="Reach a VM node's own OS: run a command in it as root, reboot it.",
    no_args_is_help=True,
)
NodeArgument = Annotated[str, typer.Argument(metavar="NODE", help="A VM node, e.g. kmm-vm-0.")]


def _vm_nodes(directory: Path, node: str) -> vmkind.VmNodes:
    """The sandbox's VM nodes, one of them ``node``; SandboxError saying what
    ``node`` is when it is no VM node."""
    record = cluster.status(directory)
    for kind in cluster.kinds(record):
        if node in kind.names and kind.kind != vmkind.KIND:
            raise errors.SandboxError(
                f"{node} is a {kind.kind} node: `kmm sandbox node` reaches a VM node's own OS "
                "(other nodes run on this host's kernel)"
            )
    found = cluster.vm_nodes(directory)
    if node not in found.names:
        raise errors.NotRunning(
            f"the sandbox in {record.directory} has no node {node}; "
            f"its VM nodes: {', '.join(found.names)}"
        )
    return found


@app.command("exec")
def exec_(
    node: NodeArgument,
    command: Annotated[
        list[str],
        typer.Argument(
            metavar="COMMAND", help="What to run, after `--` (its options are its own)."
        ),
    ],
    directory: sandboxcommon.DirOption = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the command.")] = 300.0,
) -> None:
    """Run COMMAND as root in NODE's own OS (not in a container); print its
    output and exit with its exit code (the guest agent returns the output
    when the command ends)."""
    target = directory or paths.sandbox_dir()
    try:
        nodes = _vm_nodes(target, node)
        result = asyncio.run(nodes.exec(node, command, timeout=timeout))
    except TimeoutError as err:
        raise sandboxcommon.fail(
            errors.SandboxError(f"{command[0]} did not end within {timeout:.0f} s on {node}")
        ) from err
    except (errors.SandboxError, ValueError) as err:
        raise sandboxcommon.fail(err) from err
    sys.stdout.buffer.write(result.stdout)
    sys.stdout.buffer.flush()
    sys.stderr.buffer.write(result.stderr)
    sys.stderr.buffer.flush()
    # A shell's convention for a program a signal ended.
    raise typer.Exit(128 + result.signal if result.signal else result.exit_code)


@app.command()
def reboot(
    node: NodeArgument,
    directory: sandboxcommon.DirOption = None,
    kernel: Annotated[
        str | None,
        typer.Option(
            metavar="VERSION",
            help="Boot this kernel (one of the node image's) from now on: grub's saved default.",
            show_default=False,
        ),
    ] = None,
    timeout: Annotated[
        float, typer.Option(help="Seconds to wait for the Node to be Ready again.")
    ] = vmkind.BOOT_TIMEOUT,
) -> None:
    """Reboot NODE's OS for real and wait until its Node is Ready again on the
    new boot (on --kernel when given); print what it runs."""
    target = directory or paths.sandbox_dir()
    started = time.monotonic()
    try:
        nodes = _vm_nodes(target, node)
        rebooted = asyncio.run(nodes.reboot(node, kernel=kernel, timeout=timeout))
    except (errors.SandboxError, ValueError) as err:
        raise sandboxcommon.fail(err) from err
    sandboxcommon.console.print(
        f"{node} Ready on kernel {rebooted.kernel} after {time.monotonic() - started:.1f} s "
        f"(boot {rebooted.boot_id}; Secure Boot {'on' if rebooted.secure_boot else 'off'}, "
        f"lockdown {rebooted.lockdown}; {rebooted.accel})",
        soft_wrap=True,
        # The kernel brackets the lockdown mode in force ("none [integrity]
        # confidentiality"): text, not rich markup, which would drop it.
        markup=False,
    )


def _toolkit_lines(record: state.SandboxState, chosen: kernels.KernelList) -> list[str]:
    """The driver toolkit images the registry serves, and the operator's
    flag that passes them to builds as DTK_AUTO."""
    served, missing = toolkitimages.served(record.directory, chosen)
    lines = []
    if served:
        lines.append(f"Driver toolkit images: {', '.join(served)}")
        lines.append(
            f"Builds get them as DTK_AUTO with: kmm operator --driver-toolkit-image "
            f"'{toolkitimages.TEMPLATE}'"
        )
    if missing:
        lines.append(
            f"No driver toolkit image for {', '.join(missing)}: `make vm-toolkit-images` "
            "builds them"
        )
    return lines


def vm_lines(record: state.SandboxState) -> list[str]:
    """What ``up`` says of a sandbox's VM nodes: what each runs, the signing
    key, the driver toolkit images, how to reach a node's OS."""
    found = vmkind.of(record)
    if found is None:
        return []
    lines = []
    for node in asyncio.run(found.status()):
        details = dict(node.details)
        lines.append(
            f"VM node {node.name} ({node.address}): kernel {details.get('kernel')}, "
            f"Secure Boot {details.get('Secure Boot')}, accelerator {details.get('accel')}"
        )
    key = vmplanning.signing_key_path(record.directory)
    lines.append(f"Module signing key: {key.key}, certificate {key.certificate}")
    if record.registry is not None:
        lines.extend(_toolkit_lines(record, found.handle(found.names[0]).image.kernels))
    lines.append(
        f"Reach a node's OS: kmm sandbox node exec --dir {record.directory} "
        f"{found.names[0]} -- uname -r"
    )
    return lines
