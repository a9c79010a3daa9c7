// Module flannel pins Flannel, the upstream system netplane's overlay
// benchmark compares against (`make anchors`). Nothing imports it: the pin
// and its go.sum hash are what hack/build-anchors.sh downloads and verifies
// before building flanneld from a copy (see there for the one edit).
module github.com/netplane/netplane/hack/tools/flannel

go 1.26.0

require github.com/flannel-io/flannel v0.28.10
