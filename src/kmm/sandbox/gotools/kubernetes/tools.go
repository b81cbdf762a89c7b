//go:build tools

// Package tools pins the Kubernetes commands kmm sandbox builds: the control
// plane, the kubelet of its kubelet nodes (whose fake container runtime is
// ./fakecri) and the kube-proxy of its container nodes, the kubectl of the same release, and the project's DRA test
// driver that kmm kubelet is checked against.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/test/e2e/dra/test-driver"
)
