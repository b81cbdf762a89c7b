# The two commands the README opens with:
#   make demo   runs kmm on the embedded default (a local sandbox: a VM node, a real kernel)
#   make test   runs every check and every test, from a fresh clone
# Everything installs from this repo's own files into .venv.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: all venv demo demo-builds demo-stop demo-fleet demo-fleet-stop demo-dra demo-dra-stop sandbox-binaries sandbox-build-deps image image-again image-tools test-images vm-tools vm-image vm-test-modules vm-toolkit-images deploy reference docs test test-compat test-builds kubelet-protos test-checks-and-images lint typecheck layers unit integration protos clean

all: test

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

venv: $(BIN)/.installed

# kmm's example Module on a real kernel (scripts/demo_kmmdemo.sh): a sandbox
# with a VM node booting Debian's signed kernel under Secure Boot and a
# containerd node for builds, the operator, examples/kmmdemo's Module built,
# signed and loaded, a workload reading its device through DRA; it prints the
# node's lsmod lines, the signer and what the pod read. Root, and what it
# runs on built first (the Debian packages of vm-tools and image-tools, the
# sandbox binaries, the VM node image and toolkits, kmm's image, the pause image).
DEMO_DIR ?= $(HOME)/.local/state/kmm/demo
DEMO_KUBECONFIG := $(DEMO_DIR)/kubeconfig

demo: venv sandbox-build-deps image-tools vm-tools demo-stop
	@test "$$(id -u)" = 0 || { echo "make demo: needs root (network namespaces, qemu's tap, containerd)" >&2; exit 1; }
	$(MAKE) --no-print-directory -j2 demo-builds image
	$(MAKE) --no-print-directory test-images
	mkdir -p $(dir $(DEMO_DIR))
	DEMO_DIR=$(DEMO_DIR) BIN=$(BIN) scripts/demo_kmmdemo.sh

demo-builds:
	$(MAKE) --no-print-directory -j1 sandbox-binaries vm-toolkit-images

# Stops a demo's operator and sandbox, whatever state a previous run left.
demo-stop:
	-@test -f $(DEMO_DIR)/operator.pid && kill $$(cat $(DEMO_DIR)/operator.pid) 2>/dev/null; rm -f $(DEMO_DIR)/operator.pid
	-@test -x $(BIN)/kmm && $(BIN)/kmm sandbox down --dir $(DEMO_DIR) >/dev/null 2>&1; true

# The operator on a KWOK fleet (the demo before VM nodes): CRDs + admission
# policy, `kmm operator` in the background, the demo Module
# (deploy/operator/examples), then where it is loaded. Fake nodes: nothing loads.
FLEET_DIR ?= $(HOME)/.local/state/kmm/demo-fleet
FLEET_KUBECONFIG := $(FLEET_DIR)/kubeconfig

demo-fleet: venv demo-fleet-stop
	$(BIN)/kmm sandbox up --dir $(FLEET_DIR) --nodes 4 --kernel 6.8.0-45-generic --kernel 6.1.0-27-amd64 --kernel 5.14.0-427.el9.x86_64+
	$(BIN)/kmm apply --kubeconfig $(FLEET_KUBECONFIG) -f deploy/crd/modules.kmm.sigs.x-k8s.io.yaml -f deploy/crd/preflightvalidations.kmm.sigs.x-k8s.io.yaml -f deploy/admission/modules.kmm.sigs.x-k8s.io.yaml
	$(BIN)/kmm operator --kubeconfig $(FLEET_KUBECONFIG) --bind-address 127.0.0.1 --metrics-port 0 --health-port 0 --no-leader-election >$(FLEET_DIR)/operator.log 2>&1 & echo $$! >$(FLEET_DIR)/operator.pid
	$(BIN)/kmm apply --kubeconfig $(FLEET_KUBECONFIG) -f deploy/operator/examples/demo-module.yaml
	$(BIN)/kmm modules --kubeconfig $(FLEET_KUBECONFIG) --wait 120
	@echo "operator: pid $$(cat $(FLEET_DIR)/operator.pid), JSON logs in $(FLEET_DIR)/operator.log"
	@echo "try: KUBECONFIG=$(FLEET_KUBECONFIG) kubectl get ds,pods -o wide; stop it all: make demo-fleet-stop"

demo-fleet-stop:
	-@test -f $(FLEET_DIR)/operator.pid && kill $$(cat $(FLEET_DIR)/operator.pid) 2>/dev/null; rm -f $(FLEET_DIR)/operator.pid
	-@test -x $(BIN)/kmm && $(BIN)/kmm sandbox down --dir $(FLEET_DIR) >/dev/null 2>&1; true

# DRA on the sandbox: an emulated node (`kmm kubelet`, a fake kernel module
# "kmmdemo" with two devices under its root), the operator, the example DRA
# Module (its driver pods run kmm driver on the node) and a workload whose claim
# the scheduler allocates; then where it was allocated and the CDI spec it got.
DRA_DEMO_DIR ?= $(HOME)/.local/state/kmm/demo-dra
DRA_DEMO_KUBECONFIG := $(DRA_DEMO_DIR)/kubeconfig

demo-dra: venv demo-dra-stop
	$(BIN)/kmm sandbox up --dir $(DRA_DEMO_DIR) --nodes 0
	$(BIN)/kmm apply --kubeconfig $(DRA_DEMO_KUBECONFIG) -f deploy/crd/modules.kmm.sigs.x-k8s.io.yaml -f deploy/crd/preflightvalidations.kmm.sigs.x-k8s.io.yaml -f deploy/admission/modules.kmm.sigs.x-k8s.io.yaml
	mkdir -p $(DRA_DEMO_DIR)/node
	$(BIN)/kmm kubelet --kubeconfig $(DRA_DEMO_KUBECONFIG) --node kmm-dra-0 --root $(DRA_DEMO_DIR)/node --label node-role.kubernetes.io/worker= --fake-module kmmdemo=2 --metrics-port 0 >$(DRA_DEMO_DIR)/kubelet.log 2>&1 & echo $$! >$(DRA_DEMO_DIR)/kubelet.pid
	$(BIN)/kmm operator --kubeconfig $(DRA_DEMO_KUBECONFIG) --bind-address 127.0.0.1 --metrics-port 0 --health-port 0 --no-leader-election >$(DRA_DEMO_DIR)/operator.log 2>&1 & echo $$! >$(DRA_DEMO_DIR)/operator.pid
	$(BIN)/kmm apply --kubeconfig $(DRA_DEMO_KUBECONFIG) -f deploy/examples/dra-module.yaml
	$(BIN)/kmm apply --kubeconfig $(DRA_DEMO_KUBECONFIG) -f deploy/examples/dra-workload.yaml
	$(BIN)/kmm claims --kubeconfig $(DRA_DEMO_KUBECONFIG) --wait 180
	@echo "CDI spec on the node ($(DRA_DEMO_DIR)/node/var/run/cdi):"
	@cat $(DRA_DEMO_DIR)/node/var/run/cdi/*.json; echo
	@echo "the workload's containers were given: $$(cat $(DRA_DEMO_DIR)/node/var/lib/kubelet/kmm-emulator/containers.json)"
	@echo "logs: $(DRA_DEMO_DIR)/{kubelet,operator}.log, the driver's under $(DRA_DEMO_DIR)/node/var/log/pods; stop it all: make demo-dra-stop"

demo-dra-stop:
	-@for p in operator kubelet; do test -f $(DRA_DEMO_DIR)/$$p.pid && kill $$(cat $(DRA_DEMO_DIR)/$$p.pid) 2>/dev/null; rm -f $(DRA_DEMO_DIR)/$$p.pid; done; sleep 1
	-@test -x $(BIN)/kmm && $(BIN)/kmm sandbox down --dir $(DRA_DEMO_DIR) >/dev/null 2>&1; true

lint: venv
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

typecheck: venv
	$(BIN)/mypy

layers: venv
	$(BIN)/lint-imports

unit: venv
	$(BIN)/pytest tests/unit

integration: venv
	$(BIN)/pytest tests/integration

# The sandbox binaries (control plane, kubelet, fake runtime, kubectl, helm)
# are built once per version (10-15 min cold; the kubelet adds ~6 min of it,
# kubectl ~3 and helm ~7) before pytest starts, so no test's time limit
# includes compiling Kubernetes.
# runc, one of the container nodes' binaries, is built with cgo and the seccomp
# tag: it needs libseccomp's headers (found through pkg-config). As root, as
# on CI, and only when one is missing.
sandbox-binaries: venv sandbox-build-deps
	$(BIN)/kmm sandbox build

sandbox-build-deps:
	@missing=; dpkg-query -W -f='$${Status}' libseccomp-dev 2>/dev/null | grep -q 'ok installed' || missing=libseccomp-dev; \
	command -v pkg-config >/dev/null || missing="$$missing pkg-config"; \
	if [ -n "$$missing" ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; fi

# What `make image` and `make test-images` build with, from Debian's packages,
# and busybox, the third shell the loader hooks' unit tests run under (an
# Alpine or busybox image's sh and od); as root, as on CI, and only when one
# is missing.
IMAGE_TOOLS := mmdebstrap buildah gcc kmod busybox
image-tools:
	@for tool in $(IMAGE_TOOLS); do command -v $$tool >/dev/null || missing="$$missing $$tool"; done; \
	if [ -n "$$missing" ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; fi

# What VM nodes boot and are built with (src/kmm/sandbox/vmnodes), from
# Debian's packages: qemu (TCG; KVM where the host allows), OVMF's Secure Boot
# firmware, mtools and dosfstools for the per-node ESP, e2fsprogs for the
# root filesystem. shim and grub come from the guest's own archive when its
# image is built, not from the host. As root, only when one is missing.
VM_TOOLS := qemu-system-x86 qemu-utils ovmf mtools dosfstools e2fsprogs mmdebstrap
vm-tools:
	@for package in $(VM_TOOLS); do dpkg-query -W -f='$${Status}' $$package 2>/dev/null | grep -q 'ok installed' || missing="$$missing $$package"; done; \
	if [ -n "$$missing" ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; fi

# The VM node image (kmm.sandbox.vmnodes.images), cached by content under
# ~/.cache/kmm/vm: Debian bookworm with both kernel lines chosen the first
# time (recorded in ~/.cache/kmm/vm/kernels.json, which keys the image; delete
# it for newer kernels) and the pinned node binaries. A few minutes cold
# (mostly downloads), a second or two warm.
vm-image: venv vm-tools sandbox-build-deps
	nice -n 10 $(BIN)/python scripts/build_vm_image.py

# The VM node test's module (tests/vm/kmm_vm_test), built for each node kernel
# against its Debian headers in that kernel's toolkit (cached under
# ~/.cache/kmm/vm like the image), into build/vm/modules/<kernel>/ with the
# kbuild sign-file the test signs it with; and the example's two modules
# (examples/kmmdemo/src) into build/vm/examples/kmmdemo/<kernel>/, proving
# they build for both kernel lines.
vm-test-modules: vm-image
	nice -n 10 $(BIN)/python scripts/build_vm_test_modules.py

# The driver toolkit images (kmm.sandbox.vmnodes.toolkitimages): each node
# kernel's toolkit (built here when missing, as for vm-test-modules) as an
# OCI image layout, cached by content under ~/.cache/kmm/vm like the
# toolkits. A sandbox with VM nodes seeds its registry with them (linked,
# not uploaded) as 10.253.0.1:5000/kmm/driver-toolkit:<tag-safe kernel>,
# the images `kmm operator --driver-toolkit-image` passes builds as DTK_AUTO.
vm-toolkit-images: vm-image
	nice -n 10 $(BIN)/python scripts/build_vm_toolkit_images.py

# kmm's image as an OCI archive, build/kmm-image.tar (docs/install.md "The
# image"); built again only when its inputs, name or commit change. And the
# builder image of build and sign pods, build/kmm-builder-image.tar
# (docs/build-and-sign.md "The builder image"), built again only when its
# content changes.
image: venv image-tools
	scripts/build_image.sh
	scripts/build_builder_image.sh

# The same image built a second time, from nothing but the cached base: the
# image test compares the two (the same commit builds the same layers).
image-again: venv image-tools
	OUT=build/kmm-image-again.tar scripts/build_image.sh

# The container-node tests' images, build/images/{loader,workload,pause,kbuild}.tar
# and build/images/kbuild.kernel (docs/development.md "Test images"), cached by content
# under ~/.cache/kmm/image.
test-images: image-tools
	scripts/build_test_images.sh

# deploy/ (manifests and the Helm chart) written anew from kmm.api.
deploy: venv
	$(BIN)/python scripts/render_deploy.py

# The manual's API reference (docs/reference/) written anew from the CRDs' schemas.
reference: venv
	$(BIN)/python scripts/render_docs.py

# The manual (docs/, mkdocs.yml) built into site/; --strict: a broken link,
# anchor or page left out of the nav fails (not with --quiet: it hides the
# warnings strict mode counts). No plugin fetches anything.
docs: venv
	$(BIN)/mkdocs build --strict

# Every image a test reads is made here, before pytest: no test downloads or builds one.
# Two lanes side by side once the Debian packages are in (apt holds one lock):
# the Go builds, which keep both cores busy, then the VM node image, the
# test module for its kernels and their driver toolkit images (which bake
# in and follow from those builds);
# and the static checks then the images (mostly downloads and disk), one
# after another. Their lines
# interleave as they come: an output sync would hold the builds' progress
# until each command ends. Then pytest on two workers (tests/conftest.py says
# which tests share one: those that start kubelet nodes change host-wide
# settings and run one after another).
test: venv sandbox-build-deps image-tools vm-tools
	$(MAKE) --no-print-directory -j2 test-builds test-checks-and-images
	$(BIN)/pytest -n 2 --dist loadscope

test-builds:
	$(MAKE) --no-print-directory -j1 sandbox-binaries kubelet-protos vm-test-modules vm-toolkit-images

# The kubelet's .proto files of every supported release, which
# tests/unit/test_protos_upstream.py compares kmm's with: k8s.io/kubelet of
# each wrapper module into the Go module cache (a small module each).
kubelet-protos:
	for wrapper in src/kmm/sandbox/gotools/kubernetes/v1.*; do \
		version=$$(sed -n 's|^\tk8s.io/kubelet => k8s.io/kubelet ||p' $$wrapper/go.mod); \
		(cd $$wrapper && go mod download k8s.io/kubelet@$$version) || exit 1; \
	done

test-checks-and-images:
	$(MAKE) --no-print-directory -j1 lint typecheck layers docs image image-again test-images

# The compatibility subset (tests marked compat: a Module converging, DRA end
# to end on a container node's real kubelet, an ordered upgrade) on another
# supported Kubernetes release, e.g. `make test-compat K8S=1.36`: that
# release's control plane, kubelet and kube-proxy are built first (cached per
# version, ~15 min cold). Not in `make test`: each release costs a cold build.
test-compat: venv sandbox-build-deps image-tools
	@test -n "$(K8S)" || { echo "make test-compat needs K8S=VERSION (e.g. K8S=1.36)"; exit 2; }
	$(BIN)/kmm sandbox build --kubernetes-version $(K8S) --no-clients
	$(MAKE) --no-print-directory image test-images
	KMM_TEST_KUBERNETES_VERSION=$(K8S) $(BIN)/pytest -n0 -m compat tests/integration

protos: venv
	$(BIN)/python scripts/gen_protos.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache site
