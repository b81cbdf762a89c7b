//go:build tools

// Package tools pins the Kubernetes 1.35 commands kmm sandbox builds: the
// control plane, the kubelet of its kubelet nodes (with the fake container
// runtime of ../../fakecri), the kube-proxy of its container and VM nodes,
// the kubectl of the same release, and the project's DRA test driver that
// kmm kubelet is checked against.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/test/e2e/dra/test-driver"
	// A command too (never compiled here: the tools tag is never set), named
	// so that go mod tidy keeps its requirement.
	_ "kmm.local/sandbox/fakecri"
)
