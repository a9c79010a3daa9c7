// Module image builds netplane's container image as an OCI archive without a
// Docker daemon or a registry (`make image`). go-containerregistry writes the
// layout; it stays out of netplane's own dependency graph.
module github.com/netplane/netplane/hack/tools/image

go 1.26.0

require github.com/google/go-containerregistry v0.22.1

require (
	github.com/klauspost/compress v1.19.2 // indirect
	github.com/opencontainers/go-digest v1.0.0 // indirect
	github.com/opencontainers/image-spec v1.1.1 // indirect
)
