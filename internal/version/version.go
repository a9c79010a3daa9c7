// Package version holds the build's identity, set by the Makefile with
// -ldflags "-X github.com/netplane/netplane/internal/version.Version=...".
package version

import (
	"fmt"
	"runtime"
)

var (
	// Version is the release, or a git describe of the build.
	Version = "v0.0.0-dev"
	// Commit is the git commit of the build.
	Commit = "unknown"
)

// String is what `netplane version` prints.
func String() string {
	return fmt.Sprintf("netplane %s (commit %s, %s %s/%s)", Version, Commit, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
