"""The Helm chart in deploy/helm/kmm: committed as rendered, every hole filled.

Helm itself renders, lints and installs it in
tests/integration/test_helm_chart.py; here, what needs no Helm.
"""

from __future__ import annotations

import pathlib

import yaml

from kmm.api import chart, installation

DEPLOY = pathlib.Path(__file__).resolve().parents[3] / "deploy"


def test_committed_chart_equals_rendering() -> None:
    rendered = chart.files()
    committed = {
        str(path.relative_to(DEPLOY)): path.read_text()
        for path in (DEPLOY / chart.DIRECTORY).rglob("*")
        if path.is_file()
    }
    assert sorted(committed) == sorted(rendered), "files in the chart that kmm.api does not render"
    for path, text in rendered.items():
        assert committed[path] == text, (
            f"deploy/{path} is stale: run `.venv/bin/python scripts/render_deploy.py`"
        )


def test_no_token_is_left_in_a_template() -> None:
    for path, text in chart.files().items():
        assert "__hole" not in text, path


def test_values_file_holds_the_defaults_of_deploy() -> None:
    text = chart.files()[f"{chart.DIRECTORY}/values.yaml"]
    assert yaml.safe_load(text) == chart.values()
    (container,) = installation.deployment()["spec"]["template"]["spec"]["containers"]
    image = chart.values()["image"]
    assert f"{image['repository']}:{chart_version()}" == container["image"]
    assert chart.values()["resources"] == container["resources"]


def chart_version() -> str:
    meta = yaml.safe_load(chart.files()[f"{chart.DIRECTORY}/Chart.yaml"])
    assert meta["version"] == meta["appVersion"]
    version: str = meta["appVersion"]
    return version


def test_a_template_with_holes_is_valid_yaml_once_the_defaults_are_in() -> None:
    # A rough stand-in for Helm on the value holes only: each `{{ ... }}`
    # scalar replaced by a plain word must leave YAML that parses, so the
    # dump and the hole placement agree on indentation.
    for path, text in chart.files().items():
        if "/templates/" not in path:
            continue
        lines = [
            line
            for line in text.splitlines()
            if not line.strip().startswith(("{{-", "{{ if", "{{ fail"))
        ]
        plain = "\n".join(lines)
        while "{{" in plain:
            start = plain.index("{{")
            plain = plain[:start] + "x" + plain[plain.index("}}", start) + 2 :]
        for document in yaml.safe_load_all(plain):
            assert document is None or "kind" in document, path


def test_builder_image_and_driver_toolkit_image_are_passed_only_when_set() -> None:
    assert chart.values()["builder"] == {"image": "", "driverToolkitImage": ""}
    template = chart.files()[f"{chart.DIRECTORY}/templates/deployment.yaml"]
    # One argument of the compacted list: absent when the value is empty.
    assert (
        '(ternary (printf "--builder-image=%s" .Values.builder.image) "" '
        "(not (empty .Values.builder.image)))" in template
    )
    assert (
        '(ternary (printf "--driver-toolkit-image=%s" .Values.builder.driverToolkitImage) "" '
        "(not (empty .Values.builder.driverToolkitImage)))" in template
    )
    # deploy/ itself leaves the operator's built-in default, and no DTK_AUTO.
    (container,) = installation.deployment()["spec"]["template"]["spec"]["containers"]
    assert not any(arg.startswith("--builder-image") for arg in container["args"])
    assert not any(arg.startswith("--driver-toolkit-image") for arg in container["args"])
