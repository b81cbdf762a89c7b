//go:build tools

// Package tools pins the CNI plugins kmm sandbox builds: bridge and
// host-local for pod networking, loopback for each pod's lo, portmap for
// hostPorts.
package tools

import (
	_ "github.com/containernetworking/plugins/plugins/ipam/host-local"
	_ "github.com/containernetworking/plugins/plugins/main/bridge"
	_ "github.com/containernetworking/plugins/plugins/main/loopback"
	_ "github.com/containernetworking/plugins/plugins/meta/portmap"
)
