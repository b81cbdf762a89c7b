"""The preflight planner: one validation's verdict per Module, and the
preflight pods it wants (pure).

For each Module ``verdicts.subjects`` gave a ``kernels.Target``, in this
order (``plan``):

1. a kept preflight pod whose ``last-hash`` equals the hash of the pod the
   Module would need now: its outcome is the verdict (Succeeded: Success,
   ``REASON_BUILT`` and whether it pushed; Failed: Failure naming the pod
   and the tail of its termination message; otherwise InProgress). No
   registry is asked, so a converged validation costs none;
2. otherwise the registry's answer (``existence``: the same facts and keys
   as the build concern, ``build.images.keys``): the image exists
   -> Success, no pod; refused credentials -> Failure; no answer ->
   InProgress, asked again after the checker's back-off; missing without
   build or sign -> Failure at once; missing with build or sign -> the
   inputs (ConfigMaps and Secrets, by resourceVersion), and a pod; inputs
   that do not exist -> Failure naming them (looked at again every
   ``Settings.poll``). Sign without build first needs ``unsignedImage`` in
   its registry, asked again every poll while it is missing.

Any other pod of the validation (a deleted Module's, one whose hash is no
longer wanted) is deleted; a pod is never replaced in the same plan that
deletes its predecessor, since the name is the same. A pod of the same name
owned by an earlier validation of the same name is waited for (the garbage
collector removes it).

``status`` writes the verdicts into the status.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from kmm.api import kernels, labels, preflight
from kmm.operator import caches
from kmm.operator.build import desired as build_desired
from kmm.operator.build import (
    existence,
    hashing,
    images,
    podnames,
    podstatus,
    preflightpods,
    toolkit,
)
from kmm.operator.build import inputs as build_inputs
from kmm.operator.build import settings as build_settings
from kmm.operator.preflight import verdicts

__all__ = [
    "Plan",
    "asks_registry",
    "desired",
    "inputs_wanted",
    "observed_pod",
    "owner_reference",
    "plan",
    "unsigned_wanted",
]

RawObject = dict[str, Any]


def owner_reference(found: preflight.PreflightValidation) -> RawObject:
    """The validation as controller owner of its pods: deleting it deletes
    them (a cluster-scoped owner of namespaced dependents is allowed)."""
    return {
        "apiVersion": preflight.API_VERSION,
        "kind": preflight.KIND,
        "name": found.metadata.name,
        "uid": found.metadata.uid or "",
        "controller": True,
        "blockOwnerDeletion": True,
    }


def inputs_wanted(subject: verdicts.Subject) -> list[str]:
    """``Kind/name`` of every ConfigMap and Secret the Module's preflight pod
    reads (in the Module's namespace), in a stable order."""
    target, module = subject.target, subject.module
    if target is None or module is None or not subject.makes:
        return []
    return build_inputs.wanted(module, target)


def desired(
    found: preflight.PreflightValidation,
    subject: verdicts.Subject,
    inputs: build_inputs.Snapshot,
    settings: build_settings.Settings,
) -> tuple[RawObject | None, list[str]]:
    """The Module's preflight pod stamped with its input hash, or what of
    its inputs is missing."""
    target, module = subject.target, subject.module
    assert target is not None
    assert module is not None
    assert subject.makes
    picked = build_inputs.of_pod(inputs, module, target)
    if picked.missing:
        return None, picked.missing
    build, sign = target.build, target.sign
    owner = owner_reference(found)
    try:
        toolkit_image = build_desired.driver_toolkit(module, target, settings, picked.dockerfile)
    except toolkit.ToolkitError as err:
        return None, [str(err)]
    params = build_desired.params(
        module, target, settings,
        image=target.image, owner=owner,
        pull_tls=build.base_image_registry_tls
        if build is not None
        else (sign.unsigned_image_registry_tls if sign is not None else None),
        push=found.spec.push_built_image,
        toolkit_image=toolkit_image,
    )  # fmt: skip
    loader = module.spec.module_loader
    pod = preflightpods.preflight_pod(
        params,
        validation=found.metadata.name,
        owner=owner,
        build=build,
        sign=sign,
        unsigned_image=sign.unsigned_image if build is None and sign is not None else None,
        dir_name=loader.container.modprobe.dir_name if loader is not None else "/opt",
    )
    parts = hashing.made_of(
        pod, pushes=target.image, dockerfile=picked.dockerfile, versions=picked.versions
    )
    return hashing.stamp(pod, parts), []


def unsigned_wanted(target: kernels.Target, final: existence.Fact | None) -> bool:
    """Whether ``unsignedImage``'s existence matters: sign without build,
    and the final image missing."""
    return (
        images.foreign_unsigned(target) is not None
        and final is not None
        and final.state is existence.State.MISSING
    )


def _owned(pod: Mapping[str, Any], uid: str) -> bool:
    """Whether the validation (its uid) is the pod's controller; labels say nothing."""
    return bool(uid) and caches.controller_uid(pod) == uid


def _module_of(pod: Mapping[str, Any]) -> str:
    found = podstatus.meta(pod).get("labels") or {}
    return f"{found.get(labels.MODULE_NAMESPACE, '')}/{found.get(labels.MODULE_NAME, '')}"


def _kept(
    found: preflight.PreflightValidation,
    subject: verdicts.Subject,
    observed: RawObject | None,
    inputs: build_inputs.Snapshot | None,
    settings: build_settings.Settings,
) -> bool:
    """Whether ``observed`` is the pod the Module needs now (same hash)."""
    if observed is None or inputs is None or not subject.makes or podstatus.deleting(observed):
        return False
    wanted, _ = desired(found, subject, inputs, settings)
    return wanted is not None and hashing.of_pod(observed) == hashing.of_pod(wanted)


def _pod_key(pod: Mapping[str, Any]) -> str:
    return f"{podstatus.meta(pod).get('namespace')}/{podstatus.meta(pod).get('name')}"


def _ours(
    found: preflight.PreflightValidation, observed: Sequence[RawObject]
) -> dict[str, RawObject]:
    """The validation's own pods, by ``<namespace>/<name>``: it is their
    controller, and they sit beside the Module they are labelled for (a pod
    elsewhere is a tenant's, whatever it claims: never read, never deleted)."""
    uid = found.metadata.uid or ""
    return {
        _pod_key(p): p
        for p in observed
        if _owned(p, uid) and _module_of(p).partition("/")[0] == podstatus.meta(p).get("namespace")
    }


def _pod_of(found: preflight.PreflightValidation, subject: verdicts.Subject) -> str:
    """``<namespace>/<name>`` of the Module's preflight pod."""
    return f"{subject.namespace}/{podnames.preflight_pod_name(found.metadata.name, subject.name)}"


def asks_registry(
    found: preflight.PreflightValidation,
    subject: verdicts.Subject,
    observed: Sequence[RawObject],
    inputs: build_inputs.Snapshot | None,
    settings: build_settings.Settings,
) -> bool:
    """Whether the final image's existence is needed: the Module has a
    target and no kept pod decides it (``observed``: the validation's pods;
    ``inputs``: those read for the Module, None when not read)."""
    if subject.target is None:
        return False
    return not _kept(found, subject, observed_pod(found, subject, observed), inputs, settings)


def observed_pod(
    found: preflight.PreflightValidation, subject: verdicts.Subject, observed: Sequence[RawObject]
) -> RawObject | None:
    """The Module's preflight pod among ``observed``, if the validation owns one."""
    pod = _ours(found, observed).get(_pod_of(found, subject))
    return pod if pod is not None and _module_of(pod) == subject.key else None


@dataclasses.dataclass
class Plan:
    verdicts: dict[str, verdicts.Verdict] = dataclasses.field(default_factory=dict)  # by Module key
    create: list[RawObject] = dataclasses.field(default_factory=list)
    delete: list[RawObject] = dataclasses.field(default_factory=list)
    # uid -> image of each kept succeeded pod that pushed the final image
    # (the reconciler makes the checker forget what it knew of it, once).
    pushed: dict[str, str] = dataclasses.field(default_factory=dict)
    requeue_after: float | None = None

    def requeue(self, seconds: float) -> None:
        seconds = max(seconds, 0.05)
        if self.requeue_after is None or seconds < self.requeue_after:
            self.requeue_after = seconds


def plan(
    found: preflight.PreflightValidation,
    judged: Sequence[verdicts.Subject],
    *,
    observed: Sequence[RawObject],
    facts: Mapping[str, images.Facts],
    inputs: Mapping[str, build_inputs.Snapshot],
    settings: build_settings.Settings,
) -> Plan:
    """Verdicts for ``judged`` and the pods to create and delete.

    ``observed``: the cached pods labelled for the validation (any owner);
    ``facts`` and ``inputs``: by Module key, for those the reconciler
    asked and read (``asks_registry``, ``unsigned_wanted``, ``inputs_wanted``).
    """
    out = Plan()
    ours = _ours(found, observed)
    foreign = {_pod_key(p) for p in observed} - set(ours)
    kept: set[str] = set()
    for subject in judged:
        key = _pod_of(found, subject)
        pod = ours.get(key)
        mine = pod if pod is not None and _module_of(pod) == subject.key else None
        verdict, keep = _judge(
            found,
            subject,
            mine,
            blocked=key in foreign or (pod is not None and mine is None),
            facts=facts.get(subject.key),
            inputs=inputs.get(subject.key),
            settings=settings,
            out=out,
        )
        out.verdicts[subject.key] = verdict
        if keep:
            kept.add(key)
    for key, pod in sorted(ours.items()):
        if key not in kept and not podstatus.deleting(pod):
            out.delete.append(pod)
    return out


def _judge(
    found: preflight.PreflightValidation,
    subject: verdicts.Subject,
    pod: RawObject | None,
    *,
    blocked: bool,
    facts: images.Facts | None,
    inputs: build_inputs.Snapshot | None,
    settings: build_settings.Settings,
    out: Plan,
) -> tuple[verdicts.Verdict, bool]:
    """The Module's verdict, and whether its observed pod is kept."""
    if subject.verdict is not None:
        return subject.verdict, False
    target = subject.target
    assert target is not None
    if pod is not None and _kept(found, subject, pod, inputs, settings):
        name = podnames.preflight_pod_name(found.metadata.name, subject.name)
        return _outcome(found, subject, pod, name, target.image, settings, out), True
    return _registry(found, subject, pod, blocked=blocked, facts=facts, inputs=inputs, settings=settings, out=out), False  # fmt: skip


def _registry(
    found: preflight.PreflightValidation,
    subject: verdicts.Subject,
    pod: RawObject | None,
    *,
    blocked: bool,
    facts: images.Facts | None,
    inputs: build_inputs.Snapshot | None,
    settings: build_settings.Settings,
    out: Plan,
) -> verdicts.Verdict:
    """The verdict of a Module no kept pod decides: the registry's answer,
    then a pod when it can be made."""
    target = subject.target
    assert target is not None
    image = target.image
    name = podnames.preflight_pod_name(found.metadata.name, subject.name)
    final = facts.final if facts is not None else None
    if final is None:
        return verdicts.in_progress(image=image)
    if final.state is existence.State.EXISTS:
        return verdicts.success(preflight.REASON_IMAGE_EXISTS, image=image)
    if (why := _unverified(final, image)) is not None:
        return why
    if not subject.makes:
        return verdicts.failure(preflight.REASON_IMAGE_MISSING, image=image)
    sign = target.sign
    if sign is not None and unsigned_wanted(target, final):
        unsigned = facts.unsigned if facts is not None else None
        if unsigned is None:
            return verdicts.in_progress(image=image)
        if (why := _unverified(unsigned, sign.unsigned_image or "")) is not None:
            return dataclasses.replace(why, image=image)
        if unsigned.state is existence.State.MISSING:
            out.requeue(settings.poll)
            return verdicts.failure(
                f"{preflight.REASON_BUILD_FAILED}: sign.unsignedImage {sign.unsigned_image} "
                "does not exist",
                image=image,
            )
    wanted, missing = desired(found, subject, inputs or build_inputs.Snapshot(), settings)
    if wanted is None:
        out.requeue(settings.poll)
        return verdicts.failure(
            f"{preflight.REASON_BUILD_FAILED}: {'; '.join(missing)}", image=image
        )
    if pod is not None or blocked:
        # The old pod goes first (deleted below, or by the garbage
        # collector); its deletion requeues the validation.
        return verdicts.in_progress(f"{preflight.REASON_IN_PROGRESS}: waiting for the old pod {subject.namespace}/{name} to go", image=image, pod=name)  # fmt: skip
    out.create.append(wanted)
    return verdicts.in_progress(image=image, pod=name)


def _unverified(fact: existence.Fact, image: str) -> verdicts.Verdict | None:
    """The verdict of an existence fact that is no answer, if it is one."""
    if fact.state is existence.State.AUTH_FAILED:
        message = fact.message or f"{image}: the registry refused the credentials"
        return verdicts.failure(f"image existence could not be verified: {message}", image=image)
    if fact.state is existence.State.ERROR:
        return verdicts.in_progress(f"{preflight.REASON_IN_PROGRESS}: {fact.message}", image=image)
    return None


def _outcome(
    found: preflight.PreflightValidation,
    subject: verdicts.Subject,
    pod: RawObject,
    name: str,
    image: str,
    settings: build_settings.Settings,
    out: Plan,
) -> verdicts.Verdict:
    """The verdict a kept pod gives."""
    phase = podstatus.phase(pod)
    if phase == "Succeeded":
        pushed = podstatus.summary(pod).get("pushed")
        if pushed if isinstance(pushed, bool) else found.spec.push_built_image:
            out.pushed[str(podstatus.meta(pod).get("uid") or "")] = image
            reason = f"{preflight.REASON_BUILT}; pushed {image}"
        else:
            reason = f"{preflight.REASON_BUILT}; the image was not pushed (pushBuiltImage is false)"
        return verdicts.success(reason, image=image, pod=name)
    if phase == "Failed":
        # Fixed inputs (a ConfigMap, a Secret) send no event: look again.
        out.requeue(settings.poll)
        reason = f"{preflight.REASON_BUILD_FAILED}: pod {subject.namespace}/{name} failed: {podstatus.tail(pod)}"
        return verdicts.failure(reason, image=image, pod=name)
    return verdicts.in_progress(image=image, pod=name)
