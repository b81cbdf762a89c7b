"""PreflightValidations answered on a real control plane (issue 26).

One sandbox for the module, as ``test_build_in_containers``'s: a container
node where preflight pods really build and sign (buildah in the builder
image), the registry with credentials, and the operator in the test
process reaching the registry at its loopback port. The Modules select no
node, so only the preflight reconciler builds anything here.

The kernel asked about is the kbuild image's (``build/images/kbuild.kernel``):
the one the real test module compiles against. What is shown:

- four Modules: one whose image exists (Success, no pod), one whose mapping
  matches nothing (Failure ``mapping not found``), one without a
  moduleLoader (no image needed), one that builds and signs (InProgress
  with its pod, then Success): with ``pushBuiltImage: false`` the
  registry's access log has no write request at all, and neither the final
  nor an intermediate image exists; a converged validation makes no API
  write and no registry request over several reconciles; the two verdicts
  that did not change kept their ``lastTransitionTime``. Then
  ``pushBuiltImage: true``: the verdicts start over (``observedGeneration``
  2), one new pod, and the signed image is in the registry; then
  ``kernelVersion`` edited to a kernel nothing maps: every mapped Module
  fails and the kept pod is deleted;
- a Dockerfile that fails: Failure naming the pod and the failing step, the
  pod not made again over several reconciles; the ConfigMap fixed: one new
  pod, Success;
- a Module created during a validation is added; one deleted leaves the
  status, its preflight pod deleted, and the Module's own deletion does not
  wait for that pod;
- deleting the validation removes its pods (the garbage collector, through
  the owner reference);
- the operator as its ServiceAccount, with deploy/'s RBAC, answers one.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import containersandbox
import pytest
import test_build_in_containers as built
import test_operator_support as support

from kmm.api import labels, modules, preflight
from kmm.cli import applying
from kmm.kube import client as kube_client
from kmm.kube import errors as kube_errors
from kmm.kube import resources
from kmm.operator import writing
from kmm.operator.build import images, podnames
from kmm.operator.build import settings as build_settings
from kmm.sandbox import cluster, registry, testing

NAMESPACE = built.NAMESPACE
OTHER_KERNEL = "5.10.0-1-amd64"
_MODULES = resources.Resource(modules.GROUP, modules.VERSION, modules.PLURAL)
_PREFLIGHTS = writing.PREFLIGHTS
_LONG = 1500  # seconds: a build on two shared cores, pulls included
_WRITES = ("POST", "PUT", "PATCH", "DELETE")
SERVICE_ACCOUNT = "system:serviceaccount:kmm-system:kmm-operator"


@pytest.fixture(scope="module")
def sandbox() -> Iterator[built.Sandbox]:
    kernel = (built.IMAGES / "kbuild.kernel").read_text().strip()
    auth = registry.Auth(built._USER, built._PASSWORD)
    with containersandbox.started("kpf", kubelet_nodes=1, registry_auth=auth) as record:
        found = built.Sandbox(record, kernel)
        found.builder = containersandbox.push(record.directory, built.BUILDER, "kmm/builder:1")
        found.kbuild = containersandbox.push(record.directory, built.IMAGES / "kbuild.tar", "ci/kbuild:1")  # fmt: skip
        found.loader = containersandbox.push(record.directory, built.IMAGES / "loader.tar", "ci/loader:1")  # fmt: skip
        asyncio.run(support.install_manifests(record.kubeconfig))
        yield found


@pytest.fixture
async def api(sandbox: built.Sandbox) -> AsyncIterator[kube_client.Client]:
    async with cluster.api_client(sandbox.record.kubeconfig) as found:
        yield found


@contextlib.asynccontextmanager
async def _operator(sandbox: built.Sandbox) -> AsyncIterator[support.InProcess]:
    assert sandbox.record.registry is not None
    settings = build_settings.Settings(
        builder_image=sandbox.builder, registry_ca=sandbox.ca.read_text(), poll=built._POLL
    )
    async with support.operator_in_process(
        sandbox.record.kubeconfig,
        build=settings,
        registry_ca_files=(sandbox.ca,),
        registry_endpoints={sandbox.host: sandbox.record.registry.host},
    ) as running:
        yield running
    await asyncio.sleep(0.2)


def _registry_log(sandbox: built.Sandbox) -> Path:
    return sandbox.record.directory / "logs" / f"{registry.COMPONENT}.log"


def _registry_requests(sandbox: built.Sandbox, since: int) -> list[tuple[str, str, int]]:
    """(method, path, status) of every request the registry logged past byte ``since``."""
    text = _registry_log(sandbox).read_bytes()[since:].decode(errors="replace")
    return [
        (m.group(1), m.group(2), int(m.group(3)))
        for m in re.finditer(r'"(GET|HEAD|POST|PUT|PATCH|DELETE) (\S+) HTTP/[\d.]+" (\d+)', text)
    ]


def _module(name: str, mappings: list[dict[str, Any]], **container: Any) -> dict[str, Any]:
    """A Module selecting no node: its own reconcile builds nothing."""
    body = built._module(name, f"{name}-repo", mappings, **container)
    body["spec"]["selector"] = {"kmm-preflight-test": "no-node"}
    return body


def _validation(name: str, kernel: str, *, push: bool = False) -> dict[str, Any]:
    return {
        "apiVersion": preflight.API_VERSION,
        "kind": preflight.KIND,
        "metadata": {"name": name},
        "spec": {"kernelVersion": kernel, "pushBuiltImage": push},
    }


async def _get(api: kube_client.Client, name: str) -> dict[str, Any]:
    found: dict[str, Any] = await api.request("GET", _PREFLIGHTS.path(name=name))
    return found


def _verdicts(found: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in (found.get("status") or {}).get("modules") or ()}


async def _until(
    api: kube_client.Client, name: str, done: Callable[[dict[str, Any]], bool], what: str
) -> dict[str, Any]:
    found: dict[str, Any] = {}
    try:
        async with asyncio.timeout(_LONG):
            while True:
                found = await _get(api, name)
                if done(found):
                    return found
                await asyncio.sleep(0.5)
    except TimeoutError:
        raise AssertionError(f"{what}: never; last status {found.get('status')}") from None


def _is(module: str, status: str, *, generation: int = 1) -> Callable[[dict[str, Any]], bool]:
    def check(found: dict[str, Any]) -> bool:
        if (found.get("status") or {}).get("observedGeneration") != generation:
            return False
        return _verdicts(found).get(module, {}).get("verificationStatus") == status

    return check


async def _preflight_pods(api: kube_client.Client, validation: str) -> dict[str, str]:
    """Pod name -> uid of the validation's preflight pods."""
    found = await api.request(
        "GET",
        resources.PODS.path(namespace=NAMESPACE),
        query={"labelSelector": f"{labels.PREFLIGHT}={labels.preflight_value(validation)}"},
    )
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in found["items"]}


async def _settled(running: support.InProcess, rounds: int = 3) -> None:
    for _ in range(rounds):
        running.op.resync()
        await running.wait_idle("resynced")


async def _delete_validation(api: kube_client.Client, name: str) -> None:
    with contextlib.suppress(kube_errors.NotFound):
        await api.request("DELETE", _PREFLIGHTS.path(name=name))


async def _patch_spec(api: kube_client.Client, name: str, spec: dict[str, Any]) -> None:
    await api.request(
        "PATCH",
        _PREFLIGHTS.path(name=name),
        body={"spec": spec},
        content_type=kube_client.MERGE_PATCH,
    )


async def test_three_modules_a_build_that_pushes_nothing_then_one_that_pushes(
    sandbox: built.Sandbox, api: kube_client.Client, tmp_path: Path
) -> None:
    tag = built._tag(sandbox.kernel)
    suffix = uuid.uuid4().hex[:5]
    have, unmapped, plugin, make = (f"{w}-{suffix}" for w in ("have", "unmapped", "plugin", "make"))
    containersandbox.push(sandbox.record.directory, built.IMAGES / "loader.tar", f"ci/{have}:{tag}")
    final = f"{sandbox.host}/ci/{make}:{tag}"
    key, cert = built._key_and_cert(tmp_path, "signer")
    for name in (have, unmapped, make):
        await built._create(api, built._SECRETS, built._pull_secret(sandbox, f"{name}-repo"))
    await built._create(api, built._SECRETS, built._opaque(f"{make}-key", {"key": key}))
    await built._create(api, built._SECRETS, built._opaque(f"{make}-cert", {"cert": cert}))
    await built._create(api, built._CONFIGMAPS, built._dockerfile(f"{make}-dockerfile", built.DOCKERFILE.read_text()))  # fmt: skip
    ci = f"{sandbox.host}/ci"
    bodies = [
        _module(have, [{"literal": sandbox.kernel, "containerImage": f"{ci}/{have}:{tag}"}]),
        _module(unmapped, [{"literal": OTHER_KERNEL, "containerImage": f"{ci}/{unmapped}:x"}]),
        _module(
            make,
            [
                {
                    "literal": sandbox.kernel,
                    "containerImage": ci + f"/{make}:${{KERNEL_FULL_VERSION}}",
                }
            ],
            build={
                "dockerfileConfigMap": {"name": f"{make}-dockerfile"},
                # The Dockerfile reads /run/secrets/build-secret/: the name it knows.
                "secrets": [{"name": "build-secret"}],
                "buildArgs": [
                    {"name": "KBUILD_IMAGE", "value": sandbox.kbuild},
                    {"name": "LOADER_IMAGE", "value": sandbox.loader},
                    {"name": "KMM_CI_VERSION", "value": "1.0-preflight"},
                ],
            },
            sign={
                "keySecret": {"name": f"{make}-key"},
                "certSecret": {"name": f"{make}-cert"},
                "filesToSign": ["/opt/lib/modules/*/kmm_ci_a.ko"],
            },
        ),
    ]
    with contextlib.suppress(kube_errors.Conflict):
        await built._create(api, built._SECRETS, built._opaque("build-secret", {"ci-build-secret": b"the secret\n"}))  # fmt: skip
    no_loader = {
        "apiVersion": modules.API_VERSION,
        "kind": modules.KIND,
        "metadata": {"name": plugin, "namespace": NAMESPACE},
        "spec": {
            "selector": {"kmm-preflight-test": "no-node"},
            "devicePlugin": {"container": {"image": f"{sandbox.host}/ci/plugin:1"}},
        },
    }
    for body in [*bodies, no_loader]:
        await api.request("POST", _MODULES.path(namespace=NAMESPACE), body=body)
    validation = f"pfv-{suffix}"
    pod = podnames.preflight_pod_name(validation, make)
    async with _operator(sandbox) as running:
        try:
            since = _registry_log(sandbox).stat().st_size
            await api.request("POST", _PREFLIGHTS.path(), body=_validation(validation, sandbox.kernel))  # fmt: skip
            first = await _until(
                api, validation,
                lambda v: _is(make, "InProgress")(v) and _is(have, "Success")(v) and _is(unmapped, "Failure")(v),
                "InProgress while the pod builds",
            )  # fmt: skip
            verdicts = _verdicts(first)
            assert verdicts[make]["pod"] == pod
            assert verdicts[make]["verificationStage"] == "Image"
            assert verdicts[make]["image"] == final
            assert verdicts[have]["statusReason"] == preflight.REASON_IMAGE_EXISTS
            assert "pod" not in verdicts[have]
            assert verdicts[unmapped]["statusReason"] == preflight.REASON_MAPPING_NOT_FOUND
            assert "image" not in verdicts[unmapped]
            assert verdicts[plugin]["statusReason"] == preflight.REASON_NO_IMAGE_NEEDED
            done = await _until(api, validation, _is(make, "Success"), "Success after the build")
            verdicts = _verdicts(done)
            assert verdicts[make]["statusReason"] == (
                f"{preflight.REASON_BUILT}; the image was not pushed (pushBuiltImage is false)"
            )
            assert verdicts[make]["verificationStage"] == "Done"
            # The two that did not change kept their times.
            for name in (have, unmapped, plugin):
                assert verdicts[name] == _verdicts(first)[name]
            # Nothing was pushed under any name: no write request at all.
            writes = [r for r in _registry_requests(sandbox, since) if r[0] in _WRITES]
            assert writes == []
            assert not await built._exists(sandbox, final)
            assert not await built._exists(sandbox, images.intermediate_image(final))
            made = await _preflight_pods(api, validation)
            assert list(made) == [pod]

            # Converged: no API write, no registry request, however often.
            await running.wait_idle("converged")
            asked, api_writes = running.op.asker.requests, running.counter.total_writes
            reconciles = running.op.preflight.done
            log_size = _registry_log(sandbox).stat().st_size
            await _settled(running)
            assert running.op.preflight.done >= reconciles + 3
            assert running.op.asker.requests == asked
            assert running.counter.total_writes == api_writes
            assert _registry_requests(sandbox, log_size) == []

            # pushBuiltImage: true starts the verdicts over and pushes the signed image.
            await _patch_spec(api, validation, {"pushBuiltImage": True})
            pushed = await _until(
                api, validation, _is(make, "Success", generation=2), "Success, pushed"
            )
            verdicts = _verdicts(pushed)
            assert verdicts[make]["statusReason"] == f"{preflight.REASON_BUILT}; pushed {final}"
            # Every verdict started over, unchanged ones included.
            assert verdicts[have]["lastTransitionTime"] > _verdicts(first)[have]["lastTransitionTime"]  # fmt: skip
            assert await built._exists(sandbox, final)
            assert not await built._exists(sandbox, images.intermediate_image(final))
            again = await _preflight_pods(api, validation)
            assert list(again) == [pod]
            assert again[pod] != made[pod]  # made again: its hash changed

            # A kernel nothing maps: every mapped Module fails, the pod goes.
            await _patch_spec(api, validation, {"kernelVersion": OTHER_KERNEL + "-x"})
            moved = await _until(
                api, validation, _is(make, "Failure", generation=3), "kernel edited"
            )
            verdicts = _verdicts(moved)
            assert {n: v["statusReason"] for n, v in verdicts.items()} == {
                have: preflight.REASON_MAPPING_NOT_FOUND,
                unmapped: preflight.REASON_MAPPING_NOT_FOUND,
                make: preflight.REASON_MAPPING_NOT_FOUND,
                plugin: preflight.REASON_NO_IMAGE_NEEDED,
            }

            async def no_pods() -> bool:
                return await _preflight_pods(api, validation) == {}

            await testing.eventually(no_pods, "the kept pod deleted")
        finally:
            await _delete_validation(api, validation)
            for name in (have, unmapped, make, plugin):
                await built._delete_module(api, name)


@pytest.fixture(scope="module")
def failing() -> dict[str, Any]:
    """What the failing-Dockerfile test leaves for the next ones."""
    return {}


async def test_a_failing_dockerfile_fails_naming_the_pod_until_the_configmap_is_fixed(
    sandbox: built.Sandbox, api: kube_client.Client, failing: dict[str, Any]
) -> None:
    name = f"fx-{uuid.uuid4().hex[:5]}"
    validation = f"pfv-{name}"
    await built._create(api, built._SECRETS, built._pull_secret(sandbox, f"{name}-repo"))
    config = built._dockerfile(f"{name}-dockerfile", built._quick_dockerfile(sandbox, failing=True))
    await built._create(api, built._CONFIGMAPS, config)
    body = _module(
        name,
        [{"literal": sandbox.kernel, "containerImage": f"{sandbox.host}/ci/{name}:x"}],
        build={"dockerfileConfigMap": {"name": f"{name}-dockerfile"}},
    )
    await api.request("POST", _MODULES.path(namespace=NAMESPACE), body=body)
    await api.request("POST", _PREFLIGHTS.path(), body=_validation(validation, sandbox.kernel))
    failing.update(name=name, validation=validation)
    pod = podnames.preflight_pod_name(validation, name)
    async with _operator(sandbox) as running:
        found = await _until(api, validation, _is(name, "Failure"), "Failure")
        verdict = _verdicts(found)[name]
        assert verdict["statusReason"].startswith(
            f"{preflight.REASON_BUILD_FAILED}: pod {NAMESPACE}/{pod} failed: "
        )
        assert "compiling against missing headers" in verdict["statusReason"]
        assert verdict["pod"] == pod
        first = await _preflight_pods(api, validation)
        # Several reconciles (each looks at the inputs): the pod is kept.
        start = running.op.preflight.done
        running.op.resync()

        async def looked() -> bool:
            return running.op.preflight.done >= start + 5

        await testing.eventually(looked, "5 reconciles")
        assert await _preflight_pods(api, validation) == first
        assert _verdicts(await _get(api, validation))[name] == verdict
        config["data"]["dockerfile"] = built._quick_dockerfile(sandbox)
        await built._replace(api, built._CONFIGMAPS, config)
        fixed = await _until(api, validation, _is(name, "Success"), "Success after the fix")
        assert _verdicts(fixed)[name]["pod"] == pod
        after = await _preflight_pods(api, validation)
        assert list(after) == [pod]
        assert after[pod] != first[pod]


async def test_modules_created_and_deleted_during_a_validation(
    sandbox: built.Sandbox, api: kube_client.Client, failing: dict[str, Any]
) -> None:
    """The previous test's validation and Module (with its kept pod)."""
    name, validation = failing["name"], failing["validation"]
    late = f"late-{uuid.uuid4().hex[:5]}"
    async with _operator(sandbox):
        await _until(api, validation, _is(name, "Success"), "the previous verdict")
        assert list(await _preflight_pods(api, validation)) == [podnames.preflight_pod_name(validation, name)]  # fmt: skip
        body = _module(late, [{"literal": OTHER_KERNEL, "containerImage": f"{sandbox.host}/ci/{late}:x"}])  # fmt: skip
        await api.request("POST", _MODULES.path(namespace=NAMESPACE), body=body)
        added = await _until(api, validation, _is(late, "Failure"), "the new Module added")
        assert _verdicts(added)[late]["statusReason"] == preflight.REASON_MAPPING_NOT_FOUND
        # The Module's own deletion does not wait for the preflight pod.
        await built._delete_module(api, name)
        gone = await _until(
            api, validation, lambda v: name not in _verdicts(v), "the deleted Module removed"
        )
        assert set(_verdicts(gone)) >= {late}

        async def no_pods() -> bool:
            return await _preflight_pods(api, validation) == {}

        await testing.eventually(no_pods, "the deleted Module's pod deleted")
        await built._delete_module(api, late)
        await _until(api, validation, lambda v: late not in _verdicts(v), "removed too")


async def test_deleting_the_validation_removes_its_pods(
    sandbox: built.Sandbox, api: kube_client.Client
) -> None:
    """The garbage collector, through the owner reference: no operator runs."""
    name = f"gc-{uuid.uuid4().hex[:5]}"
    validation = f"pfv-{name}"
    await built._create(api, built._SECRETS, built._pull_secret(sandbox, f"{name}-repo"))
    config = built._dockerfile(f"{name}-dockerfile", built._quick_dockerfile(sandbox, failing=True))
    await built._create(api, built._CONFIGMAPS, config)
    body = _module(
        name,
        [{"literal": sandbox.kernel, "containerImage": f"{sandbox.host}/ci/{name}:x"}],
        build={"dockerfileConfigMap": {"name": f"{name}-dockerfile"}},
    )
    await api.request("POST", _MODULES.path(namespace=NAMESPACE), body=body)
    await api.request("POST", _PREFLIGHTS.path(), body=_validation(validation, sandbox.kernel))
    try:
        async with _operator(sandbox):
            await _until(api, validation, _is(name, "Failure"), "its pod failed")
        pod = podnames.preflight_pod_name(validation, name)
        assert list(await _preflight_pods(api, validation)) == [pod]
        await _delete_validation(api, validation)

        async def no_pods() -> bool:
            return await _preflight_pods(api, validation) == {}

        await testing.eventually(no_pods, "the validation's pods collected", bound=180)
    finally:
        async with _operator(sandbox):
            await built._delete_module(api, name)


async def test_the_deployed_rbac_is_enough(sandbox: built.Sandbox, api: kube_client.Client) -> None:
    """The operator as its ServiceAccount (deploy/'s ClusterRole): validations
    listed and watched, pods owned by one made (blockOwnerDeletion, which the
    sandbox's OwnerReferencesPermissionEnforcement checks), /status written."""
    docs = []
    for path in ("operator/namespace.yaml", "rbac/operator.yaml"):
        docs.extend(applying.load_documents((support.DEPLOY / path).read_text()))
    await applying.apply_documents(api, docs)
    name = f"rb-{uuid.uuid4().hex[:5]}"
    validation = f"pfv-{name}"
    await built._create(api, built._SECRETS, built._pull_secret(sandbox, f"{name}-repo"))
    config = built._dockerfile(f"{name}-dockerfile", built._quick_dockerfile(sandbox, failing=True))
    await built._create(api, built._CONFIGMAPS, config)
    body = _module(
        name,
        [{"literal": sandbox.kernel, "containerImage": f"{sandbox.host}/ci/{name}:x"}],
        build={"dockerfileConfigMap": {"name": f"{name}-dockerfile"}},
    )
    await api.request("POST", _MODULES.path(namespace=NAMESPACE), body=body)
    await api.request("POST", _PREFLIGHTS.path(), body=_validation(validation, sandbox.kernel))
    assert sandbox.record.registry is not None
    settings = build_settings.Settings(
        builder_image=sandbox.builder, registry_ca=sandbox.ca.read_text(), poll=built._POLL
    )
    async with support.operator_in_process(
        sandbox.record.kubeconfig,
        impersonate=SERVICE_ACCOUNT,
        build=settings,
        registry_ca_files=(sandbox.ca,),
        registry_endpoints={sandbox.host: sandbox.record.registry.host},
    ):
        try:
            found = await _until(api, validation, _is(name, "Failure"), "its pod failed")
            assert _verdicts(found)[name]["pod"] == podnames.preflight_pod_name(validation, name)
            assert list(await _preflight_pods(api, validation)) == [_verdicts(found)[name]["pod"]]
        finally:
            await _delete_validation(api, validation)
            await built._delete_module(api, name)
        await asyncio.sleep(0.2)
