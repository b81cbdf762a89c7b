"""Names (DESIGN §4): exact keys, the 63-character budget, DaemonSet names."""

from __future__ import annotations

import copy
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kmm.api import examples, labels, validation


def test_exact_names() -> None:
    ns, name = "ns", "mod"
    assert labels.ready(ns, name) == "kmm.node.kubernetes.io/ns.mod.ready"
    assert labels.dra_target(ns, name) == "kmm.node.kubernetes.io/ns.mod.dra-target"
    assert labels.device_plugin_ready(ns, name) == (
        "kmm.node.kubernetes.io/ns.mod.device-plugin-ready"
    )
    assert labels.dra_ready(ns, name) == "kmm.node.kubernetes.io/ns.mod.dra-ready"
    assert labels.module_version(ns, name) == "kmm.node.kubernetes.io/version-module.ns.mod"
    assert labels.module_loader_version(ns, name) == (
        "beta.kmm.node.kubernetes.io/version-module-loader.ns.mod"
    )
    assert labels.device_plugin_version(ns, name) == (
        "beta.kmm.node.kubernetes.io/version-device-plugin.ns.mod"
    )
    assert labels.KERNEL_VERSION_FULL == "kmm.node.kubernetes.io/kernel-version.full"
    assert labels.MODULE_NAME == "kmm.node.kubernetes.io/module.name"
    assert labels.MODULE_NAMESPACE == "kmm.node.kubernetes.io/module.namespace"
    assert labels.ROLE == "kmm.node.kubernetes.io/role"
    assert labels.FINALIZER == "kmm.node.kubernetes.io/module-finalizer"
    assert labels.module_labels(ns, name, "dra") == {
        labels.MODULE_NAME: name,
        labels.MODULE_NAMESPACE: ns,
        labels.ROLE: "dra",
    }


def test_budget_comes_from_the_longest_derived_label() -> None:
    longest = max(len(key.split("/", 1)[1]) for key in labels.node_label_keys("", ""))
    # "<ns>.<name>" adds len(ns) + len(name); the "." is already in the keys above.
    assert labels.MAX_NAME_AND_NAMESPACE == labels.MAX_LABEL_NAME - longest == 40


@pytest.mark.parametrize(
    ("text", "valid"),
    [
        ("5.14.0-70.el9.x86_64", "5.14.0-70.el9.x86_64"),
        ("6.8.0+local", "6.8.0_local"),
        ("", ""),
    ],
)
def test_label_value(text: str, valid: str) -> None:
    assert labels.label_value(text) == valid


_DNS_LABEL = r"[a-z0-9]([-a-z0-9]{0,18}[a-z0-9])?"
_names = st.from_regex(rf"\A{_DNS_LABEL}(\.{_DNS_LABEL})?\Z")
_namespaces = st.from_regex(rf"\A{_DNS_LABEL}\Z")


@settings(deadline=None, max_examples=300)
@given(namespace=_namespaces, name=_names)
def test_accepted_modules_have_valid_derived_labels(namespace: str, name: str) -> None:
    obj = copy.deepcopy(examples.module(name=name, namespace=namespace))
    try:
        validation.parse_module(obj)
    except validation.InvalidModuleError:
        assert len(namespace) + len(name) > labels.MAX_NAME_AND_NAMESPACE
        return
    for key in labels.node_label_keys(namespace, name):
        assert labels.is_label_key(key), key
        assert len(key.split("/", 1)[1]) <= 63
    assert all(
        labels.is_label_value(v) for v in labels.module_labels(namespace, name, "dra").values()
    )


_DS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


@settings(deadline=None, max_examples=300)
@given(
    name=st.from_regex(r"\A[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?\Z"),
    role=st.sampled_from(["module-loader", "device-plugin", "dra"]),
    parts=st.lists(st.text(max_size=80), max_size=2),
)
def test_daemonset_names_fit(name: str, role: labels.Role, parts: list[str]) -> None:
    ds = labels.daemonset_name(name, role, *parts)
    assert len(ds) <= 63
    assert _DS_NAME.match(ds), ds
    assert labels.daemonset_name(name, role, *parts) == ds


def test_daemonset_names_differ_per_kernel() -> None:
    names = {labels.daemonset_name("m", "module-loader", k) for k in ("5.14.0", "6.8.0", "6.8.1")}
    assert len(names) == 3


@settings(deadline=None, max_examples=300)
@given(text=st.text(max_size=120))
def test_label_value_is_always_valid_and_stable(text: str) -> None:
    value = labels.label_value(text)
    assert labels.is_label_value(value)
    assert labels.label_value(text) == value
    assert labels.is_label_value(labels.image_hash(text))
