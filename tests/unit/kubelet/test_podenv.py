"""What a container process of an emulated node is given (kmm.kubelet.podenv)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from kmm.kube import errors
from kmm.kubelet import podenv


class Api:
    """The API server as podenv uses it: GETs of ConfigMaps and Secrets, TokenRequests."""

    server = "https://127.0.0.1:6443"

    def __init__(self, objects: dict[str, dict[str, Any]]) -> None:
        self.objects = objects
        self.requests: list[tuple[str, str, Any]] = []

    async def request(self, method: str, path: str, *, body: Any = None, **_: Any) -> Any:
        self.requests.append((method, path, body))
        if method == "POST" and path.endswith("/token"):
            return {"spec": {"expirationSeconds": 3607}, "status": {"token": "t0ken"}}
        if path in self.objects:
            return self.objects[path]
        raise errors.NotFound(404, f"{path} not found", method=method, path=path)


POD: dict[str, Any] = {
    "metadata": {
        "name": "p",
        "namespace": "ns",
        "uid": "u-1",
        "labels": {"app": "x"},
        "annotations": {"a": "b"},
    },
    "spec": {
        "nodeName": "n1",
        "serviceAccountName": "sa",
        "volumes": [
            {"name": "plugins", "hostPath": {"path": "/var/lib/kubelet/plugins"}},
            {"name": "cdi", "hostPath": {"path": "/var/run/cdi"}},
            {"name": "scratch", "emptyDir": {}},
        ],
    },
    "status": {"hostIP": "10.0.0.1", "podIP": "10.0.0.2"},
}


def test_expansion_follows_kubernetes() -> None:
    variables = {"A": "1", "B": "two"}
    assert podenv.expand("$(A)-$(B)", variables) == "1-two"
    assert podenv.expand("$(MISSING)", variables) == "$(MISSING)"
    assert podenv.expand("$$(A)", variables) == "$(A)"
    assert podenv.expand("cost $5", variables) == "cost $5"


def test_paths_under_a_host_path_mount_are_mapped_innermost_first(tmp_path: Path) -> None:
    paths = podenv.PathMap(
        {"/var/lib/kubelet": tmp_path / "a", "/var/lib/kubelet/x": tmp_path / "b"}
    )
    assert paths.value("/var/lib/kubelet/plugins") == str(tmp_path / "a/plugins")
    assert paths.value("/var/lib/kubelet/x/y") == str(tmp_path / "b/y")
    assert paths.value("--dir=/var/lib/kubelet") == f"--dir={tmp_path / 'a'}"
    assert paths.value("/var/lib/kubeletfoo") == "/var/lib/kubeletfoo"  # not under the mount
    assert paths.value("relative/var/lib/kubelet") == "relative/var/lib/kubelet"


async def test_a_launch_gets_env_downward_api_mapped_paths_and_a_token(tmp_path: Path) -> None:
    api = Api(
        {
            "/api/v1/namespaces/ns/configmaps/settings": {"data": {"level": "debug"}},
            "/api/v1/namespaces/ns/secrets/creds": {
                "data": {"password": base64.b64encode(b"s3cret").decode()}
            },
            "/api/v1/namespaces/ns/configmaps/kube-root-ca.crt": {"data": {"ca.crt": "PEM"}},
        }
    )
    container = {
        "name": "c",
        "image": "kmm",
        "command": ["kmm", "driver"],
        "args": ["--node=$(NODE_NAME)", "--cdi-root=$(CDI_ROOT)"],
        "env": [
            {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
            {
                "name": "APP",
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}},
            },
            {"name": "CDI_ROOT", "value": "/var/run/cdi"},
            {"name": "SOCKET", "value": "/var/lib/kubelet/plugins/d/dra.sock"},
            {"name": "GREETING", "value": "hi $(NODE_NAME)"},
            {
                "name": "LEVEL",
                "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "level"}},
            },
            {
                "name": "PASSWORD",
                "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}},
            },
            {
                "name": "ABSENT",
                "valueFrom": {"configMapKeyRef": {"name": "none", "key": "k", "optional": True}},
            },
        ],
        "volumeMounts": [
            {"name": "plugins", "mountPath": "/var/lib/kubelet/plugins"},
            {"name": "cdi", "mountPath": "/var/run/cdi"},
            {"name": "scratch", "mountPath": "/scratch"},
        ],
    }
    launch, lifetime = await podenv.build(
        api,  # type: ignore[arg-type]
        POD,
        container,
        root=tmp_path / "root",
        server=api.server,
        account_dir=tmp_path / "sa",
        base_env={"PATH": "/bin"},
    )
    root = tmp_path / "root"
    assert launch.argv[1:] == ["driver", "--node=n1", f"--cdi-root={root / 'var/run/cdi'}"]
    env = launch.env
    assert env["POD_UID"] == "u-1"
    assert env["APP"] == "x"
    assert env["CDI_ROOT"] == str(root / "var/run/cdi")
    assert env["SOCKET"] == str(root / "var/lib/kubelet/plugins/d/dra.sock")
    assert env["GREETING"] == "hi n1"
    assert env["LEVEL"] == "debug"
    assert env["PASSWORD"] == "s3cret"
    assert "ABSENT" not in env
    assert env["KUBERNETES_SERVICE_HOST"] == "127.0.0.1"
    assert env["KUBERNETES_SERVICE_PORT"] == "6443"
    assert env[podenv.KMM_IN_CLUSTER_DIR] == str(tmp_path / "sa")
    assert env["PATH"] == "/bin"
    assert lifetime == 3607
    assert (tmp_path / "sa/token").read_text() == "t0ken"
    assert (tmp_path / "sa/ca.crt").read_text() == "PEM"
    assert (tmp_path / "sa/namespace").read_text() == "ns"
    (_, path, body) = next(r for r in api.requests if r[0] == "POST")
    assert path == "/api/v1/namespaces/ns/serviceaccounts/sa/token"
    assert body["spec"]["boundObjectRef"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "p",
        "uid": "u-1",
    }


async def test_no_token_when_automount_is_off_and_a_missing_key_is_a_config_error(
    tmp_path: Path,
) -> None:
    api = Api({})
    pod = {**POD, "spec": {**POD["spec"], "automountServiceAccountToken": False}}
    launch, lifetime = await podenv.build(
        api,  # type: ignore[arg-type]
        pod,
        {"name": "c", "command": ["true"]},
        root=tmp_path,
        server=api.server,
        account_dir=tmp_path / "sa",
        base_env={},
    )
    assert lifetime is None
    assert podenv.KMM_IN_CLUSTER_DIR not in launch.env
    assert not any(r[0] == "POST" for r in api.requests)
    with pytest.raises(podenv.ConfigError, match='configmap "settings" not found'):
        await podenv.build(
            api,  # type: ignore[arg-type]
            pod,
            {
                "name": "c",
                "env": [
                    {
                        "name": "X",
                        "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "k"}},
                    }
                ],
            },
            root=tmp_path,
            server=api.server,
            account_dir=tmp_path / "sa",
            base_env={},
        )
    with pytest.raises(podenv.ConfigError, match="unsupported fieldRef"):
        await podenv.build(
            api,  # type: ignore[arg-type]
            pod,
            {"name": "c", "env": [{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}]},
            root=tmp_path,
            server=api.server,
            account_dir=tmp_path / "sa",
            base_env={},
        )


async def test_configmap_secret_and_empty_dir_volumes_are_projected_and_refreshed(
    tmp_path: Path,
) -> None:
    objects = {
        "/api/v1/namespaces/ns/configmaps/settings": {"data": {"a.yaml": "one", "b": "two"}},
        "/api/v1/namespaces/ns/secrets/creds": {"data": {"k": base64.b64encode(b"v").decode()}},
    }
    api = Api(objects)
    pod = {
        **POD,
        "spec": {
            **POD["spec"],
            "volumes": [
                {"name": "cfg", "configMap": {"name": "settings"}},
                {
                    "name": "picked",
                    "configMap": {"name": "settings", "items": [{"key": "b", "path": "x/b.txt"}]},
                },
                {"name": "sec", "secret": {"secretName": "creds"}},
                {"name": "gone", "configMap": {"name": "absent", "optional": True}},
                {"name": "scratch", "emptyDir": {}},
            ],
        },
    }
    volumes = tmp_path / "volumes"
    await podenv.project_volumes(api, pod, volumes)  # type: ignore[arg-type]
    assert (volumes / "cfg/a.yaml").read_text() == "one"
    assert (volumes / "picked/x/b.txt").read_text() == "two"
    assert not (volumes / "picked/a.yaml").exists()
    assert (volumes / "sec/k").read_text() == "v"
    assert (volumes / "gone").is_dir()
    assert (volumes / "scratch").is_dir()
    paths = podenv.mounts(
        pod, {"volumeMounts": [{"name": "cfg", "mountPath": "/etc/kmm"}]}, tmp_path, None, volumes
    )
    assert paths.value("--config=/etc/kmm/a.yaml") == f"--config={volumes / 'cfg/a.yaml'}"
    objects["/api/v1/namespaces/ns/configmaps/settings"] = {"data": {"a.yaml": "changed"}}
    await podenv.project_volumes(api, pod, volumes)  # type: ignore[arg-type]
    assert (volumes / "cfg/a.yaml").read_text() == "changed"
    assert not (volumes / "cfg/b").exists()  # a key gone from the ConfigMap goes from the volume
    del objects["/api/v1/namespaces/ns/secrets/creds"]
    with pytest.raises(podenv.ConfigError, match='secret "creds" not found'):
        await podenv.project_volumes(api, pod, volumes)  # type: ignore[arg-type]
