//go:build tools

// Package tools pins the helm command kmm sandbox builds: the chart in
// deploy/helm is linted, rendered and installed with it in the tests.
package tools

import _ "helm.sh/helm/v3/cmd/helm"
