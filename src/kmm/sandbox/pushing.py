"""``kmm sandbox push``: an OCI archive's image into the sandbox registry.

Uploads over the host's loopback port with the sandbox CA (and the sandbox's
credentials when the registry asks for them), and answers the reference
nodes and pods pull it by: ``<registry.reference_host>/NAME:TAG``.
"""

from __future__ import annotations

from pathlib import Path

from kmm.oci import archive as oci_archive
from kmm.oci import client as oci_client
from kmm.oci import pushing as oci_pushing
from kmm.sandbox import errors, registry, state

__all__ = ["push", "split_name_tag"]


def split_name_tag(text: str) -> tuple[str, str]:
    """``NAME:TAG`` -> (NAME, TAG); ValueError naming the argument."""
    name, colon, tag = text.rpartition(":")
    if not colon or not name or "/" in tag:
        raise ValueError(f"NAME:TAG: {text!r} has no tag (e.g. kmm/loader:v1)")
    return name, tag


async def push(
    directory: Path, archive: Path, name_tag: str, *, progress: oci_pushing.Progress
) -> str:
    """Push ``archive`` as ``name_tag``; the reference it is pulled by."""
    name, tag = split_name_tag(name_tag)
    oci_client.check_name(name)
    oci_client.check_reference(tag)
    record = state.load(directory.resolve())
    if record is None:
        raise errors.NotRunning(
            f"no sandbox recorded in {directory}; start one with "
            f"`kmm sandbox up --registry --dir {directory}`"
        )
    found = registry.running(record)
    if not archive.is_file():
        raise ValueError(f"ARCHIVE: {archive} is not a file")
    with oci_archive.Archive(archive) as image:
        progress(f"pushing {archive} to {found.host} as {name}:{tag}")
        async with registry.client(record) as client:
            await oci_pushing.push(client, image, name, tag, progress=progress)
    return f"{found.reference_host}/{name}:{tag}"
