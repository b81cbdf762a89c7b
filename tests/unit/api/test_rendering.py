"""The rendered CRD and admission policy: committed copies, structure, pruning."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterator
from typing import Any

import crdpruning
import pytest
import yaml
from typer.testing import CliRunner

from kmm.api import admission, chart, crd, examples, installation, labels, manifests, preflight
from kmm.cli import app

DEPLOY = pathlib.Path(__file__).resolve().parents[3] / "deploy"

Schema = dict[str, Any]


@pytest.mark.parametrize("path", sorted(manifests.FILES))
def test_committed_file_equals_rendering(path: str) -> None:
    committed = (DEPLOY / path).read_text()
    assert committed == manifests.files()[path], (
        f"deploy/{path} is stale: regenerate it from kmm.api.manifests.files()"
    )


def _printed(*args: str) -> list[dict[str, Any]]:
    result = CliRunner().invoke(app, ["manifests", *args])
    assert result.exit_code == 0, result.output
    return list(yaml.safe_load_all(result.output))


def _committed(*, examples: bool) -> list[dict[str, Any]]:
    # The Helm chart is Go templates, not manifests (test_chart.py checks it).
    return [
        document
        for path in sorted(DEPLOY.rglob("*.yaml"))
        if not path.is_relative_to(DEPLOY / chart.DIRECTORY)
        and (str(path.relative_to(DEPLOY)) in manifests.EXAMPLES) == examples
        for document in yaml.safe_load_all(path.read_text())
    ]


def test_cli_prints_the_install_and_no_example() -> None:
    """What ``kmm manifests | kubectl apply -f -`` puts into a user's cluster:
    kmm itself, not three demo Modules, a Pod and a ResourceClaimTemplate."""
    printed = _printed()
    key = json.dumps
    assert sorted(map(key, printed)) == sorted(map(key, _committed(examples=False)))
    kinds = [document["kind"] for document in printed]
    assert not {"Module", "Pod", "ResourceClaimTemplate"} & set(kinds)
    # Only kmm's own accounts: not the DRA example's driver account.
    assert [d["metadata"]["name"] for d in printed if d["kind"] == "ServiceAccount"] == [
        installation.SERVICE_ACCOUNT
    ]
    # Apply order: what later documents need comes first.
    assert kinds[:3] == ["Namespace", "ServiceAccount", "CustomResourceDefinition"]
    assert kinds[-1] == "Deployment"


def test_cli_prints_the_examples_on_request_and_nothing_else() -> None:
    printed = _printed("--examples")
    key = json.dumps
    assert sorted(map(key, printed)) == sorted(map(key, _committed(examples=True)))
    kinds = [document["kind"] for document in printed]
    assert not {"Namespace", "CustomResourceDefinition", "Deployment"} & set(kinds)
    # The DRA example's account before its Module, a workload after its template.
    names = [(d["kind"], d["metadata"]["name"]) for d in printed]
    dra_module = names.index(("Module", "kmm-dra-demo"))
    assert names.index(("ServiceAccount", "kmm-dra-driver")) < dra_module
    assert names.index(("ClusterRoleBinding", "kmm-dra-driver-default")) < dra_module
    assert kinds.index("ResourceClaimTemplate") < kinds.index("Pod")


def test_install_and_examples_are_everything_in_deploy() -> None:
    assert set(manifests.FILES) >= manifests.EXAMPLES
    both = manifests.documents() + manifests.documents(examples=True)
    assert len(both) == sum(len(build()) for build in manifests.FILES.values())


def _root(definition: Schema | None = None) -> Schema:
    """The schema of a rendered CRD (the Module's unless given)."""
    schema: Schema = (definition or crd.render())["spec"]["versions"][0]["schema"][
        "openAPIV3Schema"
    ]
    return schema


_EVERY_CRD = pytest.mark.parametrize(
    "definition",
    [pytest.param(d, id=d["spec"]["names"]["kind"]) for d in crd.render_all()],
)


def _walk(schema: Schema, path: str = "") -> Iterator[tuple[str, Schema]]:
    yield path, schema
    for name, child in schema.get("properties", {}).items():
        yield from _walk(child, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from _walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _walk(schema["additionalProperties"], f"{path}{{}}")


_FORBIDDEN = {"$ref", "anyOf", "allOf", "oneOf", "not", "definitions", "$defs", "nullable"}


@_EVERY_CRD
def test_schema_is_structural(definition: Schema) -> None:
    for path, node in _walk(_root(definition)):
        assert "type" in node, f"{path} has no type"
        assert not _FORBIDDEN & node.keys(), f"{path} uses {_FORBIDDEN & node.keys()}"
        if "properties" in node:
            assert "additionalProperties" not in node, f"{path}: properties + additionalProperties"
        if node["type"] == "array":
            assert "items" in node, f"{path}: array without items"
        for rule in node.get("x-kubernetes-validations", ()):
            assert rule["message"], f"{path}: rule without message"


@_EVERY_CRD
def test_rules_are_cost_bounded(definition: Schema) -> None:
    """Strings and lists a CEL rule reads carry maxLength / maxItems."""
    for path, node in _walk(_root(definition)):
        rules = " ".join(r["rule"] for r in node.get("x-kubernetes-validations", ()))
        if not rules:
            continue
        if node["type"] == "string":
            assert "maxLength" in node, path
        for name, child in node.get("properties", {}).items():
            if f"self.{name}.all(" in rules or f"self.{name}[" in rules:
                assert "maxItems" in child, f"{path}.{name}"


def test_build_and_sign_are_declared_at_both_levels() -> None:
    """Typed objects now (no longer preserve-unknown placeholders refused by a rule)."""
    found = {}
    for path, node in _walk(_root()):
        for field in ("build", "sign"):
            if field in node.get("properties", {}):
                found[f"{path}.{field}"] = node["properties"][field]
    assert sorted(found) == [
        ".spec.moduleLoader.container.build",
        ".spec.moduleLoader.container.kernelMappings[].build",
        ".spec.moduleLoader.container.kernelMappings[].sign",
        ".spec.moduleLoader.container.sign",
    ]
    for path, schema in found.items():
        assert "x-kubernetes-preserve-unknown-fields" not in schema, path
        if path.endswith(".build"):
            assert set(schema["properties"]) == {
                "buildArgs",
                "dockerfileConfigMap",
                "baseImageRegistryTLS",
                "secrets",
                "kanikoParams",
                "selector",
            }
            assert schema["properties"]["buildArgs"]["items"]["required"] == ["name", "value"]
        else:
            assert set(schema["properties"]) == {
                "unsignedImage",
                "unsignedImageRegistryTLS",
                "keySecret",
                "certSecret",
                "filesToSign",
            }
            assert schema["properties"]["filesToSign"]["minItems"] == 1
    container = _root()["properties"]["spec"]["properties"]["moduleLoader"]["properties"][
        "container"
    ]
    messages = [r["message"] for r in container["x-kubernetes-validations"]]
    for required in ("dockerfileConfigMap", "keySecret", "certSecret", "filesToSign"):
        assert any(f".{required} is required for every kernel mapping" in m for m in messages)
    assert any("sign without build needs sign.unsignedImage" in m for m in messages)
    assert any("containerImage must name a tag, not a digest" in m for m in messages)
    assert sum("must lie under modprobe.dirName" in m for m in messages) == 2


def test_image_rebuild_trigger_generation_in_spec_and_status() -> None:
    properties = _root()["properties"]
    for part in ("spec", "status"):
        assert properties[part]["properties"]["imageRebuildTriggerGeneration"]["type"] == "integer"


def test_cross_field_rules_are_present() -> None:
    rules = {
        r["rule"]
        for _path, node in _walk(_root())
        for r in node.get("x-kubernetes-validations", ())
    }
    assert "has(self.literal) != has(self.regexp)" in rules
    assert "!(has(self.dra) && has(self.devicePlugin))" in rules
    assert any("modulesLoadingOrder[0] == self.moduleName" in r for r in rules)
    assert any(r.startswith("self.matches('^[^\\\\s@]") for r in rules)


def test_registry_tls_is_explained_as_governing_kmms_requests_not_node_pulls() -> None:
    """What ``kubectl explain`` shows for every registryTLS field."""
    found = {
        path: node["description"] for path, node in _walk(_root()) if path.endswith(".registryTLS")
    }
    assert sorted(found) == [
        ".spec.moduleLoader.container.kernelMappings[].registryTLS",
        ".spec.moduleLoader.container.registryTLS",
    ]
    for text in found.values():
        assert "kmm's own registry requests (the operator's image existence checks)" in text
        assert "build and sign pods' pulls and pushes" in text
        assert "nodes pull images as their container runtime's registry configuration says" in text
    tls_fields = [
        path for path, _ in _walk(_root()) if path.endswith(("RegistryTLS", ".registryTLS"))
    ]
    assert len(tls_fields) == 6  # and baseImageRegistryTLS, unsignedImageRegistryTLS at both levels


def test_every_crd_is_in_deploy_and_the_module_crd_is_unchanged_by_generalising() -> None:
    rendered = {d["metadata"]["name"]: d for d in crd.render_all()}
    assert list(rendered) == [crd.NAME, crd.PREFLIGHT_NAME]
    assert rendered[crd.NAME] == crd.render()
    assert rendered[crd.PREFLIGHT_NAME] == crd.render_preflight()
    for name, definition in rendered.items():
        assert manifests.FILES[f"crd/{name}.yaml"]() == [definition]


def test_preflight_crd_is_cluster_scoped_v1beta2_only_with_its_short_name() -> None:
    spec = crd.render_preflight()["spec"]
    assert spec["group"] == preflight.GROUP
    assert spec["scope"] == "Cluster"
    assert spec["names"] == {
        "kind": "PreflightValidation",
        "listKind": "PreflightValidationList",
        "plural": "preflightvalidations",
        "singular": "preflightvalidation",
        "shortNames": ["pfv"],
    }
    (version,) = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1beta2", True, True)
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns == {
        "Kernel": ".spec.kernelVersion",
        "Push": ".spec.pushBuiltImage",
        "Age": ".metadata.creationTimestamp",
    }


def test_preflight_schema_defaults_push_and_keys_verdicts_by_namespace_and_name() -> None:
    root = _root(crd.render_preflight())
    assert root["required"] == ["spec"]
    spec = root["properties"]["spec"]
    assert spec["required"] == ["kernelVersion"]
    assert spec["properties"]["pushBuiltImage"] == {"type": "boolean", "default": False}
    kernel = spec["properties"]["kernelVersion"]
    assert kernel["maxLength"] == preflight.MAX_KERNEL_VERSION
    assert [r["message"] for r in kernel["x-kubernetes-validations"]] == [
        "must split into at least three parts on '.', ',' or '-' (e.g. 6.1.0-27-amd64)",
        "may not contain whitespace",
    ]
    status = root["properties"]["status"]["properties"]
    assert status["observedGeneration"]["type"] == "integer"
    verdicts = status["modules"]
    assert verdicts["x-kubernetes-list-type"] == "map"
    assert verdicts["x-kubernetes-list-map-keys"] == ["namespace", "name"]
    item = verdicts["items"]
    # List-map keys must be required (or defaulted) for the apiserver to take the CRD.
    assert {"namespace", "name"} <= set(item["required"])
    assert set(item["properties"]) == {
        "name",
        "namespace",
        "verificationStatus",
        "verificationStage",
        "statusReason",
        "lastTransitionTime",
        "image",
        "pod",
    }
    assert item["properties"]["verificationStatus"]["enum"] == ["Success", "Failure", "InProgress"]
    assert item["properties"]["verificationStage"]["enum"] == ["Image", "Done"]
    assert item["properties"]["lastTransitionTime"]["format"] == "date-time"


def test_status_subresource_and_columns() -> None:
    version = crd.render()["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    assert {c["name"] for c in version["additionalPrinterColumns"]} >= {"Ready", "Age"}
    status = _root()["properties"]["status"]["properties"]
    assert set(status["dra"]["properties"]) == {
        "nodesMatchingSelectorNumber",
        "desiredNumber",
        "availableNumber",
        "versions",
    }
    per_version = status["moduleLoader"]["properties"]["versions"]
    assert per_version["x-kubernetes-list-map-keys"] == ["version"]
    assert set(per_version["items"]["properties"]) == {
        "version",
        "desiredNumber",
        "availableNumber",
    }


def test_nothing_in_kmm_manifests_is_pruned(
    upstream_style: dict[str, Any], build_sign: dict[str, Any]
) -> None:
    # metadata is the apiserver's own business; spec is what pruning touches.
    spec = _root()["properties"]["spec"]
    assert crdpruning.pruned(spec, upstream_style["spec"]) == []
    assert crdpruning.pruned(spec, examples.module()["spec"]) == []
    assert crdpruning.pruned(spec, build_sign["spec"]) == []
    upstream_style["spec"]["moduleLoader"]["container"]["typo"] = 1
    assert crdpruning.pruned(spec, upstream_style["spec"]) == [".moduleLoader.container.typo"]


def test_admission_policy_checks_the_label_budget() -> None:
    policy, binding, _warnings, _warnings_binding = admission.render()
    (validation,) = policy["spec"]["validations"]
    assert validation["expression"].endswith(f"<= {labels.MAX_NAME_AND_NAMESPACE}")
    assert validation["message"].startswith("metadata.name:")
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert binding["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Deny"],
    }


def test_warnings_policy_only_warns_and_names_each_field() -> None:
    _policy, _binding, policy, binding = admission.render()
    assert policy["metadata"]["name"] == admission.WARNINGS_POLICY_NAME
    assert binding["spec"] == {
        "policyName": admission.WARNINGS_POLICY_NAME,
        "validationActions": ["Warn"],
    }
    # An expression that fails to evaluate must not refuse the Module.
    assert policy["spec"]["failurePolicy"] == "Ignore"
    messages = [v["message"] for v in policy["spec"]["validations"]]
    assert [m.split(" ", 1)[0] for m in messages] == [
        "spec.moduleLoader.container.build.kanikoParams",
        "spec.moduleLoader.container.kernelMappings[].build.kanikoParams",
        "spec.moduleLoader.container.sign.unsignedImage",
        "spec.moduleLoader.container.modprobe.parameters",
    ]
    assert all(
        m.endswith("has no effect in kmm: kmm builds with buildah, not kaniko")
        for m in messages[:2]
    )
    # registryTLS now governs kmm's own registry requests: no warning names it.
    assert not any(
        "registryTLS" in v["expression"] or "registryTLS" in m
        for v, m in zip(policy["spec"]["validations"], messages, strict=True)
    )
