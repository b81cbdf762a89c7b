"""``kmm apply`` shows the API server's warnings as kubectl does: on stderr,
``Warning:`` first, naming the document, and still applies it."""

from __future__ import annotations

import asyncio
import pathlib
import subprocess
import sys
import uuid

import build_sign_cases
import test_module_admission as admission_support
import yaml
from kubernetes_asyncio import client

from kmm.api import modules
from kmm.sandbox import testing

KMM = pathlib.Path(sys.executable).with_name("kmm")


async def test_kmm_apply_prints_an_admission_warning_naming_the_field(
    sandbox: testing.RunningSandbox,
    api_client: client.ApiClient,
    namespace: str,
    tmp_path: pathlib.Path,
) -> None:
    await admission_support.install(api_client)
    name = f"m-{uuid.uuid4().hex[:6]}"
    # A KMM manifest that builds and signs (kanikoParams, registryTLS at the
    # container level): it applies, and only kanikoParams is warned about.
    obj = build_sign_cases.module()
    obj["metadata"].update(name=name, namespace=namespace)
    # The Warn policy bites once the apiserver's policy informer has it.
    for _ in range(120):
        if await admission_support.create_with_warnings(api_client, namespace, obj, dry_run=True):
            break
        await asyncio.sleep(0.5)
    manifest = tmp_path / "module.yaml"
    manifest.write_text(yaml.safe_dump(obj))
    result = await asyncio.to_thread(
        subprocess.run,
        [str(KMM), "apply", "--kubeconfig", str(sandbox.kubeconfig), "-f", str(manifest)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"module/{name} created"
    [warning] = result.stderr.splitlines()
    # The text is the API server's: the policy's name, then its message.
    assert warning.startswith(f"Warning: module/{name}: "), warning
    assert warning.endswith(
        "spec.moduleLoader.container.build.kanikoParams has no effect in kmm: "
        "kmm builds with buildah, not kaniko"
    ), warning
    stored = await client.CustomObjectsApi(api_client).get_namespaced_custom_object(
        modules.GROUP, modules.VERSION, namespace, modules.PLURAL, name
    )
    container = stored["spec"]["moduleLoader"]["container"]
    assert container["registryTLS"] == {"insecure": True}
    assert container["build"]["kanikoParams"] == {"tag": "debug"}
