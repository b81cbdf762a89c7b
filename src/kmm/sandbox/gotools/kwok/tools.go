//go:build tools

// Package tools pins the kwok command kmm sandbox builds.
package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
