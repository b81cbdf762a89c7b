"""The build or sign pod a Module's kernel needs now, stamped with its input
hash (pure).

``module_pod`` renders the pod of one role from the kernel's target, the
inputs read (``inputs.of_pod``) and the operator's settings, and stamps it
(``hashing``); the planner compares that stamp with the pod it finds.
``params`` is what every pod of a Module's kernel shares, preflight pods
included (``kmm.operator.preflight.planner`` renders those). ``wanted`` is
what the kernel's image is to be made of now (``images.Wanted``): the
hashes its build and sign pods write into it as labels, the same the
planner compares with the labels of an image that exists.

A build's ``DTK_AUTO`` (``driver_toolkit``, from the operator's template
and the Dockerfile: ``toolkit``) is one of its build arguments, so it
enters both the pod's input hash and the image's build hash: a changed
template replaces a build pod on its way and makes an image built with the
old one outdated. When a build needs one kmm cannot give, there is no pod
and ``module_pod`` says why.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from kmm.api import buildsign, kernels, modules
from kmm.operator import objects, podspecs
from kmm.operator.build import hashing, images, inputs, podparts, pods, settings, toolkit

__all__ = ["driver_toolkit", "module_pod", "params", "wanted"]

RawObject = dict[str, Any]
_BUILD: Final[tuple[podparts.PodRole]] = ("build",)
_SIGN: Final[tuple[podparts.PodRole]] = ("sign",)


def params(
    module: modules.Module,
    target: kernels.Target,
    found: settings.Settings,
    *,
    image: str,
    owner: Mapping[str, Any],
    pull_tls: buildsign.RegistryTLS | None,
    push: bool = True,
    toolkit_image: str | None = None,
) -> podparts.PodParams:
    """The parameters of a pod pushing ``image`` for ``target``: where it
    may run (``build.selector``, a sign pod of a Module that builds going
    where its build does; the Module's tolerations), its credentials and
    CA, its TLS, and a build's ``DTK_AUTO`` (``driver_toolkit``'s)."""
    secret = module.spec.image_repo_secret
    return podparts.PodParams(
        module=module.metadata.name,
        namespace=module.metadata.namespace or "",
        kernel=target.kernel,
        image=image,
        builder_image=found.builder_image,
        owner=owner,
        repo_secret=secret.name if secret is not None else None,
        registry_ca=found.registry_ca,
        push_tls=target.registry_tls,
        pull_tls=pull_tls,
        node_selector=dict(target.build.selector) if target.build is not None else {},
        tolerations=podspecs.tolerations(module),
        push=push,
        driver_toolkit=toolkit_image,
    )


def driver_toolkit(
    module: modules.Module, target: kernels.Target, config: settings.Settings, dockerfile: str
) -> str | None:
    """``DTK_AUTO`` for ``target``'s build of ``dockerfile`` (None: not
    passed); ``toolkit.ToolkitError`` when the build needs one kmm cannot give."""
    return toolkit.value(
        config.driver_toolkit_image,
        target,
        module=module.metadata.name,
        namespace=module.metadata.namespace or "",
        dockerfile=dockerfile,
    )


def _dir_name(module: modules.Module) -> str:
    loader = module.spec.module_loader
    return loader.container.modprobe.dir_name if loader is not None else "/opt"


def _trigger(module: modules.Module) -> str:
    found = module.spec.image_rebuild_trigger_generation
    return "" if found is None else str(found)


def _blocked(
    module: modules.Module,
    target: kernels.Target,
    found: inputs.Snapshot,
    config: settings.Settings,
) -> list[str]:
    """Why nothing can be built or signed for ``target`` ([]: it can): its
    missing inputs, else a ``DTK_AUTO`` kmm cannot give."""
    missing = inputs.of_pod(found, module, target).missing
    if missing or target.build is None:
        return missing
    picked = inputs.of_pod(found, module, target, _BUILD)
    try:
        driver_toolkit(module, target, config, picked.dockerfile)
    except toolkit.ToolkitError as err:
        return [str(err)]
    return []


def wanted(
    module: modules.Module,
    target: kernels.Target,
    found: inputs.Snapshot,
    config: settings.Settings,
) -> images.Wanted | None:
    """What ``target``'s image is to be made of, from the inputs ``found``
    and the operator's settings; None when one it needs was not found, or
    its build needs a ``DTK_AUTO`` kmm cannot give (nothing can be built then)."""
    build_hash = None
    if target.build is not None:
        picked = inputs.of_pod(found, module, target, _BUILD)
        if picked.missing:
            return None
        try:
            toolkit_image = driver_toolkit(module, target, config, picked.dockerfile)
        except toolkit.ToolkitError:
            return None
        shared = podparts.PodParams(
            module=module.metadata.name,
            namespace=module.metadata.namespace or "",
            kernel=target.kernel,
            image="",
            builder_image="",
            owner={},
            driver_toolkit=toolkit_image,
        )
        secrets = {s: found.versions.get(f"Secret/{s}", "") for s in target.build.secrets}
        build_hash = hashing.image_build_hash(
            dockerfile=picked.dockerfile,
            build_args=podparts.build_args(shared, target.build),
            secrets=secrets,
        )
    sign = target.sign
    if sign is None:
        return images.Wanted(build=build_hash, trigger=_trigger(module))
    if inputs.of_pod(found, module, target, _SIGN).missing:
        return None
    source = build_hash if build_hash is not None else images.unsigned_image(target)
    return images.Wanted(
        build=build_hash,
        trigger=_trigger(module),
        sign=hashing.image_sign_hash(
            source=source, files=sign.files_to_sign, dir_name=_dir_name(module)
        ),
        cert=found.certificates.get(sign.cert_secret),
    )


def module_pod(
    module: modules.Module,
    target: kernels.Target,
    role: podparts.PodRole,
    found: inputs.Snapshot,
    config: settings.Settings,
) -> tuple[RawObject | None, list[str]]:
    """The pod of ``role`` for ``target`` stamped with its input hash, or
    None and the inputs that are missing."""
    picked = inputs.of_pod(found, module, target, (role,))
    if picked.missing:
        return None, picked.missing
    owner = objects.controller_reference(module)
    made_of = wanted(module, target, found, config)
    if made_of is None:  # a sign checks the build's hash: the build's inputs count
        return None, _blocked(module, target, found, config)
    if role == "build":
        assert target.build is not None
        made = params(
            module, target, config,
            image=images.pushed_by(target, "build"), owner=owner,
            pull_tls=target.build.base_image_registry_tls,
            toolkit_image=driver_toolkit(module, target, config, picked.dockerfile),
        )  # fmt: skip
        env = pods.provenance_env(build_hash=made_of.build, trigger=made_of.trigger)
        pod = pods.build_pod(made, target.build, env=env)
    else:
        sign = target.sign
        assert sign is not None
        # A Module's own intermediate image is in the final one's registry.
        pull_tls = (
            target.registry_tls if target.build is not None else sign.unsigned_image_registry_tls
        )
        made = params(module, target, config, image=target.image, owner=owner, pull_tls=pull_tls)
        env = pods.provenance_env(
            sign_hash=made_of.sign, trigger=made_of.trigger, expect_build_hash=made_of.build
        )
        pod = pods.sign_pod(
            made,
            sign,
            unsigned_image=images.unsigned_image(target),
            dir_name=_dir_name(module),
            env=env,
        )
    parts = hashing.made_of(
        pod,
        pushes=made.image,
        dockerfile=picked.dockerfile,
        versions=picked.versions,
        trigger=module.spec.image_rebuild_trigger_generation,
    )
    return hashing.stamp(pod, parts), []
