//go:build tools

// Package tools pins the registry command kmm sandbox builds.
package tools

import _ "github.com/distribution/distribution/v3/cmd/registry"
