"""The build-and-sign planner for one Module: which pods to create or delete,
which kernels wait for their image (pure).

Only kernel targets whose merged mapping has ``build`` or ``sign`` concern
it; a Module without either gets an empty plan and its loader DaemonSets at
once. For each such kernel, from the facts the reconciler gathered
(``existence``: the final image, and with build and sign the intermediate
one), the inputs it read (ConfigMaps and Secrets, by resourceVersion) and
the build and sign pods the cache holds:

- final image ``EXISTS``: nothing to do; the kernel's loader may run;
- ``AUTH_FAILED``: an authentication error naming the Secret, never a
  build; ``ERROR``: checked again after the back-off (``Checking``);
- ``MISSING``: the kernel is *gated* (its loader DaemonSet is not created
  until the image exists; one that exists stays, ``loader.planner``). Build
  only: a build pod pushes the final image. Sign only: once the registry has
  ``unsignedImage`` (asked every ``Settings.poll`` seconds until then), a
  sign pod signs it into the final image. Build and sign: the build pushes
  ``pods.intermediate_image(final)`` and, once that exists, a sign pod pushes
  the signed result under the final name, so only a signed image ever
  carries it; a failed sign is retried as a sign, never by a rebuild. The
  one exception is ``rebuild``: kernels the reconciler says must be built
  again (an ``imageRebuildTriggerGeneration`` pass whose build has not yet
  succeeded), whose existing intermediate image is stale: built again, then
  signed.

A pod's ``last-hash`` (``hashing``) digests the rendered pod and its inputs.
A failed pod is kept (its termination message, the log tail under
``FallbackToLogsOnError``, is the Degraded message), its kernel requeued
every ``Settings.poll`` seconds, and replaced only once its inputs' hash
changed or someone deleted it. A succeeded pod is deleted
``Settings.retention`` seconds after it finished; a sign pod's summary
(``{"signed": [...], "unmatched": [...]}``) first gives a Warning Event per
pattern that matched nothing.

Events (``BuildCreated`` ... ``SignFailed``) are given once per pod:
``noticed`` holds the uids (and authentication messages) already told,
kept by the reconciler between reconciles and pruned here to what the
cache still shows.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

from kmm.api import kernels, modules
from kmm.operator import objects, status, views
from kmm.operator.build import existence, hashing, pods

__all__ = [
    "BuildPlan",
    "Creation",
    "Event",
    "Facts",
    "Inputs",
    "Settings",
    "build_pod_phase",
    "concerned",
    "inputs_wanted",
    "intermediate_wanted",
    "keys_of",
    "module_builds",
    "module_keys",
    "plan",
    "pushed_by_succeeded",
    "target_inputs",
    "unsigned_awaited",
]

RawObject = dict[str, Any]
Role = Literal["build", "sign"]
ROLES: Final[tuple[Role, Role]] = ("build", "sign")

REASON_AUTHENTICATION_FAILED: Final = "AuthenticationFailed"
REASON_BUILD_FAILED: Final = "BuildFailed"
REASON_SIGN_FAILED: Final = "SignFailed"
# Lines of a failed pod's termination message the Degraded condition quotes.
_TAIL_LINES = 6
DEFAULT_POLL: Final = 10.0


@dataclasses.dataclass(frozen=True)
class Settings:
    builder_image: str = pods.DEFAULT_BUILDER_IMAGE
    registry_ca: str = ""  # PEM bundle handed to the pods
    retention: float = 0.0  # seconds a succeeded pod is kept
    poll: float = DEFAULT_POLL  # seconds between looks at a failed pod's inputs


@dataclasses.dataclass(frozen=True)
class Facts:
    """What the registry said of one kernel's final image and, with build
    and sign while the final one is missing, of the intermediate one."""

    final: existence.Fact
    intermediate: existence.Fact | None = None


@dataclasses.dataclass(frozen=True)
class Inputs:
    """ConfigMaps and Secrets the reconciler read (only for images not
    known to exist): ``Kind/name`` -> resourceVersion of those that exist,
    and each ConfigMap's ``dockerfile`` text."""

    versions: Mapping[str, str] = dataclasses.field(default_factory=dict)
    dockerfiles: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclasses.dataclass(frozen=True)
class Creation:
    """A pod to create and the Event that tells it was."""

    pod: RawObject
    event: Event


@dataclasses.dataclass
class BuildPlan:
    create: list[Creation] = dataclasses.field(default_factory=list)
    delete: list[RawObject] = dataclasses.field(default_factory=list)  # observed pods
    gated: set[str] = dataclasses.field(default_factory=set)  # kernels
    images: list[modules.ImageStatus] = dataclasses.field(default_factory=list)
    problems: list[status.Problem] = dataclasses.field(default_factory=list)
    events: list[Event] = dataclasses.field(default_factory=list)
    noticed: set[str] = dataclasses.field(default_factory=set)
    requeue_after: float | None = None

    @property
    def concerned(self) -> bool:
        return bool(self.images)

    def all_exist(self) -> bool:
        return all(image.state == "Exists" for image in self.images)

    def requeue(self, seconds: float) -> None:
        seconds = max(seconds, 0.05)
        if self.requeue_after is None or seconds < self.requeue_after:
            self.requeue_after = seconds


def module_builds(module: modules.Module) -> bool:
    """Whether any level of ``module`` has ``build`` or ``sign`` (cheap: no
    node is looked at, so a Module that builds nothing costs nothing here)."""
    loader = module.spec.module_loader
    if loader is None:
        return False
    container = loader.container
    return (
        container.build is not None
        or container.sign is not None
        or any(m.build is not None or m.sign is not None for m in container.kernel_mappings)
    )


def concerned(targets: Mapping[str, kernels.Target]) -> dict[str, kernels.Target]:
    """The kernels whose image is built or signed when missing."""
    return {k: t for k, t in sorted(targets.items()) if t.build is not None or t.sign is not None}


def keys_of(view: views.ModuleView, target: kernels.Target) -> tuple[existence.Key, existence.Key]:
    """The existence keys of the final image and of the one a sign pod
    signs: the build's intermediate image, or without build ``unsignedImage``
    (asked with ``unsignedImageRegistryTLS``)."""
    return module_keys(view.module, target)


def module_keys(
    module: modules.Module, target: kernels.Target
) -> tuple[existence.Key, existence.Key]:
    """``keys_of`` for a Module without a view (``kmm.operator.preflight``
    asks with the same keys, so both share the checker's facts)."""
    secret = module.spec.image_repo_secret
    namespace = module.metadata.namespace or ""
    who = f"{namespace}/{secret.name}" if secret is not None else ""
    tls = existence.Tls.of(target.registry_tls)
    final = existence.Key(target.image, tls, who)
    sign = target.sign
    if target.build is None and sign is not None and sign.unsigned_image is not None:
        unsigned_tls = existence.Tls.of(sign.unsigned_image_registry_tls)
        return final, existence.Key(sign.unsigned_image, unsigned_tls, who)
    return final, existence.Key(pods.intermediate_image(target.image), tls, who)


def intermediate_wanted(target: kernels.Target, final: existence.Fact) -> bool:
    """Whether the existence of the image a sign pod signs matters: the
    kernel signs and its final image is missing."""
    return target.sign is not None and final.state is existence.State.MISSING


def unsigned_awaited(target: kernels.Target, facts: Facts) -> str | None:
    """Sign without build whose ``unsignedImage`` the registry says is
    missing: that image (someone else pushes it; it is asked again every
    ``Settings.poll`` seconds, and no sign pod is made meanwhile)."""
    sign = target.sign
    if target.build is not None or sign is None or sign.unsigned_image is None:
        return None
    found = facts.intermediate
    if found is None or found.state is not existence.State.MISSING:
        return None
    return sign.unsigned_image


def target_inputs(module: modules.Module, target: kernels.Target) -> list[str]:
    """``Kind/name`` of every ConfigMap and Secret the pods of one kernel's
    ``target`` read (in the Module's namespace), each once, in a stable order."""
    wanted: list[str] = []
    secret = module.spec.image_repo_secret
    if secret is not None:
        wanted.append(f"Secret/{secret.name}")
    if target.build is not None:
        wanted.append(f"ConfigMap/{target.build.dockerfile_config_map}")
        wanted.extend(f"Secret/{name}" for name in target.build.secrets)
    if target.sign is not None:
        wanted.extend((f"Secret/{target.sign.key_secret}", f"Secret/{target.sign.cert_secret}"))
    return list(dict.fromkeys(wanted))


def inputs_wanted(view: views.ModuleView, targets: Mapping[str, kernels.Target]) -> set[str]:
    """``Kind/name`` of every ConfigMap and Secret the pods of ``targets`` read."""
    return {w for target in targets.values() for w in target_inputs(view.module, target)}


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    found: Mapping[str, Any] = obj.get("metadata") or {}
    return found


def _uid(pod: Mapping[str, Any]) -> str:
    """What ``noticed`` knows a pod by (its uid; its name where a test gave none)."""
    return str(_meta(pod).get("uid") or _meta(pod).get("name"))


def _phase(pod: Mapping[str, Any]) -> str:
    value = (pod.get("status") or {}).get("phase")
    return value if isinstance(value, str) else ""


def _terminated(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    """The termination of the container that failed, else of the first that ended."""
    found: list[Mapping[str, Any]] = []
    for field in ("initContainerStatuses", "containerStatuses"):
        for container in (pod.get("status") or {}).get(field) or ():
            ended = (container.get("state") or {}).get("terminated")
            if isinstance(ended, Mapping):
                found.append(ended)
    failed = [t for t in found if t.get("exitCode")]
    return (failed or found or [{}])[0]


def _tail(pod: Mapping[str, Any]) -> str:
    ended = _terminated(pod)
    text = str(ended.get("message") or "").strip()
    if not text:
        return f"{ended.get('reason') or 'no termination message'} (exit code {ended.get('exitCode', '?')})"
    return "\n".join(text.splitlines()[-_TAIL_LINES:])


def _finished(pod: Mapping[str, Any]) -> datetime.datetime | None:
    value = _terminated(pod).get("finishedAt")
    if not isinstance(value, str):
        return None
    try:
        return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def _summary(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    try:
        found = json.loads(str(_terminated(pod).get("message") or ""))
    except ValueError:
        return {}
    return found if isinstance(found, Mapping) else {}


def _pod_named(view: views.ModuleView, role: Role, name: str) -> RawObject | None:
    return next((p for p in view.pods.get(role, ()) if _meta(p).get("name") == name), None)


def build_pod_phase(view: views.ModuleView, kernel: str) -> str | None:
    """The phase of the kernel's build pod ("" before the kubelet gave it
    one); None when the cache shows none, or one being deleted."""
    pod = _pod_named(view, "build", pods.pod_name(view.name, "build", kernel))
    if pod is None or _meta(pod).get("deletionTimestamp"):
        return None
    return _phase(pod)


def pushed_by_succeeded(
    view: views.ModuleView, targets: Mapping[str, kernels.Target], noticed: set[str]
) -> set[str]:
    """Images that a build or sign pod not yet ``noticed`` pushed
    successfully: the reconciler forgets what it knew of them first."""
    found: set[str] = set()
    for kernel, target in concerned(targets).items():
        for role in ROLES:
            pod = _pod_named(view, role, pods.pod_name(view.name, role, kernel))
            if pod is None or _phase(pod) != "Succeeded" or _uid(pod) in noticed:
                continue
            if role == "build" and target.sign is not None:
                found.add(pods.intermediate_image(target.image))
            else:
                found.add(target.image)
    return found


@dataclasses.dataclass
class _Kernel:
    """The planning of one kernel: its target and what it found."""

    view: views.ModuleView
    kernel: str
    target: kernels.Target
    facts: Facts
    inputs: Inputs
    settings: Settings
    noticed: set[str]
    now: datetime.datetime
    out: BuildPlan
    rebuild: bool = False  # the intermediate image, if any, is stale

    def image(
        self, state: modules.ImageState, *, pod: str | None = None, message: str | None = None
    ) -> None:
        self.out.images.append(
            modules.ImageStatus(
                kernel=self.kernel, image=self.target.image, state=state, pod=pod, message=message
            )
        )

    def tell(self, key: str, event: Event) -> None:
        """``event``, unless told already for ``key``; remembered either way."""
        if key not in self.noticed:
            self.out.events.append(event)
        self.out.noticed.add(key)

    def inputs_of(self, role: Role) -> tuple[dict[str, str], list[str]]:
        """The versions a pod of ``role`` depends on, and the inputs missing."""
        wanted: list[str] = []
        secret = self.view.module.spec.image_repo_secret
        if secret is not None:
            wanted.append(f"Secret/{secret.name}")
        if role == "build":
            assert self.target.build is not None
            wanted.append(f"ConfigMap/{self.target.build.dockerfile_config_map}")
            wanted.extend(f"Secret/{name}" for name in self.target.build.secrets)
        else:
            assert self.target.sign is not None
            wanted.extend((f"Secret/{self.target.sign.key_secret}", f"Secret/{self.target.sign.cert_secret}"))  # fmt: skip
        versions = {w: self.inputs.versions[w] for w in wanted if w in self.inputs.versions}
        missing = [
            f"{w.replace('/', f' {self.view.namespace}/', 1)} does not exist"
            for w in wanted
            if w not in versions
        ]
        if role == "build" and not missing:
            assert self.target.build is not None
            name = self.target.build.dockerfile_config_map
            if name not in self.inputs.dockerfiles:
                missing.append(
                    f"ConfigMap {self.view.namespace}/{name} has no key {pods.DOCKERFILE_KEY!r}"
                )
        return versions, missing

    def desired(self, role: Role) -> tuple[RawObject | None, list[str]]:
        """The pod of ``role`` stamped with its input hash, or the inputs missing."""
        versions, missing = self.inputs_of(role)
        if missing:
            return None, missing
        module = self.view.module
        secret = module.spec.image_repo_secret
        final = self.target.image
        dockerfile = ""
        if role == "build":
            assert self.target.build is not None
            build = self.target.build
            inputs = pods.PodInputs(
                module=self.view.name,
                namespace=self.view.namespace,
                kernel=self.kernel,
                image=pods.intermediate_image(final) if self.target.sign is not None else final,
                builder_image=self.settings.builder_image,
                owner=objects.controller_reference(module),
                repo_secret=secret.name if secret is not None else None,
                registry_ca=self.settings.registry_ca,
                push_tls=self.target.registry_tls,
                pull_tls=build.base_image_registry_tls,
                node_selector=dict(build.selector),
            )
            pod = pods.build_pod(inputs, build)
            dockerfile = self.inputs.dockerfiles[build.dockerfile_config_map]
        else:
            assert self.target.sign is not None
            sign = self.target.sign
            unsigned = (
                pods.intermediate_image(final)
                if self.target.build is not None or sign.unsigned_image is None
                else sign.unsigned_image
            )
            selector = dict(self.target.build.selector) if self.target.build is not None else {}
            inputs = pods.PodInputs(
                module=self.view.name,
                namespace=self.view.namespace,
                kernel=self.kernel,
                image=final,
                builder_image=self.settings.builder_image,
                owner=objects.controller_reference(module),
                repo_secret=secret.name if secret is not None else None,
                registry_ca=self.settings.registry_ca,
                push_tls=self.target.registry_tls,
                pull_tls=self.target.registry_tls
                if self.target.build is not None
                else sign.unsigned_image_registry_tls,
                node_selector=selector,
            )
            loader = module.spec.module_loader
            dir_name = loader.container.modprobe.dir_name if loader is not None else "/opt"
            pod = pods.sign_pod(inputs, sign, unsigned_image=unsigned, dir_name=dir_name)
        trigger = module.spec.image_rebuild_trigger_generation
        digest = hashing.digest(pod, dockerfile=dockerfile, versions=versions, trigger=trigger)
        return hashing.stamped(pod, digest), []

    def finish_succeeded(self, role: Role, pod: RawObject) -> None:
        """Events once, then the delete once ``retention`` has passed."""
        name, uid = _meta(pod)["name"], _uid(pod)
        reason = "BuildSucceeded" if role == "build" else "SignSucceeded"
        what = f"{role} pod {name} for kernel {self.kernel} succeeded"
        if role == "sign":
            summary = _summary(pod)
            signed = summary.get("signed") or ()
            what += f": {len(signed)} file(s) signed into {self.target.image}"
            for pattern in summary.get("unmatched") or ():
                self.tell(
                    f"{uid}:unmatched:{pattern}",
                    Event(
                        "Warning",
                        "FilesToSignUnmatched",
                        f"filesToSign pattern {pattern!r} matched no file for kernel {self.kernel}",
                    ),
                )
        self.tell(uid, Event("Normal", reason, what))
        ended = _finished(pod)
        left = (
            0.0 if ended is None else self.settings.retention - (self.now - ended).total_seconds()
        )
        if left <= 0:
            self.out.delete.append(pod)
        else:
            self.out.requeue(left)

    def run_pod(self, role: Role) -> None:
        """The kernel needs the pod of ``role`` to succeed: make it, wait for
        it, or show its failure."""
        name = pods.pod_name(self.view.name, role, self.kernel)
        observed = _pod_named(self.view, role, name)
        busy: modules.ImageState = "Building" if role == "build" else "Signing"
        failed_state: modules.ImageState = "BuildFailed" if role == "build" else "SignFailed"
        failed_reason = REASON_BUILD_FAILED if role == "build" else REASON_SIGN_FAILED
        if observed is not None and _meta(observed).get("deletionTimestamp"):
            self.image(busy, pod=name, message="waiting for the old pod to go")
            return
        phase = _phase(observed) if observed is not None else ""
        if observed is not None and phase == "Succeeded":
            # Its image is checked again before this plan (``pushed_by_succeeded``).
            self.finish_succeeded(role, observed)
            self.image(busy, pod=name)
            return
        if observed is not None and phase != "Failed":
            self.image(busy, pod=name)
            return
        desired, missing = self.desired(role)
        if desired is None:
            message = f"{role} for kernel {self.kernel}: " + "; ".join(missing)
            self.out.problems.append(status.Problem(failed_reason, message))
            self.tell(f"inputs:{message}", Event("Warning", failed_reason, message))
            self.image(failed_state, pod=name if observed is not None else None, message=message)
            self.out.requeue(self.settings.poll)
            return
        if observed is not None:  # failed
            if hashing.of_pod(observed) != hashing.of_pod(desired):
                self.out.delete.append(observed)  # its inputs changed: make it again
                self.image(busy, pod=name, message="inputs changed; retrying")
                return
            tail = _tail(observed)
            message = f"{role} pod {name} for kernel {self.kernel} failed: {tail}"
            self.out.problems.append(status.Problem(failed_reason, message))
            self.tell(_uid(observed), Event("Warning", failed_reason, message))
            self.image(failed_state, pod=name, message=tail)
            self.out.requeue(self.settings.poll)
            return
        pushed = _meta(desired)["name"]
        reason = "BuildCreated" if role == "build" else "SignCreated"
        self.out.create.append(
            Creation(
                desired,
                Event("Normal", reason, f"created {role} pod {pushed} for kernel {self.kernel}"),
            )
        )
        self.image(busy, pod=name)

    def blocked(self, fact: existence.Fact, image: str) -> bool:
        """Show a fact that stops the kernel (authentication, no answer); True if it does."""
        if fact.state is existence.State.AUTH_FAILED:
            message = fact.message or f"{image}: the registry refused the credentials"
            self.out.problems.append(status.Problem(REASON_AUTHENTICATION_FAILED, message))
            self.tell(f"auth:{image}:{message}", Event("Warning", REASON_AUTHENTICATION_FAILED, message))  # fmt: skip
            self.image("AuthenticationFailed", message=message)
            self.out.requeue(self.settings.poll)
            return True
        if fact.state is existence.State.ERROR:
            self.image("Checking", message=fact.message)
            return True
        return False

    def plan(self) -> None:
        final = self.facts.final
        if final.state is existence.State.EXISTS:
            self.image("Exists")
            return
        self.out.gated.add(self.kernel)
        if self.blocked(final, self.target.image):
            return
        build, sign = self.target.build, self.target.sign
        if build is not None and sign is not None:
            sign_name = pods.pod_name(self.view.name, "sign", self.kernel)
            signing = _pod_named(self.view, "sign", sign_name)
            if self.rebuild and (signing is None or _phase(signing) in ("Succeeded", "Failed")):
                # A terminated sign pod signed the stale image: it goes.
                self.finish_stale("sign")
                self.run_pod("build")
                return
            if signing is not None:
                self.run_pod("sign")
                return
            intermediate = self.facts.intermediate
            if intermediate is None:
                self.image("Checking")
                return
            if self.blocked(intermediate, pods.intermediate_image(self.target.image)):
                return
            if intermediate.state is existence.State.EXISTS:
                self.finish_stale("build")
                self.run_pod("sign")
            else:
                self.run_pod("build")
            return
        if build is None and sign is not None:
            self.plan_sign_only(sign)
            return
        self.run_pod("build")

    def plan_sign_only(self, sign: kernels.SignTarget) -> None:
        """Sign ``unsignedImage`` once the registry has it: a sign pod made
        before would fail and, its inputs unchanged, never be retried."""
        name = pods.pod_name(self.view.name, "sign", self.kernel)
        if _pod_named(self.view, "sign", name) is not None:
            self.run_pod("sign")
            return
        unsigned = self.facts.intermediate
        if unsigned is None:
            self.image("Checking")
            return
        if self.blocked(unsigned, sign.unsigned_image or ""):
            return
        if unsigned.state is existence.State.MISSING:
            self.image(
                "Missing",
                message=f"unsigned image {sign.unsigned_image} does not exist yet; "
                f"asked again every {self.settings.poll:g} s",
            )
            self.out.requeue(self.settings.poll)
            return
        self.run_pod("sign")

    def finish_stale(self, role: Role) -> None:
        """A terminated pod of ``role`` no longer needed for this kernel."""
        pod = _pod_named(self.view, role, pods.pod_name(self.view.name, role, self.kernel))
        if pod is None or _meta(pod).get("deletionTimestamp"):
            return
        if _phase(pod) == "Succeeded":
            self.finish_succeeded(role, pod)
        elif _phase(pod) == "Failed":
            self.out.delete.append(pod)


def plan(
    view: views.ModuleView,
    targets: Mapping[str, kernels.Target],
    facts: Mapping[str, Facts],
    inputs: Inputs,
    *,
    noticed: set[str],
    settings: Settings,
    now: datetime.datetime,
    rebuild: frozenset[str] = frozenset(),
) -> BuildPlan:
    """The plan for the concerned kernels of ``targets`` (``facts`` given
    for each of them). Pods of kernels no longer targeted are deleted once
    they ended. ``rebuild``: kernels that build and sign whose intermediate
    image, if the registry has one, is not to be signed but built again."""
    out = BuildPlan()
    wanted = concerned(targets)
    names: set[str] = set()
    for kernel, target in wanted.items():
        names.update(pods.pod_name(view.name, role, kernel) for role in ROLES)
        one = _Kernel(view, kernel, target, facts[kernel], inputs, settings, noticed, now, out, kernel in rebuild)  # fmt: skip
        one.plan()
        if facts[kernel].final.state is existence.State.EXISTS:
            for role in ROLES:
                one.finish_stale(role)
    for role in ROLES:
        for pod in view.pods.get(role, ()):
            if _meta(pod).get("name") in names or _meta(pod).get("deletionTimestamp"):
                continue
            if _phase(pod) in ("Succeeded", "Failed"):
                out.delete.append(pod)
    # A pod stays noticed while the cache shows it; an authentication
    # failure or a missing input while it is still the one shown.
    shown = {_uid(p) for role in ROLES for p in view.pods.get(role, ())}
    out.noticed = {
        key
        for key in noticed | out.noticed
        if (
            key in out.noticed
            if key.startswith(("auth:", "inputs:"))
            else key.split(":", 1)[0] in shown
        )
    }
    out.delete = _unique(out.delete)
    return out


def _unique(found: Sequence[RawObject]) -> list[RawObject]:
    seen: set[str] = set()
    kept: list[RawObject] = []
    for pod in found:
        name = str(_meta(pod).get("name"))
        if name not in seen:
            seen.add(name)
            kept.append(pod)
    return kept
