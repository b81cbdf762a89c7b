"""Shared test data for kmm.api: KMM Module manifests as users write them."""

from __future__ import annotations

from typing import Any

import build_sign_cases
import pytest
import yaml

# In the style of KMM's documented Module example (a loader with literal and
# regexp mappings, registryTLS, a device plugin with pass-through sub-objects
# and automountServiceAccountToken).
UPSTREAM_STYLE = """
apiVersion: kmm.sigs.x-k8s.io/v1beta1
kind: Module
metadata:
  name: my-kmod
  namespace: kmm-operator-system
spec:
  moduleLoader:
    container:
      modprobe:
        moduleName: my-kmod
        dirName: /opt
        firmwarePath: /firmware
        parameters:
          - param=1
        modulesLoadingOrder:
          - my-kmod
          - my_dep_a
          - my_dep_b
      imagePullPolicy: Always
      inTreeModulesToRemove: [mod_a, mod_b]
      kernelMappings:
        - literal: 6.0.15-300.fc37.x86_64
          containerImage: some.registry/org/my-kmod:6.0.15-300.fc37.x86_64
          inTreeModulesToRemove: [mod_a]
        - regexp: '^.+\\fc37\\.x86_64$'
          containerImage: "some.other.registry/org/my-kmod:${KERNEL_FULL_VERSION}"
        - regexp: '^.+$'
          containerImage: "some.registry/org/my-kmod:${KERNEL_FULL_VERSION}"
          registryTLS:
            insecure: false
            insecureSkipTLSVerify: false
      registryTLS:
        insecure: false
        insecureSkipTLSVerify: false
    serviceAccountName: sa-module-loader
  devicePlugin:
    container:
      image: some.registry/org/device-plugin:latest
      command: [/bin/device-plugin]
      args: [--verbose]
      env:
        - name: MY_DEVICE_PLUGIN_ENV_VAR
          value: SOME_VALUE
      resources:
        limits:
          cpu: 100m
      volumeMounts:
        - mountPath: /some/mountPath
          name: device-plugin-volume
    initContainer:
      image: some.registry/org/device-plugin-init:v1
    volumes:
      - name: device-plugin-volume
        configMap:
          name: some-configmap
    serviceAccountName: sa-device-plugin
    automountServiceAccountToken: false
  imageRepoSecret:
    name: secret-name
  selector:
    node-role.kubernetes.io/worker: ""
  tolerations:
    - key: node-role.kubernetes.io/master
      operator: Exists
      effect: NoSchedule
"""


@pytest.fixture
def upstream_style() -> dict[str, Any]:
    """A fresh copy of the upstream-style Module (tests mutate it)."""
    loaded: dict[str, Any] = yaml.safe_load(UPSTREAM_STYLE)
    return loaded


@pytest.fixture
def build_sign() -> dict[str, Any]:
    """A fresh copy of the building and signing Module (tests mutate it)."""
    return build_sign_cases.module()
