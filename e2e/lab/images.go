package lab

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/netplane/netplane/e2e/framework"
)

// Images the lab builds and imports into every node's containerd beside
// upstream's test images (upstream_images.go); no registry is involved.
const (
	TestImage     = "lab.local/testimage:dev"
	NetplaneImage = "lab.local/netplane:dev"
)

// netBindService is a struct vfs_cap_data (revision 2) granting
// CAP_NET_BIND_SERVICE permitted and effective, as hack/tools/image writes it.
var netBindService = string([]byte{0x01, 0, 0, 0x02, 0, 0x04, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})

// binaries are the programs the lab builds from the working tree.
type binaries struct {
	dir                                        string
	netplane, netplaneCNI, testimage, loopback string
	images                                     []string // docker-archive tars
}

// buildBinaries builds netplane, netplane-cni and the test program (all static, so they also run inside images) and packs the images.
func (l *Lab) buildBinaries(ctx context.Context) error {
	dir := l.path("bin")
	b := binaries{dir: dir,
		netplane: filepath.Join(dir, "netplane"), netplaneCNI: filepath.Join(dir, "netplane-cni"),
		testimage: filepath.Join(dir, "testimage"), loopback: filepath.Join(dir, "loopback")}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", dir+"/",
		"./cmd/netplane", "./cmd/netplane-cni", "./e2e/lab/testimage")
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
	for _, img := range []struct {
		ref, bin, name string
		entrypoint     []string
	}{
		{TestImage, b.testimage, "testimage", []string{"/testimage", "serve"}},
		// Where the product image (make image) has it, so the chart's
		// command works with the lab's image too.
		{NetplaneImage, b.netplane, "usr/local/bin/netplane", []string{"/usr/local/bin/netplane"}},
	} {
		tarPath := l.path("images", filepath.Base(img.name)+"-"+fmt.Sprint(len(b.images))+".tar")
		if err := writeImage(tarPath, img.ref, img.bin, img.name, img.entrypoint); err != nil {
			return fmt.Errorf("image %s: %w", img.ref, err)
		}
		b.images = append(b.images, tarPath)
	}
	if l.upstream() {
		tarPath := l.path("images", "coredns.tar")
		if err := writeImage(tarPath, coreDNSImage, framework.Binary("coredns"), "coredns", []string{"/coredns"}); err != nil {
			return fmt.Errorf("image %s: %w", coreDNSImage, err)
		}
		b.images = append(b.images, tarPath)
	}
	upstream, err := upstreamImages(l.path("images"))
	if err != nil {
		return fmt.Errorf("upstream test images: %w", err)
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
	prog := framework.File{Path: name, Data: data}
	if name == "usr/local/bin/netplane" {
		// As the product image (make image) has it: the chart runs the DNS
		// role as a non-root user binding port 53, and the kubelet keeps
		// only what the file capability grants.
		prog.Xattrs = map[string]string{"security.capability": netBindService}
	}
	return framework.WriteImageArchive(path, ref, entrypoint, append(files, prog))
}
