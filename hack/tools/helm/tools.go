//go:build tools

// Module helm builds the helm command from the Helm version the chart's
// tests pin (charts/go.mod), for the lab's `helm install` of the chart as a
// user runs it. It is its own module so that Helm's dependencies enter
// neither netplane's binaries nor the chart tests' graph.
package tools

import _ "helm.sh/helm/v4/cmd/helm"
