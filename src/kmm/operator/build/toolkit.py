"""``DTK_AUTO``: the driver toolkit image a build gets for its kernel (pure).

KMM on OpenShift passes its build pods the build argument ``DTK_AUTO``, the
driver-toolkit image of the kernel being built for (the cluster's release
payload knows it), so that a Dockerfile written ``ARG DTK_AUTO`` /
``FROM ${DTK_AUTO}`` builds on a base with that kernel's headers and
compiler. A plain Kubernetes cluster has no such payload: kmm takes the
image from the operator's ``--driver-toolkit-image TEMPLATE``, expanded
for the kernel as a kernel mapping's ``containerImage`` is
(``kernels.variables``: tag-safe ``KERNEL_FULL_VERSION``, ``KERNEL_XYZ`` ...,
``MOD_NAME``, ``MOD_NAMESPACE``).

The rules (``value``), and why:

- Passed only to a build whose Dockerfile mentions ``DTK_AUTO`` (KMM's
  own test, a substring), so the value enters the input hash of those
  builds alone: a changed template rebuilds the images of the Modules that
  use it, not every image kmm ever built.
- A ``DTK_AUTO`` the Module's ``buildArgs`` set is the user's, passed once
  with the user's value (kmm's rule for every preset a user also sets).
  KMM on OpenShift replaces it with its own instead; here a Module may
  name the toolkit of its choice, and a Dockerfile written for OpenShift
  builds on a cluster whose operator has no template.
- Needed and not given (the Dockerfile declares ``ARG DTK_AUTO`` without
  a default, the Module sets none, the operator has no template): a
  ``ToolkitError`` naming the flag, which the planner shows as that
  kernel's ``BuildFailed`` with no pod made, rather than buildah's
  "invalid reference format" from a pod.
- A template that expands to no valid image for a kernel (``KERNEL_Z`` of
  ``6.8.0+rt`` is ``0+rt``, which a tag cannot hold): a ``ToolkitError``
  for that kernel alone.

``check_template`` judges a template once, at the operator's start, as
admission judges a ``containerImage`` (``formats.image_error``).
"""

from __future__ import annotations

import re
from typing import Final

from kmm.api import formats, kernels

__all__ = ["BUILD_ARG", "FLAG", "ToolkitError", "check_template", "mentioned", "required", "value"]

BUILD_ARG: Final = "DTK_AUTO"
FLAG: Final = "--driver-toolkit-image"

# One Dockerfile instruction per line once continuations are joined;
# ``ARG`` is case-insensitive, as every instruction keyword.
_CONTINUATION = re.compile(r"\\[ \t]*\r?\n")
_ARG = re.compile(r"^\s*ARG\s+(.*)$", re.IGNORECASE)


class ToolkitError(ValueError):
    """No ``DTK_AUTO`` can be given to a build that needs one; the message
    says why, naming the flag."""


def check_template(template: str) -> None:
    """ValueError naming ``FLAG`` when ``template`` is not an image
    reference with an explicit tag or digest, its variables those of a
    kernel mapping's ``containerImage``."""
    invalid = formats.image_error(template)
    if invalid is not None:
        raise ValueError(f"{FLAG}: {invalid}")


def mentioned(dockerfile: str) -> bool:
    """Whether the Dockerfile names ``DTK_AUTO`` anywhere (KMM's test)."""
    return BUILD_ARG in dockerfile


def _declarations(dockerfile: str) -> list[bool]:
    """One entry per ``ARG`` declaring ``DTK_AUTO``: whether it gives a default."""
    found = []
    for line in _CONTINUATION.sub(" ", dockerfile).splitlines():
        match = _ARG.match(line)
        if match is None:
            continue
        for word in match.group(1).split():
            name, equals, _ = word.partition("=")
            if name == BUILD_ARG:
                found.append(bool(equals))
    return found


def required(dockerfile: str) -> bool:
    """Whether the build fails without ``DTK_AUTO``: an ``ARG`` declares it
    and none gives it a default (a later ``ARG DTK_AUTO`` in a stage
    inherits the default of one before ``FROM``)."""
    declared = _declarations(dockerfile)
    return bool(declared) and not any(declared)


def value(
    template: str, target: kernels.Target, *, module: str, namespace: str, dockerfile: str
) -> str | None:
    """``DTK_AUTO`` for ``target``'s build from the operator's ``template``
    ("" when it has none); None when kmm passes none (see the module
    docstring). ``ToolkitError`` when the build needs one kmm cannot give."""
    build = target.build
    if build is None or not mentioned(dockerfile):
        return None
    if any(name == BUILD_ARG for name, _ in build.build_args):
        return None  # the user's, passed as they set it
    if not template:
        if required(dockerfile):
            raise ToolkitError(
                f"the Dockerfile declares ARG {BUILD_ARG} without a default and nothing gives "
                f"it a value: kmm passes {BUILD_ARG}, the driver toolkit image of the kernel, "
                f"when the operator runs with {FLAG} TEMPLATE; or set {BUILD_ARG} in the "
                "Module's buildArgs"
            )
        return None
    try:
        values = kernels.variables(target.kernel, module_name=module, module_namespace=namespace)
        image = kernels.expand(template, values)
    except kernels.KernelMappingError as err:  # the target expanded: seldom here
        raise ToolkitError(f"{FLAG}: {err}") from err
    invalid = formats.image_error(image)
    if invalid is not None:
        raise ToolkitError(f"{FLAG} {template!r} gives no image for this kernel: {invalid}")
    return image
