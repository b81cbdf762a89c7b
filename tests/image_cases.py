"""Image names and each rule's verdict on them, shared by the unit test (the
operator's Python validation, ``formats.image_error``) and the integration
test (the API server's CRD rules): the literal parts of a kernel-mapping
image are judged with the reference grammar, its variables standing for
any value the grammar allows; what only expansion reveals is each kernel's
(``kernels.target``). Not a test module."""

from __future__ import annotations

import dataclasses
from typing import Any, Final

from kmm.api import formats

_GRAMMAR = formats.IMAGE_REFERENCE_MESSAGE
_LENGTH = formats.IMAGE_NAME_LENGTH_MESSAGE
_TAG = "explicit tag"


@dataclasses.dataclass(frozen=True)
class Case:
    """``image`` in a kernel mapping (``plain``: the device plugin's, taken
    as written): accepted when ``message`` is None, else refused by the
    rule whose message it is (Python's words when they differ: ``python``)."""

    name: str
    image: str
    message: str | None = None
    python: str | None = None
    plain: bool = False


CASES: Final = (
    Case("tagged", "r.io/org/driver:v1"),
    Case("docker-hub", "myorg/driver:v1"),
    Case("separators", "r.io/a__b/c-d/e.f--g:v_1.2-3"),
    Case("port-and-variables", "host:5000/$MOD_NAMESPACE/$MOD_NAME:$KERNEL_FULL_VERSION"),
    Case("variable-in-host", "${MOD_NAMESPACE}.registry.example/driver:${KERNEL_XYZ}"),
    Case("variable-mid-tag", "r.io/driver:v${KERNEL_X}.${KERNEL_Y}-rt"),
    Case("localhost", "localhost/driver:v1"),
    Case("ipv6-host", "[fd00::1]:5000/driver:v1"),
    Case("tag-and-digest", "r.io/driver:v1@sha256:" + "a" * 64),
    Case("digest", "r.io/driver@sha256:" + "a" * 64),
    Case("upper-case-host", "Registry.Example:5000/driver:v1"),
    Case("tag-of-128", "r.io/driver:" + "t" * 128),
    Case("plain-tagged", "r.io/plugin:v1", plain=True),
    # Docker would dial a host "MyOrg": a mistyped Docker Hub name, refused.
    Case("upper-case-first-component", "MyOrg/driver:v1", _GRAMMAR),
    Case("upper-case-path", "r.io/org/Driver:v1", _GRAMMAR),
    Case("tag-of-129", "r.io/driver:" + "t" * 129, _GRAMMAR),
    Case("tag-starts-with-dot", "r.io/driver:.v1", _GRAMMAR),
    Case("tag-starts-with-dash-before-a-variable", "r.io/driver:-${KERNEL_XYZ}", _GRAMMAR),
    Case("empty-path-component", "r.io//driver:v1", _GRAMMAR),
    Case("separator-at-the-end", "r.io/driver_:v1", _GRAMMAR),
    Case("double-dot", "r.io/a..b:v1", _GRAMMAR),
    Case("variable-beside-upper-case", "r.io/Mod-$MOD_NAME:v1", _GRAMMAR),
    Case("name-of-256", "r.io/" + "a/" * 125 + "abcde:v1", _LENGTH),
    Case("no-tag", "r.io/driver", _TAG),
    Case("plain-upper-case", "MyOrg/plugin:v1", _GRAMMAR, plain=True),
    Case("plain-long-tag", "r.io/plugin:" + "t" * 129, _GRAMMAR, plain=True),
)


def place(case: Case, obj: dict[str, Any]) -> str:
    """Put ``case.image`` into ``obj`` (``examples.module()``); the field path."""
    if case.plain:
        obj["spec"]["dra"]["container"]["image"] = case.image
        return "spec.dra.container.image"
    obj["spec"]["moduleLoader"]["container"]["kernelMappings"][0]["containerImage"] = case.image
    return "spec.moduleLoader.container.kernelMappings[0].containerImage"
