//go:build tools

// Package tools pins the runc command kmm sandbox builds.
package tools

import _ "github.com/opencontainers/runc"
