"""``DTK_AUTO`` (kmm.operator.build.toolkit): the driver toolkit image of the
kernel being built for, from the operator's ``--driver-toolkit-image``
template; in the build pod, the pod's and the image's input hash, the
planner's BuildFailed when a build needs one kmm cannot give, and the
preflight pod."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import test_build_planner as cases

from kmm.api import kernels
from kmm.operator.build import desired, hashing, images, podparts, toolkit
from kmm.operator.build import inputs as build_inputs
from kmm.operator.build import settings as build_settings
from kmm.operator.loader import planner as loader_planner

Obj = dict[str, Any]
TEMPLATE = "10.253.0.1:5000/kmm/driver-toolkit:${KERNEL_FULL_VERSION}"
DEBIAN = "6.12.57+deb12-amd64"
DOCKERFILE = "ARG DTK_AUTO\nFROM ${DTK_AUTO}\nRUN make\n"
WITH = build_settings.Settings(builder_image="b.io/builder:1", driver_toolkit_image=TEMPLATE)


def _target(kernel: str = DEBIAN, args: tuple[tuple[str, str], ...] = ()) -> kernels.Target:
    build = kernels.BuildTarget(
        dockerfile_config_map="dockerfile",
        build_args=args,
        secrets=(),
        base_image_registry_tls=None,
        selector=(),
    )
    mapping: Any = None
    return kernels.Target(kernel, mapping, "r.io/m:1", (), build=build)


def _value(template: str, dockerfile: str = DOCKERFILE, **target: Any) -> str | None:
    return toolkit.value(template, _target(**target), module="m", namespace="ns", dockerfile=dockerfile)  # fmt: skip


# -- the template ------------------------------------------------------------


@pytest.mark.parametrize(
    "template",
    [
        TEMPLATE,
        "quay.io/dtk/${MOD_NAMESPACE}-${MOD_NAME}:${KERNEL_XYZ}",
        "registry.example/kmm/driver-toolkit:v$KERNEL_X.$KERNEL_Y",
        "registry.example/kmm/driver-toolkit@sha256:" + "a" * 64,
    ],
)
def test_a_template_a_containerimage_could_be_is_accepted(template: str) -> None:
    toolkit.check_template(template)
    assert build_settings.Settings(driver_toolkit_image=template).driver_toolkit_image == template


@pytest.mark.parametrize(
    ("template", "why"),
    [
        ("registry.example/kmm/driver-toolkit", "explicit tag"),
        ("registry.example/kmm/driver-toolkit:${KERNEL}", "unknown variable 'KERNEL'"),
        ("Registry.Example/KMM/dtk:${KERNEL_FULL_VERSION}", "image"),
    ],
)
def test_a_bad_template_is_refused_naming_the_flag(template: str, why: str) -> None:
    with pytest.raises(ValueError, match=r"^--driver-toolkit-image: ") as caught:
        toolkit.check_template(template)
    assert why in str(caught.value)
    with pytest.raises(ValueError, match="--driver-toolkit-image"):
        build_settings.Settings(driver_toolkit_image=template)


# -- the value: when, and what -------------------------------------------------


def test_the_template_expands_as_a_containerimage_tag_safe() -> None:
    assert _value(TEMPLATE) == "10.253.0.1:5000/kmm/driver-toolkit:6.12.57_deb12-amd64"
    template = "r.io/${MOD_NAMESPACE}/${MOD_NAME}-dtk:$KERNEL_XYZ-x$KERNEL_X"
    assert _value(template, kernel="6.1.0-27-amd64") == "r.io/ns/m-dtk:6.1.0-x6"


def test_only_a_dockerfile_that_mentions_it_gets_it() -> None:
    assert _value(TEMPLATE, "FROM debian:bookworm\nRUN make\n") is None
    # KMM's own test is a substring: a mention anywhere passes it.
    assert _value(TEMPLATE, "FROM debian:bookworm\n# see DTK_AUTO\n") is not None
    no_build = dataclasses.replace(_target(), build=None)
    assert toolkit.value(TEMPLATE, no_build, module="m", namespace="ns", dockerfile=DOCKERFILE) is None  # fmt: skip


def test_the_users_build_arg_wins_and_is_not_given_twice() -> None:
    assert _value(TEMPLATE, args=(("DTK_AUTO", "mine:1"),)) is None
    assert _value("", args=(("DTK_AUTO", "mine:1"),)) is None  # needed, and the user gives it
    params = podparts.PodParams(
        module="m", namespace="ns", kernel=DEBIAN, image="r.io/m:1", builder_image="b:1",
        owner={}, driver_toolkit="operators:1",
    )  # fmt: skip
    build = _target(args=(("A", "1"), ("DTK_AUTO", "mine:1"))).build
    assert build is not None
    found = podparts.build_args(params, build)
    assert [v for k, v in found if k == "DTK_AUTO"] == ["mine:1"]


@pytest.mark.parametrize(
    ("dockerfile", "needed"),
    [
        (DOCKERFILE, True),
        ("arg DTK_AUTO\nFROM ${DTK_AUTO}\n", True),  # instructions are case-insensitive
        ("ARG KVER DTK_AUTO\nFROM ${DTK_AUTO}\n", True),
        ("ARG KVER \\\n    DTK_AUTO\nFROM ${DTK_AUTO}\n", True),  # a continued line
        ("ARG DTK_AUTO=debian:bookworm\nFROM ${DTK_AUTO}\n", False),
        ("ARG DTK_AUTO=debian:bookworm\nFROM ${DTK_AUTO}\nARG DTK_AUTO\n", False),
        ("FROM debian:bookworm\n# DTK_AUTO is OpenShift's\n", False),  # mentioned, not declared
        ("ARG DTK_AUTO_X\nFROM ${DTK_AUTO_X}\n", False),
    ],
)
def test_without_a_template_a_build_that_needs_it_fails_naming_the_flag(
    dockerfile: str, needed: bool
) -> None:
    assert toolkit.required(dockerfile) is needed
    if not needed:
        assert _value("", dockerfile) is None
        return
    with pytest.raises(toolkit.ToolkitError) as caught:
        _value("", dockerfile)
    message = str(caught.value)
    assert "ARG DTK_AUTO without a default" in message
    assert "--driver-toolkit-image TEMPLATE" in message
    assert "buildArgs" in message


def test_a_template_that_gives_a_kernel_no_image_fails_that_kernel() -> None:
    template = "r.io/dtk:${KERNEL_XYZ}"
    assert _value(template, kernel="6.1.0-27-amd64") == "r.io/dtk:6.1.0"
    # KERNEL_Z of Debian's 6.12.57+deb12-amd64 is "57+deb12": no tag may hold a '+'.
    with pytest.raises(toolkit.ToolkitError, match=r"--driver-toolkit-image .* this kernel"):
        _value(template)


# -- the build pod, its hash, the image's hash ---------------------------------


def _dtk_inputs(dockerfile: str = DOCKERFILE) -> build_inputs.Snapshot:
    return dataclasses.replace(cases.INPUTS, dockerfiles={"dockerfile": dockerfile})


def _build_pod(settings: build_settings.Settings, inputs: build_inputs.Snapshot) -> Obj:
    facts = {cases.K1: images.Facts(cases.MISSING), cases.K2: images.Facts(cases.EXISTS)}
    (creation,) = cases._plan(
        cases._view(cases._raw(sign=False)), facts, inputs=inputs, settings=settings
    ).create
    return creation.pod


def _build_args(pod: Obj) -> list[str]:
    (container,) = pod["spec"]["containers"]
    return [arg for arg in container["command"] if arg.startswith("--build-arg=")]


def test_the_build_pod_gets_dtk_auto_of_its_kernel_after_kmms_args() -> None:
    args = _build_args(_build_pod(WITH, _dtk_inputs()))
    assert args[-1] == f"--build-arg=DTK_AUTO=10.253.0.1:5000/kmm/driver-toolkit:{cases.K1}"
    assert args[-2] == "--build-arg=MOD_NAMESPACE=ns"
    assert [a for a in args if a.startswith("--build-arg=DTK_AUTO=")] == [args[-1]]


def _wanted(settings: build_settings.Settings, inputs: build_inputs.Snapshot) -> images.Wanted:
    view = cases._view(cases._raw(sign=False))
    target = loader_planner.grouping(view).targets[cases.K1]
    found = desired.wanted(view.module, target, inputs, settings)
    assert found is not None
    return found


def test_a_changed_template_changes_the_pods_and_the_images_hash() -> None:
    other = dataclasses.replace(WITH, driver_toolkit_image="r.io/other-dtk:${KERNEL_FULL_VERSION}")
    before, after = _build_pod(WITH, _dtk_inputs()), _build_pod(other, _dtk_inputs())
    assert hashing.of_pod(before) != hashing.of_pod(after)
    # The image carries its build's hash: one built with the old template is outdated.
    assert _wanted(WITH, _dtk_inputs()).build != _wanted(other, _dtk_inputs()).build
    running = cases._running(before)
    facts = {cases.K1: images.Facts(cases.MISSING), cases.K2: images.Facts(cases.EXISTS)}
    found = cases._plan(
        cases._view(cases._raw(sign=False), [running]), facts, inputs=_dtk_inputs(), settings=other
    )
    assert found.delete == [running]  # replaced: it would push an image of the old toolkit


def test_a_build_that_does_not_use_it_is_the_same_with_or_without_a_template() -> None:
    plain = cases.INPUTS  # FROM scratch
    assert _build_pod(WITH, plain) == _build_pod(cases.SETTINGS, plain)
    assert _wanted(WITH, plain) == _wanted(cases.SETTINGS, plain)


def test_a_build_that_needs_it_without_a_template_is_build_failed_without_a_pod() -> None:
    facts = {cases.K1: images.Facts(cases.MISSING), cases.K2: images.Facts(cases.EXISTS)}
    view = cases._view(cases._raw(sign=False))
    found = cases._plan(view, facts, inputs=_dtk_inputs(), settings=cases.SETTINGS)
    assert found.create == []
    assert found.gated == {cases.K1}
    (problem,) = found.problems
    assert problem.reason == "BuildFailed"
    assert problem.message.startswith(f"build for kernel {cases.K1}: the Dockerfile declares")
    assert "--driver-toolkit-image" in problem.message
    (event,) = found.events
    assert (event.type, event.reason) == ("Warning", "BuildFailed")
    assert {i.kernel: i.state for i in found.images}[cases.K1] == "BuildFailed"
    assert found.requeue_after == cases.SETTINGS.poll
    # With the flag (an operator restarted with it), the build goes ahead.
    (creation,) = cases._plan(view, facts, inputs=_dtk_inputs(), settings=WITH).create
    assert _build_args(creation.pod)[-1].startswith("--build-arg=DTK_AUTO=")


def test_a_sign_after_a_build_that_can_no_longer_get_it_says_why() -> None:
    raw = cases._raw()
    view = cases._view(raw)
    target = loader_planner.grouping(view).targets[cases.K1]
    pod, why = desired.module_pod(view.module, target, "sign", _dtk_inputs(), cases.SETTINGS)
    assert pod is None
    (reason,) = why
    assert "--driver-toolkit-image" in reason
