"""The merge of ``build`` and ``sign`` for one kernel (kernels.Target), plus properties."""

from __future__ import annotations

import ast
import copy
from typing import Any

import pytest
import re2  # type: ignore[import-untyped]
from hypothesis import given, settings
from hypothesis import strategies as st

from kmm.api import buildsign, crd, kernels, validation

Obj = dict[str, Any]


def _container(obj: Obj) -> Obj:
    found: Obj = obj["spec"]["moduleLoader"]["container"]
    return found


def _target(obj: Obj, kernel: str) -> kernels.Target:
    found = kernels.target(validation.parse_module(obj), kernel)
    assert found is not None
    return found


def test_mapping_adds_to_the_containers_build_and_sign(build_sign: Obj) -> None:
    found = _target(build_sign, "6.1.0-27-amd64")
    assert found.image == "registry.example:5000/drivers/kmod-built:6.1.0-27-amd64"
    assert found.build == kernels.BuildTarget(
        dockerfile_config_map="kmod-dockerfile",
        # By name, the mapping's value wins; the container's order, then new names.
        build_args=(("VARIANT", "debian"), ("JOBS", "2"), ("EXTRA", "")),
        # The container's, then the mapping's, each once.
        secrets=("git-token", "apt-mirror"),
        # The mapping's {} sets nothing: the container's stands.
        base_image_registry_tls=buildsign.RegistryTLS(insecure_skip_tls_verify=True),
        # The mapping's wins (KMM would drop it beside the container's build).
        selector=(("builder", "debian"),),
    )
    assert found.sign == kernels.SignTarget(
        unsigned_image=None,
        # The mapping's wins (KMM would drop it beside the container's sign).
        unsigned_image_registry_tls=buildsign.RegistryTLS(insecure=True),
        key_secret="signing-key",
        cert_secret="signing-cert",
        # Appended, expanded, each once.
        files_to_sign=(
            "/opt/lib/modules/6.1.0-27-amd64/kmod_a.ko",
            "/opt/lib/modules/6.1.0-27-amd64/kmod_b?.ko",
        ),
    )
    assert found.registry_tls == buildsign.RegistryTLS(insecure=True)


def test_a_mapping_without_its_own_takes_the_containers(build_sign: Obj) -> None:
    found = _target(build_sign, "6.8.0-45-generic+")
    assert found.build == kernels.BuildTarget(
        dockerfile_config_map="kmod-dockerfile",
        build_args=(("VARIANT", "base"), ("JOBS", "2")),
        secrets=("git-token",),
        base_image_registry_tls=buildsign.RegistryTLS(insecure_skip_tls_verify=True),
        selector=(("builder", "true"),),
    )
    assert found.sign is not None
    assert found.sign.files_to_sign == ("/opt/lib/modules/6.8.0-45-generic/kmod_a.ko",)
    assert found.sign.unsigned_image_registry_tls is None


def test_no_build_or_sign_anywhere_gives_none(upstream_style: Obj) -> None:
    found = _target(upstream_style, "6.0.15-300.fc37.x86_64")
    assert (found.build, found.sign) == (None, None)
    # Both levels carry an empty-in-effect registryTLS ({insecure: false} sets one).
    assert found.registry_tls == buildsign.RegistryTLS(
        insecure=False, insecure_skip_tls_verify=False
    )


def test_mapping_values_replace_the_containers(build_sign: Obj) -> None:
    mapping = _container(build_sign)["kernelMappings"][0]
    mapping["build"]["dockerfileConfigMap"] = {"name": "debian-dockerfile"}
    mapping["build"]["baseImageRegistryTLS"] = {"insecure": False}
    mapping["sign"].update(keySecret={"name": "k2"}, certSecret={"name": "c2"})
    mapping["registryTLS"] = {"insecureSkipTLSVerify": True}
    found = _target(build_sign, "6.1.0-27-amd64")
    assert found.build is not None
    assert found.build.dockerfile_config_map == "debian-dockerfile"
    assert found.build.base_image_registry_tls == buildsign.RegistryTLS(insecure=False)
    assert found.sign is not None
    assert (found.sign.key_secret, found.sign.cert_secret) == ("k2", "c2")
    assert found.registry_tls == buildsign.RegistryTLS(insecure_skip_tls_verify=True)


def test_mapping_level_only(build_sign: Obj) -> None:
    container = _container(build_sign)
    build, sign = container.pop("build"), container.pop("sign")
    del container["registryTLS"]
    container["kernelMappings"][1].update(build=build, sign=sign)
    # The first mapping's own build and sign are incomplete alone...
    with pytest.raises(validation.InvalidModuleError, match=r"kernelMappings \[0\]: build\."):
        validation.parse_module(build_sign)
    first = container["kernelMappings"][0]
    first["build"]["dockerfileConfigMap"] = {"name": "debian-dockerfile"}
    first["sign"].update(keySecret={"name": "k"}, certSecret={"name": "c"})
    # ...and do not reach the second mapping's kernels.
    found = _target(build_sign, "6.1.0-27-amd64")
    assert found.build is not None
    assert found.build.secrets == ("apt-mirror", "git-token")
    found = _target(build_sign, "5.14.0-427.el9.x86_64")
    assert found.build is not None
    assert found.build.selector == (("builder", "true"),)
    assert found.sign is not None
    assert found.sign.files_to_sign == ("/opt/lib/modules/5.14.0-427.el9.x86_64/kmod_a.ko",)
    assert found.registry_tls is None


def test_sign_without_build_expands_the_unsigned_image(build_sign: Obj) -> None:
    container = _container(build_sign)
    del container["build"]
    del container["kernelMappings"][0]["build"]
    container["sign"]["unsignedImage"] = "registry.example:5000/${MOD_NAME}-unsigned:${KERNEL_XYZ}"
    found = _target(build_sign, "6.8.0-45-generic")
    assert found.build is None
    assert found.sign is not None
    assert found.sign.unsigned_image == "registry.example:5000/kmod-built-unsigned:6.8.0"


def test_an_unsigned_image_that_expands_to_the_final_one_is_refused(build_sign: Obj) -> None:
    """Admission compares them as written; written apart, they may still meet."""
    container = _container(build_sign)
    del container["build"]
    del container["kernelMappings"][0]["build"]
    container["sign"]["unsignedImage"] = (
        "registry.example:5000/drivers/$MOD_NAME:$KERNEL_FULL_VERSION"
    )
    module = validation.parse_module(build_sign)
    with pytest.raises(kernels.KernelMappingError, match=r"are both 'registry\.example:5000/"):
        kernels.target(module, "6.8.0-45-generic")


def test_an_unsigned_image_that_expands_invalid_is_refused_naming_the_kernel(
    build_sign: Obj,
) -> None:
    _container(build_sign)["sign"]["unsignedImage"] = "r/x:${KERNEL_Z}"
    with pytest.raises(kernels.KernelMappingError, match=r"kernel '6\.8\.0\+rt'.*unsignedImage"):
        _target(build_sign, "6.8.0+rt")


def test_group_nodes_carries_build_and_sign(build_sign: Obj) -> None:
    grouping = kernels.group_nodes(
        validation.parse_module(build_sign), [("a", "6.1.0-27-amd64"), ("b", "6.8.0-45-generic")]
    )
    assert all(t.build is not None and t.sign is not None for t in grouping.targets.values())


def _build_arg(name: str, value: str) -> buildsign.BuildArg:
    return buildsign.BuildArg(name=name, value=value)


_names = st.sampled_from(["A", "B", "C", "D"])
_args = st.lists(st.tuples(_names, st.sampled_from(["0", "1", ""])), max_size=5)
_secrets = st.lists(st.sampled_from(["s1", "s2", "s3"]), max_size=4)


@settings(deadline=None, max_examples=200)
@given(
    container_args=_args,
    mapping_args=_args,
    container_secrets=_secrets,
    mapping_secrets=_secrets,
)
def test_build_args_merge_by_name_and_secrets_append_once(
    container_args: list[tuple[str, str]],
    mapping_args: list[tuple[str, str]],
    container_secrets: list[str],
    mapping_secrets: list[str],
) -> None:
    obj: Obj = copy.deepcopy(_MINIMAL)
    container = _container(obj)
    container["build"]["buildArgs"] = [{"name": n, "value": v} for n, v in container_args]
    container["build"]["secrets"] = [{"name": n} for n in container_secrets]
    container["kernelMappings"][0]["build"] = {
        "buildArgs": [{"name": n, "value": v} for n, v in mapping_args],
        "secrets": [{"name": n} for n in mapping_secrets],
    }
    found = _target(obj, "6.1.0-27-amd64").build
    assert found is not None
    # Every name once; its value the last the mapping gives, else the container's last.
    assert dict(found.build_args) == dict(container_args) | dict(mapping_args)
    assert [name for name, _ in found.build_args] == list(
        dict.fromkeys([n for n, _ in container_args] + [n for n, _ in mapping_args])
    )
    assert found.secrets == tuple(dict.fromkeys(container_secrets + mapping_secrets))


_files = st.lists(
    st.sampled_from(["/opt/a.ko", "/opt/${KERNEL_XYZ}/b.ko", "/opt/$KERNEL_FULL_VERSION/*.ko"]),
    max_size=4,
)


@settings(deadline=None, max_examples=200)
@given(container_files=_files, mapping_files=_files)
def test_files_to_sign_append_expanded_once(
    container_files: list[str], mapping_files: list[str]
) -> None:
    obj: Obj = copy.deepcopy(_MINIMAL)
    container = _container(obj)
    del container["build"]
    container["sign"] = {
        "keySecret": {"name": "k"},
        "certSecret": {"name": "c"},
        "unsignedImage": "r/u:1",
        **({"filesToSign": container_files} if container_files else {}),
    }
    if mapping_files:
        container["kernelMappings"][0]["sign"] = {"filesToSign": mapping_files}
    if not container_files + mapping_files:
        with pytest.raises(validation.InvalidModuleError, match="filesToSign is required"):
            validation.parse_module(obj)
        return
    found = _target(obj, "6.1.0-27+x").sign
    assert found is not None
    values = kernels.variables("6.1.0-27+x", module_name="m", module_namespace="ns")
    values["KERNEL_FULL_VERSION"] = "6.1.0-27+x"  # a path, not a tag: the kernel as written
    expanded = [kernels.expand(f, values) for f in container_files + mapping_files]
    assert found.files_to_sign == tuple(dict.fromkeys(expanded))
    assert not any("$" in f for f in found.files_to_sign)


_MINIMAL: Obj = {
    "apiVersion": "kmm.sigs.x-k8s.io/v1beta1",
    "kind": "Module",
    "metadata": {"name": "m", "namespace": "ns"},
    "spec": {
        "selector": {},
        "moduleLoader": {
            "container": {
                "modprobe": {"moduleName": "m"},
                "containerImage": "r/m:${KERNEL_FULL_VERSION}",
                "build": {"dockerfileConfigMap": {"name": "d"}},
                "kernelMappings": [{"regexp": "^6\\."}],
            }
        },
    },
}


def _file_variables_rule() -> str:
    """The CEL rule the CRD carries for each filesToSign entry: its RE2 pattern."""
    schema = crd.render()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    container = schema["properties"]["spec"]["properties"]["moduleLoader"]["properties"][
        "container"
    ]
    entry = container["properties"]["sign"]["properties"]["filesToSign"]["items"]
    [rule] = [r["rule"] for r in entry["x-kubernetes-validations"] if "'$'" in r["message"]]
    prefix = "self.matches("
    assert rule.startswith(prefix)
    assert rule.endswith(")")
    pattern: str = ast.literal_eval(rule[len(prefix) : -1])
    return pattern


_FILE_PATTERN = _file_variables_rule()
_pieces = st.sampled_from(
    ["$", "{", "}", "/opt/", "a", "_", "1", "*", "KERNEL_X", "KERNEL_XYZ", "MOD_NAME", "NOPE"]
)


@settings(deadline=None, max_examples=300)
@given(pieces=st.lists(_pieces, min_size=1, max_size=8))
def test_file_variables_judged_alike_by_cel_and_python_and_accepted_ones_expand(
    pieces: list[str],
) -> None:
    path = "/opt/" + "".join(pieces)
    obj: Obj = copy.deepcopy(_MINIMAL)
    container = _container(obj)
    del container["build"]
    container["sign"] = {
        "keySecret": {"name": "k"},
        "certSecret": {"name": "c"},
        "unsignedImage": "r/u:1",
        "filesToSign": [path],
    }
    cel_accepts = re2.search(_FILE_PATTERN, path) is not None
    if ".." in path.split("/"):
        return
    try:
        module = validation.parse_module(obj)
    except validation.InvalidModuleError:
        python_accepts = False
    else:
        python_accepts = True
    assert python_accepts == cel_accepts, path
    if not python_accepts:
        return
    # What admission lets through, the merge expands without leaving a variable.
    found = kernels.target(module, "6.1.0-27-amd64")
    assert found is not None
    assert found.sign is not None
    assert not any("$" in f for f in found.sign.files_to_sign)


def test_files_to_sign_name_the_kernel_as_the_build_arg_gives_it() -> None:
    """A Debian kernel's '+' is kept in paths (the build copies its modules
    under ``$KERNEL_FULL_VERSION`` as the build arg has it), while the image
    tag takes the tag-safe form."""
    obj: Obj = copy.deepcopy(_MINIMAL)
    container = _container(obj)
    container["containerImage"] = "r/m:${KERNEL_FULL_VERSION}"
    container["sign"] = {
        "keySecret": {"name": "k"},
        "certSecret": {"name": "c"},
        "filesToSign": ["/opt/lib/modules/${KERNEL_FULL_VERSION}/kmm_ci_a.ko"],
    }
    found = _target(obj, "6.12.118+deb13-amd64")
    assert found.image == "r/m:6.12.118_deb13-amd64"
    assert found.sign is not None
    assert found.sign.files_to_sign == ("/opt/lib/modules/6.12.118+deb13-amd64/kmm_ci_a.ko",)
