//go:build tools

// Package tools pins the etcd server command kmm sandbox builds.
package tools

import _ "go.etcd.io/etcd/server/v3"
