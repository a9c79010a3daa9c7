//go:build tools

// Package coredns pins the command built by hack/build-anchors.sh.
package coredns

import _ "github.com/coredns/coredns"
