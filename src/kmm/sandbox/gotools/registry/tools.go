//go:build tools

// Package tools pins the distribution registry kmm sandbox builds.
package tools

import _ "github.com/distribution/distribution/v3/cmd/registry"
