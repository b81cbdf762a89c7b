"""Shared test data for kmm.api: KMM Module manifests as users write them."""

from __future__ import annotations

from typing import Any

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


# A Module that builds and signs in the cluster, written as KMM users write
# them: build and sign at the container level, one kernel mapping adding to
# both (build args by name, more secrets, its own selector and files), one
# taking the container's as they are.
BUILD_SIGN = """
apiVersion: kmm.sigs.x-k8s.io/v1beta1
kind: Module
metadata:
  name: kmod-built
  namespace: drivers
spec:
  moduleLoader:
    container:
      modprobe:
        moduleName: kmod_a
      containerImage: registry.example:5000/$MOD_NAMESPACE/$MOD_NAME:$KERNEL_FULL_VERSION
      registryTLS:
        insecure: true
      build:
        dockerfileConfigMap:
          name: kmod-dockerfile
        buildArgs:
          - name: VARIANT
            value: base
          - name: JOBS
            value: "2"
        secrets:
          - name: git-token
        baseImageRegistryTLS:
          insecureSkipTLSVerify: true
        kanikoParams:
          tag: debug
        selector:
          builder: "true"
      sign:
        keySecret:
          name: signing-key
        certSecret:
          name: signing-cert
        filesToSign:
          - /opt/lib/modules/${KERNEL_FULL_VERSION}/kmod_a.ko
      kernelMappings:
        - literal: 6.1.0-27-amd64
          build:
            buildArgs:
              - name: VARIANT
                value: debian
              - name: EXTRA
                value: ""
            secrets:
              - name: apt-mirror
              - name: git-token
            selector:
              builder: debian
            baseImageRegistryTLS: {}
          sign:
            filesToSign:
              - /opt/lib/modules/${KERNEL_FULL_VERSION}/kmod_b?.ko
              - /opt/lib/modules/${KERNEL_FULL_VERSION}/kmod_a.ko
            unsignedImageRegistryTLS:
              insecure: true
        - regexp: '^.+$'
  imageRebuildTriggerGeneration: 3
  selector:
    kubernetes.io/os: linux
"""


@pytest.fixture
def build_sign() -> dict[str, Any]:
    """A fresh copy of the building and signing Module (tests mutate it)."""
    loaded: dict[str, Any] = yaml.safe_load(BUILD_SIGN)
    return loaded
