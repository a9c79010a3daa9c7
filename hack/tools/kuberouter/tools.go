//go:build tools

// Package kuberouter pins the command built by hack/build-anchors.sh.
package kuberouter

import _ "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router"
