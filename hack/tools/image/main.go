// Command image packs bin/netplane and bin/netplane-cni into a container
// image and writes it as a docker-archive tarball, which `ctr images import`,
// `docker load` and `podman load` all accept:
//
//	go run . -bin ../../../bin -ref netplane/netplane:v0.1.0 -out netplane-image.tar
//
// The image has no shell and no libc (the binaries are static). netplane
// carries the file capability cap_net_bind_service+p so the DNS role can
// listen on port 53 as a non-root user with only NET_BIND_SERVICE, and every
// other role can run in a container that drops ALL.
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// netBindService is a struct vfs_cap_data (revision 2) granting
// CAP_NET_BIND_SERVICE (bit 10) permitted, not effective: with the
// effective bit the kernel would refuse to execute the binary in every
// container whose bounding set lacks the capability (the node agent's, the
// controller's); netplane makes it effective itself (internal/capability).
var netBindService = string([]byte{
	0x00, 0x00, 0x00, 0x02, // magic: revision 2, no effective bit
	0x00, 0x04, 0x00, 0x00, // permitted[0]: 1<<10
	0x00, 0x00, 0x00, 0x00, // inheritable[0]
	0x00, 0x00, 0x00, 0x00, // permitted[1]
	0x00, 0x00, 0x00, 0x00, // inheritable[1]
})

func main() {
	bin := flag.String("bin", "bin", "folder holding netplane and netplane-cni")
	ref := flag.String("ref", "netplane/netplane:latest", "image reference written into the archive")
	out := flag.String("out", "netplane-image.tar", "output docker-archive tarball")
	flag.Parse()
	if err := build(*bin, *ref, *out); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func build(bin, ref, out string) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return fmt.Errorf("reference %q: %w", ref, err)
	}
	layer, err := rootfs(bin)
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cfg = cfg.DeepCopy()
	cfg.Architecture, cfg.OS = "amd64", "linux"
	cfg.Created = v1.Time{Time: time.Unix(0, 0)} // reproducible: same binaries, same digest
	cfg.Config.Entrypoint = []string{"/usr/local/bin/netplane"}
	cfg.Config.Labels = map[string]string{"org.opencontainers.image.title": "netplane", "org.opencontainers.image.version": tag.TagStr()}
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		return err
	}
	tmp := out + ".tmp"
	if err := tarball.WriteToFile(tmp, tag, img); err != nil {
		return err
	}
	return os.Rename(tmp, out)
}

// rootfs makes the single layer: /usr/local/bin/{netplane,netplane-cni} and
// the folders the roles write to.
func rootfs(bin string) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	for _, dir := range []string{"usr/", "usr/local/", "usr/local/bin/", "etc/", "etc/netplane/", "tmp/"} {
		mode := int64(0o755)
		if dir == "tmp/" {
			mode = 0o1777
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: mode, ModTime: epoch}); err != nil {
			return nil, err
		}
	}
	for _, f := range []struct {
		name string
		caps bool
	}{{"netplane", true}, {"netplane-cni", false}} {
		data, err := os.ReadFile(filepath.Join(bin, f.name))
		if err != nil {
			return nil, fmt.Errorf("%w (run make build first)", err)
		}
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: "usr/local/bin/" + f.name, Mode: 0o755, Size: int64(len(data)), ModTime: epoch, Format: tar.FormatPAX}
		if f.caps {
			hdr.PAXRecords = map[string]string{"SCHILY.xattr.security.capability": netBindService}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
}
