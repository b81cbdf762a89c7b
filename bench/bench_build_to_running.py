"""From a Module whose image is missing to its loader pod Running, against the floor.

Run: ``.venv/bin/python bench/bench_build_to_running.py [--resync 2] [--converged 30]``
(root: buildah and containerd; after ``make sandbox-binaries image test-images``)

1. A sandbox of its own (``kmm.sandbox.cluster.up``) in a temporary
   directory: one container node (containerd), the registry; the CRD from
   ``deploy/``; pushed to the registry: the builder image (``make image``),
   kbuild and the loader image (``make test-images``).
2. kmm: the operator in process (the real wiring, builder image as pushed,
   the registry at its loopback port, the sandbox CA). A Module with
   ``build`` (no sign: the floor has none) selecting the container node by
   name, for its kernel, whose image is not in the registry, is created;
   timed until its loader pod on that node is Running. Before that, untimed,
   a Module that selects no node is created and deleted: the API server
   takes about 2 s over the first create of a custom resource after its
   CRD was applied (measured with no operator running, and printed), a
   cost a cluster pays once at install, not per Module. The Dockerfile is the
   build tests' (tests/buildsign/Dockerfile: two modules from sources in
   the Dockerfile, a build secret) with one change: it compiles against the
   kbuild image's headers whatever the node's kernel (a container node runs
   the host's), so the loader pod really pulls and runs the image. Printed:
   the total, and the build pod's own span (its container's start to
   finish, from the pod status the kubelet wrote).
3. The floor, in the same run: the build pod's own command (its script,
   arguments and environment from ``pods.build_pod``, so the same Dockerfile,
   build arguments, build secret, buildah and flags) run on the host in the
   builder image's root filesystem with ``chroot``: no pod, no kubelet, no
   containerd, no operator; storage in a fresh directory as the pod's
   emptyDir, so the base images are pulled as the pod pulls them; pushed
   under another tag. Then the loader DaemonSet's pod template as a bare pod
   bound to the node with that image, timed from create to Running. Floor =
   build and push + pod start. Printed: both parts, the floor, kmm/floor.
4. Registry requests per reconcile of the converged Module: the operator
   resyncs every ``--resync`` seconds; over ``--converged`` seconds, the
   requests the registry served (its access log, so nothing the operator
   reports about itself) and the reconciles done. The goal is zero.

Bounds: one Module, one node, one build; every wait is bounded
(``--timeout`` for the build, 120 s for pods); the sandbox is taken down at
the end. Addresses: the registry and API server on loopback, pods in the
sandbox's networks.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import json
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from kmm.api import kernels, labels, modules
from kmm.cli import applying, paths
from kmm.kube import client as kube_client
from kmm.kube import kubeconfigs, resources
from kmm.oci import archive
from kmm.operator import wiring
from kmm.operator.build import podparts, pods
from kmm.operator.build import settings as build_settings
from kmm.sandbox import cluster, pki, registry

NAMESPACE = "default"
NAME = "bench-build"
CONFIG_MAP = "bench-build-dockerfile"
SECRET = "build-secret"
ROOT = pathlib.Path(__file__).resolve().parents[1]
IMAGES = ROOT / "build" / "images"
BUILDER_ARCHIVE = ROOT / "build" / "kmm-builder-image.tar"
BUILDSIGN_DOCKERFILE = ROOT / "tests" / "buildsign" / "Dockerfile"
DEPLOY = ROOT / "deploy"
_MODULES = resources.Resource(modules.GROUP, modules.VERSION, modules.PLURAL)
_CONFIG_MAPS = resources.Resource("", "v1", "configmaps")
_SECRETS = resources.Resource("", "v1", "secrets")
_HEADERS = '"/usr/src/linux-headers-${KERNEL_FULL_VERSION}"'
# distribution's access log: one line per request served.
_ACCESS = re.compile(r'"(GET|HEAD|PUT|POST|PATCH|DELETE) /v2/')


def dockerfile() -> str:
    """The build tests' Dockerfile, compiling against kbuild's one set of headers."""
    text = BUILDSIGN_DOCKERFILE.read_text()
    if _HEADERS not in text:
        raise SystemExit(f"{BUILDSIGN_DOCKERFILE} no longer builds against {_HEADERS}")
    return text.replace(_HEADERS, '"$(ls -d /usr/src/linux-headers-*-amd64)"')


def image_args(host: str) -> dict[str, str]:
    """The Dockerfile's base images as ``host`` serves them."""
    return {"KBUILD_IMAGE": f"{host}/bench/kbuild:1", "LOADER_IMAGE": f"{host}/bench/loader:1"}


def push(directory: pathlib.Path, path: pathlib.Path, name_tag: str) -> str:
    kmm = pathlib.Path(sys.executable).with_name("kmm")
    done = subprocess.run(
        [str(kmm), "sandbox", "push", "--dir", str(directory), str(path), name_tag],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"kmm sandbox push {path}: {done.stdout}{done.stderr}")
    return done.stdout.strip().splitlines()[-1]


async def eventually(check: Callable[[], Awaitable[bool]], what: str, bound: float) -> None:
    deadline = time.monotonic() + bound
    while not await check():
        if time.monotonic() > deadline:
            raise SystemExit(f"never happened within {bound:.0f} s: {what}")
        await asyncio.sleep(0.2)


def module_body(node: str, kernel: str, image: str) -> dict[str, Any]:
    return {
        "apiVersion": modules.API_VERSION,
        "kind": modules.KIND,
        "metadata": {"name": NAME, "namespace": NAMESPACE},
        "spec": {
            "selector": {"kubernetes.io/hostname": node},
            "moduleLoader": {
                "container": {
                    "modprobe": {"moduleName": "kmod_a"},
                    "kernelMappings": [
                        {
                            "literal": kernel,
                            "containerImage": image,
                            "build": {
                                "dockerfileConfigMap": {"name": CONFIG_MAP},
                                "secrets": [{"name": SECRET}],
                                "buildArgs": [
                                    {"name": k, "value": v}
                                    for k, v in image_args(registry.REFERENCE_HOST).items()
                                ],
                            },
                        }
                    ],
                }
            },
        },
    }


def operator_settings(record: cluster.state.SandboxState, resync: float) -> dict[str, Any]:
    """What ``kmm operator`` would be given (``--builder-image``,
    ``--registry-endpoint``, ``--registry-ca``), as wiring.Operator takes it."""
    assert record.registry is not None
    ca = pki.Pki(record.directory / "pki").ca_cert
    return {
        "resync_period": resync,
        "build": build_settings.Settings(
            builder_image=f"{registry.REFERENCE_HOST}/bench/builder:1", registry_ca=ca.read_text()
        ),
        "registry_endpoints": {registry.REFERENCE_HOST: record.registry.host},
        "registry_ca_files": (ca,),
    }


@contextlib.asynccontextmanager
async def operator(
    kubeconfig: pathlib.Path, settings: dict[str, Any]
) -> AsyncIterator[wiring.Operator]:
    async with kube_client.Client(kubeconfigs.load(kubeconfig)) as api:
        op = wiring.Operator(api, workers=2, **settings)
        stop = asyncio.Event()
        task = asyncio.ensure_future(op.run(stop))
        try:
            yield op
        finally:
            stop.set()
            await task


async def module_pods(api: kube_client.Client) -> list[dict[str, Any]]:
    found = await api.request(
        "GET",
        resources.PODS.path(NAMESPACE),
        query={"labelSelector": f"{labels.MODULE_NAME}={NAME}"},
    )
    return list(found["items"])


def running(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running"


def role(pod: dict[str, Any]) -> str | None:
    return (pod["metadata"].get("labels") or {}).get(labels.ROLE)


def container_span(pod: dict[str, Any]) -> float | None:
    """Seconds the pod's container ran (its status' start to finish), or None."""
    for status in (pod.get("status") or {}).get("containerStatuses") or ():
        done = (status.get("state") or {}).get("terminated") or {}
        if done.get("startedAt") and done.get("finishedAt"):
            started = time.strptime(done["startedAt"], "%Y-%m-%dT%H:%M:%SZ")
            finished = time.strptime(done["finishedAt"], "%Y-%m-%dT%H:%M:%SZ")
            return time.mktime(finished) - time.mktime(started)
    return None


def container_state(pod: dict[str, Any]) -> str:
    """``waiting``, ``running`` or ``terminated`` (the first container's), or ``""``."""
    for status in (pod.get("status") or {}).get("containerStatuses") or ():
        return next(iter(status.get("state") or {}), "")
    return ""


async def kmm_run(
    api: kube_client.Client, node: str, kernel: str, image: str, timeout: float
) -> tuple[float, dict[str, float], float | None, dict[str, Any]]:
    """Seconds from the Module's create to its loader pod Running; when each
    step was first seen (polled every 0.2 s, seconds from the create); the
    build container's own span (the kubelet's start and finish, 1 s
    resolution); the loader pod."""
    build_span: float | None = None
    loader: dict[str, Any] = {}
    marks: dict[str, float] = {}
    started = time.perf_counter()

    def mark(what: str) -> None:
        marks.setdefault(what, time.perf_counter() - started)

    async def loading() -> bool:
        nonlocal build_span, loader
        found = await module_pods(api)
        for pod in found:
            if role(pod) == "build":
                mark("build pod created")
                if container_state(pod) in ("running", "terminated"):
                    mark("build container started (builder image pulled)")
                if (span := container_span(pod)) is not None:
                    build_span = span
                    mark("build container finished")
            elif role(pod) != "sign":
                mark("loader pod created")
                if running(pod):
                    loader = pod
        if marks.get("build pod created") is not None and not any(
            role(pod) == "build" for pod in found
        ):
            mark("build pod gone (succeeded, deleted)")
        return bool(loader)

    await api.request("POST", _MODULES.path(NAMESPACE), body=module_body(node, kernel, image))
    await eventually(loading, "the loader pod Running", timeout)
    return time.perf_counter() - started, marks, build_span, loader


async def warm_up(api: kube_client.Client, body: dict[str, Any]) -> float:
    """Seconds the API server took to create the first Module (one that
    selects no node), deleted at once: the first create after a CRD was
    applied is slow whoever sends it."""
    warm = copy.deepcopy(body)
    warm["metadata"]["name"] = f"{NAME}-warm-up"
    warm["spec"]["selector"] = {"kmm.bench/none": "none"}
    started = time.perf_counter()
    await api.request("POST", _MODULES.path(NAMESPACE), body=warm)
    elapsed = time.perf_counter() - started
    await api.request("DELETE", _MODULES.path(NAMESPACE, warm["metadata"]["name"]))
    return elapsed


def builder_root(work: pathlib.Path) -> tuple[pathlib.Path, list[str]]:
    """The builder image's root filesystem, unpacked from its archive, and
    its config's environment (``KEY=VALUE``)."""
    root = work / "builder-root"
    root.mkdir()
    with archive.Archive(BUILDER_ARCHIVE) as image:
        (manifest,) = image.manifests
        config, *layers = image.children(manifest)
        for layer in layers:
            subprocess.run(
                ["tar", "-x", "-C", str(root)], input=image.blob(layer), check=True, timeout=300
            )
        env = list((json.loads(image.blob(config)).get("config") or {}).get("Env") or [])
    return root, env


# Run as root in a mount namespace of its own, what a container runtime
# gives the build pod's container: the host's /proc and /sys, a /dev of the
# usual nodes with a termination log, and a fresh storage directory where
# the pod has its emptyDir. Everything mounted goes with the namespace.
_CHROOT = """\
set -e
root=$1 storage=$2
shift 2
# The root a mount point of its own, as a container's is (buildah remounts it).
mount --make-rprivate /
mount --bind "$root" "$root"
mount --rbind /proc "$root/proc"
mount --rbind /sys "$root/sys"
mount -t tmpfs -o mode=755 dev "$root/dev"
for node in null zero full random urandom tty; do
    touch "$root/dev/$node"
    mount --bind "/dev/$node" "$root/dev/$node"
done
mkdir "$root/dev/pts" "$root/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666 devpts "$root/dev/pts"
mount -t tmpfs shm "$root/dev/shm"
touch "$root/dev/termination-log"
mkdir -p "$root/var/lib/containers"
mount --bind "$storage" "$root/var/lib/containers"
exec chroot "$root" "$@"
"""


def host_build(
    record: cluster.state.SandboxState, work: pathlib.Path, kernel: str, image: str
) -> float:
    """Seconds for the build pod's own command (``pods.build_pod``: its
    script, arguments and environment: buildah build, then push) run with
    the builder image's root filesystem on the host, its volumes laid out
    as files where the pod mounts them."""
    assert record.registry is not None
    host = record.registry.host
    root, image_env = builder_root(work)
    storage = work / "storage"
    storage.mkdir()
    inputs = podparts.PodParams(
        module=NAME,
        namespace=NAMESPACE,
        kernel=kernel,
        image=image.replace(registry.REFERENCE_HOST, host, 1),
        builder_image="unused",
        owner={},
        registry_ca=pki.Pki(record.directory / "pki").ca_cert.read_text(),
    )
    target = kernels.BuildTarget(
        dockerfile_config_map=CONFIG_MAP,
        build_args=tuple(image_args(host).items()),
        secrets=(SECRET,),
        base_image_registry_tls=None,
        selector=(),
    )
    pod = pods.build_pod(inputs, target)
    (container,) = pod["spec"]["containers"]
    # The volumes as files: the Dockerfile, the build secret, /lib/modules.
    for mount in container["volumeMounts"]:
        (root / mount["mountPath"].lstrip("/")).mkdir(parents=True, exist_ok=True)
    mounted = {m["name"]: root / m["mountPath"].lstrip("/") for m in container["volumeMounts"]}
    (mounted["dockerfile"] / "Dockerfile").write_text(dockerfile())
    (mounted["secret-0"] / "ci-build-secret").write_text("bench-secret")
    # The registry CA, as the pod's downward-API volume projects it.
    (mounted["registry-ca"] / "ca.crt").write_text(inputs.registry_ca)
    env = [*image_env, *(f"{e['name']}={e['value']}" for e in container["env"])]
    chroot = ["unshare", "--mount", "--fork", "sh", "-c", _CHROOT, "sh", str(root), str(storage)]
    started = time.perf_counter()
    try:
        subprocess.run(
            [*chroot, "env", "-i", *env, *container["command"]],
            check=True, capture_output=True, timeout=900,
        )  # fmt: skip
        return time.perf_counter() - started
    except subprocess.CalledProcessError as err:
        raise SystemExit(f"host build: {err.stderr.decode(errors='replace')[-3000:]}") from None
    finally:
        # Overlay mounts buildah left went with the mount namespace; files stay.
        shutil.rmtree(storage, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)


async def pod_start(
    api: kube_client.Client, loader: dict[str, Any], node: str, image: str
) -> float:
    """Seconds from creating the loader's pod, with ``image``, to it Running."""
    spec = copy.deepcopy(loader["spec"])
    spec["nodeName"] = node
    for container in spec["containers"]:
        container["image"] = image
    name = f"{NAME}-floor"
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}

    async def up() -> bool:
        pod = await api.request("GET", resources.PODS.path(NAMESPACE, name))
        return running(pod)

    started = time.perf_counter()
    await api.request("POST", resources.PODS.path(NAMESPACE), body=body)
    await eventually(up, "the floor's pod Running", 120)
    elapsed = time.perf_counter() - started
    await api.request(
        "DELETE", resources.PODS.path(NAMESPACE, name), query={"gracePeriodSeconds": 0}
    )
    return elapsed


def registry_requests(record: cluster.state.SandboxState) -> list[str]:
    """The registry's access-log lines so far, one per request it served."""
    log = record.directory / "logs" / f"{registry.COMPONENT}.log"
    with log.open(errors="replace") as lines:
        return [line.strip() for line in lines if _ACCESS.search(line)]


async def converged(
    record: cluster.state.SandboxState, op: wiring.Operator, seconds: float
) -> tuple[list[str], int]:
    """(registry requests served, reconciles done) over ``seconds`` of a converged Module."""
    requests, reconciles = len(registry_requests(record)), op.counting.done
    await asyncio.sleep(seconds)
    return registry_requests(record)[requests:], op.counting.done - reconciles


async def main(args: argparse.Namespace) -> None:
    directory = pathlib.Path(tempfile.mkdtemp(prefix="kbr", dir="/tmp"))
    options = cluster.Options(
        directory=directory,
        cache_dir=paths.cache_dir(),
        nodes=0,
        kubelet_nodes=1,
        runtime="containerd",
        pause_image=IMAGES / "pause.tar",
        start_timeout=600,
    )
    record = await cluster.up(options)
    try:
        (node,) = record.container_nodes
        work = directory / "bench"
        work.mkdir()
        push(directory, BUILDER_ARCHIVE, "bench/builder:1")
        push(directory, IMAGES / "kbuild.tar", "bench/kbuild:1")
        push(directory, IMAGES / "loader.tar", "bench/loader:1")
        async with cluster.api_client(record.kubeconfig) as api:
            docs = []
            for folder in ("crd", "admission"):
                for path in sorted((DEPLOY / folder).glob("*.yaml")):
                    docs.extend(applying.load_documents(path.read_text()))
            await applying.apply_documents(api, docs)
            found = await api.request("GET", resources.NODES.path(name=node))
            kernel = found["status"]["nodeInfo"]["kernelVersion"].removesuffix("+")
            await api.request(
                "POST",
                _CONFIG_MAPS.path(NAMESPACE),
                body={
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": CONFIG_MAP},
                    "data": {"dockerfile": dockerfile()},
                },
            )
            await api.request(
                "POST",
                _SECRETS.path(NAMESPACE),
                body={
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": SECRET},
                    "stringData": {"ci-build-secret": "bench-secret"},
                },
            )
            tag = kernels.variables(kernel, module_name=NAME, module_namespace=NAMESPACE)[
                "KERNEL_FULL_VERSION"
            ]
            image = f"{registry.REFERENCE_HOST}/bench/module:{tag}"
            first_create = await warm_up(api, module_body(node, kernel, image))
            async with operator(record.kubeconfig, operator_settings(record, args.resync)) as op:

                async def synced() -> bool:
                    return op.manager.ready()

                # Timed from a running operator, caches synced, as in a cluster.
                await eventually(synced, "the operator's caches synced", 120)
                total, marks, build_span, loader = await kmm_run(
                    api, node, kernel, image, args.timeout
                )
                served, reconciles = await converged(record, op, args.converged)
            floor_image = f"{registry.REFERENCE_HOST}/bench/floor:{tag}"
            build_push = await asyncio.to_thread(host_build, record, work, kernel, floor_image)
            start = await pod_start(api, loader, node, floor_image)
            every = registry_requests(record)
        floor = build_push + start
        span = f"{build_span:.1f} s" if build_span is not None else "not seen"
        print(
            f"(untimed: the API server's first Module create after its CRD: {first_create:.1f} s)"
        )
        print(f"kmm: Module created -> loader pod Running: {total:.1f} s (build container {span})")
        for what, at in sorted(marks.items(), key=lambda item: item[1]):
            print(f"  {at:6.1f} s  {what}")
        print(
            f"floor: the builder's buildah build + push on the host {build_push:.1f} s"
            f" + pod start from the existing image {start:.1f} s = {floor:.1f} s"
        )
        print(f"ratio kmm/floor: {total / floor:.2f}x")
        per = len(served) / reconciles if reconciles else float("nan")
        print(
            f"converged Module: {len(served)} registry requests over {reconciles} reconciles"
            f" in {args.converged:.0f} s ({per:.2f} per reconcile; goal 0)"
        )
        for line in served[:5]:
            print(f"  {line}")
        print(
            f"  (counted in the registry's access log; {len(every)} lines in all, e.g. {every[0]})"
        )
    finally:
        cluster.down(directory)
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resync", type=float, default=2.0, help="operator resync period, s")
    parser.add_argument(
        "--converged", type=float, default=30.0, help="seconds the converged Module is watched"
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="bound on the build, s")
    asyncio.run(main(parser.parse_args()))
