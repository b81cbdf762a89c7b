#!/bin/sh
# make demo: kmm's example Module (examples/kmmdemo) on a real kernel.
#
# A sandbox with a VM node that boots Debian's signed kernel under Secure
# Boot (and a containerd node, where the build and sign pods run at the
# host's speed), kmm's CRDs and admission policy, the operator, the objects
# the Module names, the Module (built in the cluster FROM the kernel's driver
# toolkit, signed with the sandbox's key, loaded), and a workload that reads
# one of the module's devices through a DRA claim. Then what the node's
# kernel says: its lsmod lines, the signer of the loaded module, and what the
# workload read.
#
# Needs what `make demo` builds first (the sandbox binaries, kmm's image and
# the builder image, the VM node image and its kernels' driver toolkits, the
# pause image) and root. DEMO_DIR: the sandbox's directory; BIN: the venv's bin.
set -eu

DEMO_DIR=${DEMO_DIR:?}
BIN=${BIN:?}
KMM="$BIN/kmm"
export KUBECONFIG="$DEMO_DIR/kubeconfig"
NODE=kmm-vm-0
BUILD_NODE=kmm-kubelet-0
started=$(date +%s)

say() { printf '\n== %s (%ss)\n' "$*" "$(($(date +%s) - started))"; }

say "sandbox: a VM node under Secure Boot and a containerd node"
"$KMM" sandbox up --dir "$DEMO_DIR" --nodes 0 --kubelet-nodes 1 --runtime containerd \
    --vm-nodes 1 --pause-image build/images/pause.tar >"$DEMO_DIR.up.log"
cat "$DEMO_DIR.up.log"
mv "$DEMO_DIR.up.log" "$DEMO_DIR/up.log"
registry=$(sed -n 's/^Registry .*(from the host: \([0-9.:]*\);.*/\1/p' "$DEMO_DIR/up.log")
kubectl=$("$BIN/python" -c 'import asyncio
from kmm.cli import paths
from kmm.sandbox import building, components
print(*asyncio.run(building.ensure_built(paths.cache_dir(), (components.KUBECTL,))).values())')

say "images: kmm's (the DRA driver) and the builder's"
"$KMM" sandbox push --dir "$DEMO_DIR" build/kmm-image.tar kmm/kmm:example >/dev/null
"$KMM" sandbox push --dir "$DEMO_DIR" build/kmm-builder-image.tar kmm/builder:1 >/dev/null

say "kmm's CRDs, admission policy and operator"
"$KMM" apply -f deploy/crd/modules.kmm.sigs.x-k8s.io.yaml \
    -f deploy/crd/preflightvalidations.kmm.sigs.x-k8s.io.yaml \
    -f deploy/admission/modules.kmm.sigs.x-k8s.io.yaml
"$KMM" operator --no-leader-election --bind-address 127.0.0.1 --metrics-port 0 --health-port 0 \
    --builder-image 10.253.0.1:5000/kmm/builder:1 \
    --driver-toolkit-image '10.253.0.1:5000/kmm/driver-toolkit:${KERNEL_FULL_VERSION}' \
    --registry-ca "$DEMO_DIR/pki/ca.crt" --registry-endpoint "10.253.0.1:5000=$registry" \
    >"$DEMO_DIR/operator.log" 2>&1 &
echo $! >"$DEMO_DIR/operator.pid"

say "what the Module names: its Dockerfile, a build secret, the sandbox's signing key"
"$kubectl" create configmap kmmdemo-dockerfile --from-file=dockerfile=examples/kmmdemo/Dockerfile
"$kubectl" create secret generic kmmdemo-build-secret --from-literal=token=demo-token
"$kubectl" create secret generic kmmdemo-signing-key --from-file=key="$DEMO_DIR/secure-boot/signing.key"
"$kubectl" create secret generic kmmdemo-signing-cert --from-file=cert="$DEMO_DIR/secure-boot/signing.crt"

say "an in-tree module for the Module to remove: modprobe dummy on $NODE"
"$KMM" sandbox node exec --dir "$DEMO_DIR" "$NODE" -- modprobe dummy

say "the Module (examples/kmmdemo/module.yaml; builds pinned to $BUILD_NODE), and $NODE moved to version 1"
"$BIN/python" - "$BUILD_NODE" examples/kmmdemo/module.yaml >"$DEMO_DIR/module.yaml" <<'EOF'
import sys

import yaml

with open(sys.argv[2]) as source:
    documents = list(yaml.safe_load_all(source))
for document in documents:
    if document["kind"] == "Module":
        for mapping in document["spec"]["moduleLoader"]["container"]["kernelMappings"]:
            mapping["build"]["selector"] = {"kubernetes.io/hostname": sys.argv[1]}
yaml.safe_dump_all(documents, sys.stdout)
EOF
"$kubectl" apply -f "$DEMO_DIR/module.yaml"
"$KMM" upgrade default/kmmdemo --to 1 "$NODE"

say "a workload reads its device through a DRA claim"
"$kubectl" apply -f examples/kmmdemo/workload.yaml
"$kubectl" wait --for=condition=Ready pod/kmmdemo-workload --timeout=600s >/dev/null

say "what $NODE's kernel says"
"$KMM" sandbox node exec --dir "$DEMO_DIR" "$NODE" -- sh -c '
    echo "kernel $(uname -r); $(dmesg | grep -m1 -o "Secure boot enabled"); lockdown: $(cat /sys/kernel/security/lockdown)"
    lsmod | grep -e "^Module" -e kmmdemo
    echo "kmmdemo version $(cat /sys/module/kmmdemo/version), taint $(cat /sys/module/kmmdemo/taint) (O: out of tree; no E: its signature is trusted)"
    grep -q "^dummy " /proc/modules && echo "dummy: still loaded" || echo "dummy: removed"'
loader=$("$kubectl" get pods -l kmm.node.kubernetes.io/role=module-loader,kmm.node.kubernetes.io/module.name=kmmdemo -o jsonpath='{.items[0].metadata.name}')
kernel=$("$KMM" sandbox node exec --dir "$DEMO_DIR" "$NODE" -- uname -r)
echo "signer of the loader image's kmmdemo.ko: $("$kubectl" exec "$loader" -- modinfo -F signer "/opt/lib/modules/$kernel/kmmdemo.ko")"
echo "the sandbox's key: $(openssl x509 -in "$DEMO_DIR/secure-boot/signing.crt" -noout -subject)"
echo "what the workload read:"
"$kubectl" logs kmmdemo-workload

say "done"
echo "export KUBECONFIG=$KUBECONFIG; kubectl is $kubectl"
echo "operator: pid $(cat "$DEMO_DIR/operator.pid"), logs in $DEMO_DIR/operator.log; stop it all: make demo-stop"
