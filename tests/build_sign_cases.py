"""A Module that builds and signs, and the ways to break its build and sign
rules, shared by the unit test (the operator's Python validation) and the
integration test (the API server's CRD rules): each case names the field
and the rule in both, so the two verdicts can be compared. Not a test module.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Final

import yaml

Obj = dict[str, Any]
# A Module that builds and signs in the cluster, written as KMM users write
# them: build and sign at the container level, one kernel mapping adding to
# both (build args by name, more secrets, its own selector and files), one
# taking the container's as they are.
BUILD_SIGN: Final = """
apiVersion: kmm.sigs.x-k8s.io/v1beta1
kind: Module
metadata:
  name: kmod-built
  namespace: drivers
spec:
  moduleLoader:
    container:
      modprobe:
        moduleName: kmod_a
      containerImage: registry.example:5000/$MOD_NAMESPACE/$MOD_NAME:$KERNEL_FULL_VERSION
      registryTLS:
        insecure: true
      build:
        dockerfileConfigMap:
          name: kmod-dockerfile
        buildArgs:
          - name: VARIANT
            value: base
          - name: JOBS
            value: "2"
        secrets:
          - name: git-token
        baseImageRegistryTLS:
          insecureSkipTLSVerify: true
        kanikoParams:
          tag: debug
        selector:
          builder: "true"
      sign:
        keySecret:
          name: signing-key
        certSecret:
          name: signing-cert
        filesToSign:
          - /opt/lib/modules/${KERNEL_FULL_VERSION}/kmod_a.ko
      kernelMappings:
        - literal: 6.1.0-27-amd64
          build:
            buildArgs:
              - name: VARIANT
                value: debian
              - name: EXTRA
                value: ""
            secrets:
              - name: apt-mirror
              - name: git-token
            selector:
              builder: debian
            baseImageRegistryTLS: {}
          sign:
            filesToSign:
              - /opt/lib/modules/${KERNEL_FULL_VERSION}/kmod_b?.ko
              - /opt/lib/modules/${KERNEL_FULL_VERSION}/kmod_a.ko
            unsignedImageRegistryTLS:
              insecure: true
        - regexp: '^.+$'
  imageRebuildTriggerGeneration: 3
  selector:
    kubernetes.io/os: linux
"""


def module() -> Obj:
    """A fresh copy of ``BUILD_SIGN`` (callers mutate it)."""
    loaded: Obj = yaml.safe_load(BUILD_SIGN)
    return loaded


def container(obj: Obj) -> Obj:
    found: Obj = obj["spec"]["moduleLoader"]["container"]
    return found


def mapping(obj: Obj, index: int) -> Obj:
    found: Obj = container(obj)["kernelMappings"][index]
    return found


@dataclasses.dataclass(frozen=True)
class Case:
    """One broken rule: the operator reports ``message`` at ``path``; the API
    server refuses naming ``field`` with ``cel_message`` (``message`` unless
    the schema, not a rule, refuses)."""

    name: str
    mutate: Callable[[Obj], None]
    path: str
    message: str
    field: str
    cel_message: str | None = None


_C = "spec.moduleLoader.container"


def _drop(*keys: str, index: int | None = None) -> Callable[[Obj], None]:
    def mutate(obj: Obj) -> None:
        node = container(obj) if index is None else mapping(obj, index)
        *parents, last = keys
        for key in parents:
            node = node[key]
        del node[last]

    return mutate


def _no_build(obj: Obj) -> None:
    del container(obj)["build"]
    del mapping(obj, 0)["build"]


def _set_container(key: str, value: object) -> Callable[[Obj], None]:
    return lambda obj: container(obj).__setitem__(key, value)


def _set_sign(value: Obj, index: int | None = None) -> Callable[[Obj], None]:
    def mutate(obj: Obj) -> None:
        (container(obj) if index is None else mapping(obj, index))["sign"].update(value)

    return mutate


def _set_build(value: Obj) -> Callable[[Obj], None]:
    return lambda obj: container(obj)["build"].update(value)


_DIGEST = "registry.example:5000/kmod@sha256:" + "a" * 64


def _signing_to_a_digest(obj: Obj) -> None:
    _no_build(obj)
    container(obj)["sign"]["unsignedImage"] = "registry.example:5000/kmod:unsigned"
    container(obj)["containerImage"] = _DIGEST


_REQUIRED = "is required for every kernel mapping with"
UNDER_DIR_NAME = "every sign.filesToSign entry must lie under modprobe.dirName"

CASES: Final = (
    Case(
        "dockerfile-config-map-nowhere",
        _drop("build", "dockerfileConfigMap"),
        _C,
        f"kernelMappings [0, 1]: build.dockerfileConfigMap {_REQUIRED} build",
        f"{_C}.kernelMappings",
        f"build.dockerfileConfigMap {_REQUIRED} build",
    ),
    Case(
        "key-secret-nowhere",
        _drop("sign", "keySecret"),
        _C,
        f"kernelMappings [0, 1]: sign.keySecret {_REQUIRED} sign",
        f"{_C}.kernelMappings",
        f"sign.keySecret {_REQUIRED} sign",
    ),
    Case(
        "cert-secret-nowhere",
        _drop("sign", "certSecret"),
        _C,
        f"kernelMappings [0, 1]: sign.certSecret {_REQUIRED} sign",
        f"{_C}.kernelMappings",
        f"sign.certSecret {_REQUIRED} sign",
    ),
    Case(
        # The first mapping lists its own files; the second has none then.
        "files-to-sign-nowhere",
        _drop("sign", "filesToSign"),
        _C,
        f"kernelMappings [1]: sign.filesToSign {_REQUIRED} sign",
        f"{_C}.kernelMappings",
        f"sign.filesToSign {_REQUIRED} sign",
    ),
    Case(
        "files-to-sign-empty",
        _set_sign({"filesToSign": []}),
        f"{_C}.sign.filesToSign",
        "at least 1 item",
        f"{_C}.sign.filesToSign",
        "should have at least 1 items",
    ),
    Case(
        "sign-without-build-or-unsigned-image",
        _no_build,
        _C,
        "kernelMappings [0, 1]: sign without build needs sign.unsignedImage",
        f"{_C}.kernelMappings",
        "sign without build needs sign.unsignedImage",
    ),
    Case(
        "build-pushes-to-a-digest",
        _set_container("containerImage", _DIGEST),
        _C,
        "kernelMappings[1].containerImage",
        f"{_C}.kernelMappings",
        "containerImage must name a tag, not a digest, when build or sign is set",
    ),
    Case(
        "sign-pushes-to-a-digest",
        _signing_to_a_digest,
        _C,
        "containerImage must name a tag, not a digest, when build or sign is set",
        f"{_C}.kernelMappings",
    ),
    Case(
        "container-file-outside-dir-name",
        _set_sign({"filesToSign": ["/lib/modules/kmod_a.ko"]}),
        _C,
        f"container.sign.filesToSign entry '/lib/modules/kmod_a.ko': {UNDER_DIR_NAME}",
        f"{_C}.sign.filesToSign",
        UNDER_DIR_NAME,
    ),
    Case(
        "mapping-file-outside-dir-name",
        _set_sign({"filesToSign": ["/optional/kmod_b.ko"]}, 0),
        _C,
        f"kernelMappings[0].sign.filesToSign entry '/optional/kmod_b.ko': {UNDER_DIR_NAME}",
        f"{_C}.kernelMappings",
        UNDER_DIR_NAME,
    ),
    Case(
        "file-to-sign-climbs-out",
        _set_sign({"filesToSign": ["/opt/../etc/shadow"]}, 0),
        f"{_C}.kernelMappings[0].sign.filesToSign[0]",
        "'..' component",
        f"{_C}.kernelMappings[0].sign.filesToSign[0]",
    ),
    Case(
        "file-to-sign-unknown-variable",
        _set_sign({"filesToSign": ["/opt/lib/modules/${KERNEL_MAJOR}/a.ko"]}),
        f"{_C}.sign.filesToSign[0]",
        "may use '$' only in the variables",
        f"{_C}.sign.filesToSign[0]",
    ),
    Case(
        "unsigned-image-without-tag",
        _set_sign({"unsignedImage": "registry.example:5000/kmod"}),
        f"{_C}.sign.unsignedImage",
        "explicit tag",
        f"{_C}.sign.unsignedImage",
    ),
    Case(
        "build-secret-not-an-object-name",
        _set_build({"secrets": [{"name": "../token"}]}),
        f"{_C}.build.secrets[0].name",
        "must be a DNS subdomain",
        f"{_C}.build.secrets[0].name",
    ),
    Case(
        "dockerfile-config-map-without-name",
        _set_build({"dockerfileConfigMap": {}}),
        f"{_C}.build.dockerfileConfigMap.name",
        "Field required",
        f"{_C}.build.dockerfileConfigMap.name",
        "Required value",
    ),
    Case(
        "build-arg-without-value",
        _set_build({"buildArgs": [{"name": "JOBS"}]}),
        f"{_C}.build.buildArgs[0].value",
        "Field required",
        f"{_C}.build.buildArgs[0].value",
        "Required value",
    ),
)
