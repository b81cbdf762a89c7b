//go:build tools

// Package tools pins the containerd commands kmm sandbox builds for its
// container nodes: the daemon, the runc shim it starts containers through,
// and ctr, which imports the local pause image.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
