package lab

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/netplane/netplane/e2e/framework"
)

// TestImage is the image of the lab's test program, which the lab builds
// and imports into every node's containerd beside the product image (`make
// image`) and upstream's test images (upstream_images.go); no registry is
// involved.
const TestImage = "lab.local/testimage:dev"

// binaries are the programs the lab uses: the test program and the
// loopback CNI plugin, which it builds into its state directory, and the
// image archives it imports.
type binaries struct {
	dir                 string
	testimage, loopback string
	images              []string // image archives
}

// buildBinaries builds the test program and the loopback plugin (static, so
// they also run inside images) and packs the test image; netplane itself
// comes as the product image that `make image` packed from `make build`'s
// binaries, so that the lab runs what users install and nothing is
// compiled twice.
func (l *Lab) buildBinaries(ctx context.Context) error {
	dir := l.path("bin")
	b := binaries{dir: dir, testimage: filepath.Join(dir, "testimage"), loopback: filepath.Join(dir, "loopback")}
	product := filepath.Join(framework.BinDir(), "netplane-image.tar")
	if !l.upstream() {
		if _, err := os.Stat(product); err != nil {
			return fmt.Errorf("the netplane image: %w (run `make image`)", err)
		}
		b.images = append(b.images, product)
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", b.testimage, "./e2e/lab/testimage")
	cmd.Dir = framework.RepoRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %v\n%s", err, out)
	}
	// containerd 1.6 always runs the "loopback" CNI plugin beside the
	// node's network; a node image ships it (kind's does). It comes from the
	// module that pins the reference plugins.
	cmd = exec.CommandContext(ctx, "go", "build", "-o", b.loopback, "github.com/containernetworking/plugins/plugins/main/loopback")
	cmd.Dir = filepath.Join(framework.RepoRoot(), "hack", "tools", "cniplugins")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build loopback: %v\n%s", err, out)
	}
	tarPath := l.path("images", "testimage.tar")
	if err := writeImage(tarPath, TestImage, b.testimage, "testimage", []string{"/testimage", "serve"}); err != nil {
		return fmt.Errorf("image %s: %w", TestImage, err)
	}
	b.images = append(b.images, tarPath)
	if l.upstream() {
		tarPath := l.path("images", "coredns.tar")
		if err := writeImage(tarPath, coreDNSImage, framework.Binary("coredns"), "coredns", []string{"/coredns"}); err != nil {
			return fmt.Errorf("image %s: %w", coreDNSImage, err)
		}
		b.images = append(b.images, tarPath)
	}
	upstream, missing, err := upstreamImages(l.path("images"))
	if err != nil {
		return fmt.Errorf("upstream test images: %w", err)
	}
	if len(missing) > 0 {
		l.Config.Log("lab: upstream's test images without %s (not built by the demo's tools; `make tools` builds them for `make conformance`)", strings.Join(missing, ", "))
	}
	b.images = append(b.images, upstream)
	l.bin = b
	return nil
}

// writeImage packs one static binary as a docker-archive (what `docker
// save` writes and `ctr images import` reads), with the directories a
// container needs.
func writeImage(path, ref, bin, name string, entrypoint []string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		return err
	}
	var files []framework.File
	for _, d := range []string{"etc/", "tmp/", "proc/", "sys/", "dev/", "var/", "var/run/", "run/", "usr/", "usr/local/", "usr/local/bin/"} {
		mode := int64(0o755)
		if d == "tmp/" {
			mode = 0o1777
		}
		files = append(files, framework.File{Path: d, Mode: mode})
	}
	return framework.WriteImageArchive(path, ref, entrypoint, append(files, framework.File{Path: name, Data: data}))
}
