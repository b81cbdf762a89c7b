"""The Helm chart under ``deploy/helm/kmm``, rendered from the builders of ``deploy/``.

Every template is one or more of the objects ``installation``, ``crd`` and
``admission`` build, dumped as YAML with *holes*: tokens (``__hole3__``) put
where Helm must fill in a value or a whole block from ``values.yaml`` or the
release, then replaced in the dumped text by their template expression. So
the chart cannot drift from ``deploy/``: a new RBAC rule or container setting
reaches both. A document behind a value is wrapped in ``if`` and renders
nothing when the value is off. ``files()`` is the committed chart, kept equal
by a unit test; Helm itself lints, renders and installs it in the
integration tests (``tests/integration/test_helm_chart.py``).

Limits: names are fixed (``kmm-operator``), not derived from the release
name: the CRD, the ClusterRole and the admission policy are cluster-wide, so
one release per cluster is all that can work. The namespace is the release's.
"""

from __future__ import annotations

import copy
import functools
import re
from typing import Any

from kmm.api import admission, crd, installation, manifests

__all__ = ["DIRECTORY", "REGISTRY_CA_DIRECTORY", "files", "values"]

# deploy/-relative directory of the chart.
DIRECTORY = "helm/kmm"
_REPOSITORY, _VERSION = installation.IMAGE.rsplit(":", 1)
_RELEASE_NAMESPACE = "{{ .Release.Namespace }}"
_CHART_LABEL = f"kmm-{_VERSION}"


class _Holes:
    """Tokens standing for template text in objects about to be dumped."""

    def __init__(self) -> None:
        self._values: dict[str, str] = {}
        self._blocks: dict[str, tuple[str, bool]] = {}

    def _token(self) -> str:
        # Underscores on both sides: a plain YAML scalar no token is a prefix of.
        return f"__hole{len(self._values) + len(self._blocks)}__"

    def value(self, expression: str) -> str:
        """A scalar written as ``expression``, unquoted: what Helm prints is
        typed by YAML, so a number stays a number."""
        token = self._token()
        self._values[token] = expression
        return token

    def block(self, expression: str, *, omit_empty: bool = True) -> str:
        """A mapping's value rendered by ``toYaml expression``; with
        ``omit_empty`` the key is left out when the value is empty."""
        token = self._token()
        self._blocks[token] = (expression, omit_empty)
        return token

    def fill(self, text: str) -> str:
        """``text`` with every hole made so far replaced by its template text."""
        for token, (expression, omit_empty) in self._blocks.items():
            pattern = re.compile(rf"^( *)([\w./-]+): {token}$", re.M)
            text, count = pattern.subn(
                functools.partial(_block, expression=expression, omit_empty=omit_empty), text
            )
            if count != 1:
                raise ValueError(f"block {token} ({expression}) is not a mapping's value")
        for token, expression in self._values.items():
            # A function, not a replacement string: the expression is taken as is.
            text, count = re.subn(
                rf"'{token}'|{token}", functools.partial(_as_is, expression), text
            )
            if count != 1:
                raise ValueError(f"value {token} ({expression}) placed {count} times")
        # Every hole goes in the document it was made for: the next starts afresh.
        self._values.clear()
        self._blocks.clear()
        return text


def _as_is(text: str, _: re.Match[str]) -> str:
    return text


def _block(match: re.Match[str], *, expression: str, omit_empty: bool) -> str:
    """The lines standing for ``key: <token>``: the key, then toYaml's output
    indented under it."""
    indent, key = match.group(1), match.group(2)
    inner = len(indent) + 2
    if not omit_empty:
        return f"{indent}{key}:\n{indent}  {{{{- toYaml {expression} | nindent {inner} }}}}"
    return (
        f"{indent}{{{{- with {expression} }}}}\n"
        f"{indent}{key}:\n"
        f"{indent}  {{{{- toYaml . | nindent {inner} }}}}\n"
        f"{indent}{{{{- end }}}}"
    )


def _document(holes: _Holes, obj: dict[str, Any], condition: str | None = None) -> str:
    text = holes.fill(manifests.dump([obj]))
    if condition is None:
        return text
    return f"{{{{- if {condition} }}}}\n{text}{{{{- end }}}}\n"


def _template(documents: list[str]) -> str:
    return "---\n".join(documents)


def _labelled(holes: _Holes, obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` with the labels Helm's own charts carry (who manages it, which
    chart), and its subjects (a binding's) in the release namespace."""
    labelled = copy.deepcopy(obj)
    metadata = labelled["metadata"]
    metadata["labels"] = {
        **metadata.get("labels", {}),
        "app.kubernetes.io/managed-by": holes.value("{{ .Release.Service }}"),
        "helm.sh/chart": _CHART_LABEL,
    }
    for subject in labelled.get("subjects", []):
        subject["namespace"] = holes.value(_RELEASE_NAMESPACE)
    return labelled


def _in_release_namespace(holes: _Holes, obj: dict[str, Any]) -> dict[str, Any]:
    placed = _labelled(holes, obj)
    placed["metadata"]["namespace"] = holes.value(_RELEASE_NAMESPACE)
    return placed


def _crd() -> str:
    holes = _Holes()
    documents = []
    for obj in crd.render_all():
        definition = _labelled(holes, obj)
        # Helm deletes what a release made on uninstall; a CRD's deletion takes
        # every object of it: every Module, and with them the modules loaded on
        # the nodes; every PreflightValidation, and with them their pods.
        definition["metadata"]["annotations"] = {"helm.sh/resource-policy": "keep"}
        documents.append(_document(holes, definition, ".Values.crds.install"))
    return _template(documents)


def _admission() -> str:
    holes = _Holes()
    return _template(
        [
            _document(holes, _labelled(holes, obj), ".Values.admissionPolicy.enabled")
            for obj in admission.render()
        ],
    )


def _service_account() -> str:
    holes = _Holes()
    account = installation.namespace_and_account()[1]
    return _document(holes, _in_release_namespace(holes, account))


def _rbac() -> str:
    holes = _Holes()
    cluster = [_document(holes, _labelled(holes, obj)) for obj in installation.cluster_rbac()]
    election = [
        _document(holes, _in_release_namespace(holes, obj), ".Values.leaderElection.enabled")
        for obj in installation.leader_election_rbac()
    ]
    return _template(cluster + election)


# Checked first in the Deployment template: a second replica without the Lease
# would reconcile the same Modules as the first, at the same time.
_REPLICAS_GUARD = (
    "{{- if and (gt (int .Values.replicas) 1) (not .Values.leaderElection.enabled) }}\n"
    '{{- fail "replicas above 1 need leaderElection.enabled: without the Lease every '
    'replica would reconcile every Module" }}\n'
    "{{- end }}\n"
)


# Where the chart mounts the registryCA ConfigMap or Secret (the operator's --registry-ca).
REGISTRY_CA_DIRECTORY = "/etc/kmm/registry-ca"
_HAS_REGISTRY_CA = "(not (empty (print .Values.registryCA.configMap .Values.registryCA.secret)))"
_REGISTRY_CA_GUARD = (
    "{{- if and .Values.registryCA.configMap .Values.registryCA.secret }}\n"
    '{{- fail "registryCA: set configMap or secret, not both" }}\n'
    "{{- end }}\n"
)


# The operator's --builder-image, only when the value names one: empty leaves
# the operator's built-in default (the builder image of kmm's own release).
_BUILDER_IMAGE_ARG = (
    '(ternary (printf "--builder-image=%s" .Values.builder.image) "" '
    "(not (empty .Values.builder.image)))"
)


# The operator's --driver-toolkit-image (DTK_AUTO's template), only when set:
# empty passes no DTK_AUTO. Written as a YAML string by toYaml, so its
# ${KERNEL_FULL_VERSION} reaches the operator as written (no shell between).
_DRIVER_TOOLKIT_ARG = (
    '(ternary (printf "--driver-toolkit-image=%s" .Values.builder.driverToolkitImage) "" '
    "(not (empty .Values.builder.driverToolkitImage)))"
)


# The operator's --no-device-taints, only when the value turns them off.
_DEVICE_TAINTS_ARG = '(ternary "" "--no-device-taints" .Values.deviceTaints.enabled)'


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _deployment() -> str:
    holes = _Holes()
    deployment = _in_release_namespace(holes, installation.deployment())
    spec = deployment["spec"]
    spec["replicas"] = holes.value("{{ .Values.replicas }}")
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    container["image"] = holes.value(
        '"{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}"'
    )
    container["imagePullPolicy"] = holes.value("{{ .Values.image.pullPolicy }}")
    # One list built in Helm: an argument that is there or not (the CA
    # directory) cannot be a hole of its own.
    fixed = " ".join(_quoted(arg) for arg in container["args"])
    container["args"] = holes.block(
        f"(compact (list {fixed} "
        '(ternary "--leader-election" "--no-leader-election" .Values.leaderElection.enabled) '
        f'(ternary "--registry-ca={REGISTRY_CA_DIRECTORY}" "" {_HAS_REGISTRY_CA}) '
        f"{_BUILDER_IMAGE_ARG} {_DRIVER_TOOLKIT_ARG} {_DEVICE_TAINTS_ARG}))",
        omit_empty=False,
    )
    container["volumeMounts"] = holes.block(
        f'(ternary (list (dict "mountPath" "{REGISTRY_CA_DIRECTORY}" "name" "registry-ca" '
        f'"readOnly" true)) (list) {_HAS_REGISTRY_CA})'
    )
    pod["volumes"] = holes.block(
        '(concat (ternary (list (dict "configMap" (dict "name" .Values.registryCA.configMap) '
        '"name" "registry-ca")) (list) (not (empty .Values.registryCA.configMap))) '
        '(ternary (list (dict "name" "registry-ca" "secret" (dict "secretName" '
        ".Values.registryCA.secret))) (list) (not (empty .Values.registryCA.secret))))"
    )
    container["resources"] = holes.block(".Values.resources")
    pod["imagePullSecrets"] = holes.block(".Values.imagePullSecrets")
    pod["nodeSelector"] = holes.block(".Values.nodeSelector")
    pod["tolerations"] = holes.block(".Values.tolerations")
    return _REPLICAS_GUARD + _REGISTRY_CA_GUARD + _document(holes, deployment)


def _metrics() -> str:
    holes = _Holes()
    service = _document(
        holes,
        _in_release_namespace(holes, installation.metrics_service()),
        ".Values.metrics.enabled",
    )
    monitor = installation.service_monitor()
    # The user's labels beside the chart's (theirs win: merge keeps the first
    # it sees), for a Prometheus that picks its ServiceMonitors by label.
    own = " ".join(f'"{key}" "{value}"' for key, value in monitor["metadata"]["labels"].items())
    monitor["metadata"]["labels"] = holes.block(
        "(merge (dict) .Values.metrics.serviceMonitor.labels (dict "
        f'{own} "app.kubernetes.io/managed-by" .Release.Service "helm.sh/chart" "{_CHART_LABEL}"))',
        omit_empty=False,
    )
    monitor["metadata"]["namespace"] = holes.value(_RELEASE_NAMESPACE)
    (endpoint,) = monitor["spec"]["endpoints"]
    endpoint["interval"] = holes.value("{{ .Values.metrics.serviceMonitor.interval }}")
    return _template(
        [
            service,
            _document(
                holes,
                monitor,
                "and .Values.metrics.enabled .Values.metrics.serviceMonitor.enabled",
            ),
        ],
    )


def values() -> dict[str, Any]:
    """The chart's defaults: what ``deploy/`` installs."""
    return {name: default for name, _, default in _values()}


def _values() -> list[tuple[str, str, Any]]:
    """(key, comment, default) of every value, in the order values.yaml lists them."""
    (container,) = installation.deployment()["spec"]["template"]["spec"]["containers"]
    replicas = installation.deployment()["spec"]["replicas"]
    return [
        (
            "image",
            "kmm's image (`make image`, pushed with skopeo: see the README); an empty\n"
            "tag means the chart's appVersion.",
            {"repository": _REPOSITORY, "tag": "", "pullPolicy": "IfNotPresent"},
        ),
        ("imagePullSecrets", "Secrets the image is pulled with: [{name: ...}].", []),
        (
            "registryCA",
            "CA certificates the operator trusts, beside the system's, for its registry\n"
            "requests (image existence checks of build and sign): the name of a\n"
            "ConfigMap or a Secret in the release namespace whose every key is a PEM\n"
            f"file, mounted at {REGISTRY_CA_DIRECTORY} and passed as --registry-ca. Nodes\n"
            "pull with their container runtime's own configuration.",
            {"configMap": "", "secret": ""},
        ),
        (
            "builder",
            "The image of the pods that build and sign kernel-module images (buildah,\n"
            "sign-file), passed as --builder-image; empty means the operator's default.\n"
            "driverToolkitImage: the driver toolkit image a build gets as DTK_AUTO,\n"
            "expanded per kernel like a containerImage (e.g.\n"
            "registry.example/kmm/driver-toolkit:${KERNEL_FULL_VERSION}), passed as\n"
            "--driver-toolkit-image; empty passes no DTK_AUTO.",
            {"image": "", "driverToolkitImage": ""},
        ),
        (
            "deviceTaints",
            "In ordered upgrades of DRA Modules, the operator taints a moving node's\n"
            "devices of the Module with DeviceTaintRules where the cluster serves them\n"
            "(docs/upgrades.md). false passes --no-device-taints: no rule is read or\n"
            "written, nothing is evicted; the ClusterRole keeps its devicetaintrules and\n"
            "resourceslices rules, which the operator then never uses.",
            {"enabled": True},
        ),
        (
            "replicas",
            "Operator replicas. One leads, the rest stand by; above 1 needs leader election.",
            replicas,
        ),
        (
            "leaderElection",
            "The Lease kmm-operator in the release namespace. Turn it off only with one replica.",
            {"enabled": True},
        ),
        ("resources", "The operator container's requests and limits.", container["resources"]),
        ("nodeSelector", "Where the operator's pods may run.", {}),
        ("tolerations", "Taints the operator's pods tolerate.", []),
        (
            "crds",
            "Install and upgrade the Module and PreflightValidation CRDs with the release.\n"
            "Uninstalling keeps them: deleting the Module CRD would delete every Module,\n"
            "and unload their kernel modules.",
            {"install": True},
        ),
        (
            "admissionPolicy",
            "The ValidatingAdmissionPolicy with the Module rules a schema cannot express.",
            {"enabled": True},
        ),
        (
            "metrics",
            "A Service in front of /metrics, and a Prometheus Operator ServiceMonitor\n"
            "for it (needs the monitoring.coreos.com CRDs); labels are added to the\n"
            "ServiceMonitor's, for a Prometheus that selects by label.",
            {
                "enabled": True,
                "serviceMonitor": {"enabled": False, "interval": "30s", "labels": {}},
            },
        ),
    ]


def _values_text() -> str:
    sections = []
    for key, comment, default in _values():
        remark = "".join(f"# {line}\n" for line in comment.splitlines())
        sections.append(remark + manifests.dump([{key: default}]))
    return "\n".join(sections)


def _chart_text() -> str:
    return manifests.dump(
        [
            {
                "apiVersion": "v2",
                "name": "kmm",
                "description": "Kernel module management and DRA for Kubernetes: the kmm operator",
                "type": "application",
                "version": _VERSION,
                # No kubeVersion: `helm template` checks it against v1.20
                # unless told otherwise. The tested range is said instead.
                "appVersion": _VERSION,
                "annotations": {
                    "kmm.sigs.x-k8s.io/tested-kubernetes": "{} to {}".format(
                        *installation.KUBERNETES_TESTED
                    )
                },
            }
        ]
    )


def files() -> dict[str, str]:
    """The text of every file of the chart, keyed by ``deploy/``-relative path."""
    rendered = {
        "Chart.yaml": _chart_text(),
        "values.yaml": _values_text(),
        "templates/crd.yaml": _crd(),
        "templates/admission.yaml": _admission(),
        "templates/serviceaccount.yaml": _service_account(),
        "templates/rbac.yaml": _rbac(),
        "templates/deployment.yaml": _deployment(),
        "templates/metrics.yaml": _metrics(),
    }
    return {f"{DIRECTORY}/{path}": text for path, text in rendered.items()}
