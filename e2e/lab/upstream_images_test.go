package lab

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/netplane/netplane/e2e/framework"
)

// Every tool upstream's tests call inside agnhost, busybox, nginx and
// glibc-dns-testing runs from the image's own files: the archive is
// unpacked layer by layer as containerd does and each command runs
// chrooted into it, so a library left out fails here, not in a pod.
func TestUpstreamImagesRunTheirTools(t *testing.T) {
	framework.RequireRoot(t)
	for _, b := range []string{"agnhost", "pause", "regression-issue-74839", "coredns", "busybox"} {
		framework.RequireBinary(t, b)
	}
	archive, _, err := upstreamImages(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	roots := unpackImages(t, archive)
	for _, tc := range []struct {
		image string
		argv  []string
		want  string
	}{
		{agnhostImage, []string{"/agnhost", "--help"}, "netexec"},
		{agnhostImage, []string{"/coredns", "-version"}, "CoreDNS-1."},
		{glibcDNSImage, []string{"/coredns", "-version"}, "CoreDNS-1."},
		{agnhostImage, []string{"/bin/sh", "-c", "seq 1 3 | tail -1"}, "3"},
		{agnhostImage, []string{"curl", "--version"}, "curl 7"},
		{agnhostImage, []string{"sh", "-c", "wget -q -O - -T 1 http://127.0.0.1:1; echo rc=$?"}, "rc=4"},
		{agnhostImage, []string{"nc", "-h"}, "OpenBSD netcat"},
		{agnhostImage, []string{"dig", "-v"}, "DiG 9"},
		{agnhostImage, []string{"nslookup", "-version"}, "nslookup 9"},
		{agnhostImage, []string{"getent", "hosts", "localhost"}, "127.0.0.1"},
		{agnhostImage, []string{"ip", "-V"}, "iproute2"},
		{agnhostImage, []string{"id", "user-defined-in-image"}, "group-defined-in-image"},
		{agnhostImage, []string{"cat", "/localhost.crt"}, "BEGIN CERTIFICATE"},
		{glibcDNSImage, []string{"bash", "-c", `test -n "$(getent hosts localhost)" && echo ok`}, "ok"},
		{busyboxImage, []string{"sh", "-c", "nc 2>&1; wget --help 2>&1 | head -1"}, "BusyBox"},
		{nginxImage, []string{"nginx", "-t"}, "syntax is ok"},
		{distrolessIPTables, []string{"conntrack", "--version"}, "conntrack v1"},
		{agnhostImage, []string{"iperf", "--version"}, "iperf version 2"},
		{PauseImage, []string{"/pause", "-v"}, "pause.c"},
	} {
		t.Run(strings.Fields(strings.TrimPrefix(tc.image, "registry.k8s.io/"))[0]+" "+tc.argv[0], func(t *testing.T) {
			cmd := exec.Command(tc.argv[0], tc.argv[1:]...)
			if !strings.HasPrefix(tc.argv[0], "/") {
				cmd.Path = "/usr/bin/env"
				cmd.Args = append([]string{"env", "PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, tc.argv...)
			}
			cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: roots[tc.image]}
			cmd.Dir = "/"
			out, _ := cmd.CombinedOutput()
			if !strings.Contains(string(out), tc.want) {
				t.Errorf("%v in %s: want %q in\n%s", tc.argv, tc.image, tc.want, out)
			}
		})
	}
}

// unpackImages extracts every image of a docker-archive into its own
// folder, lower layers first, and returns the folders by reference.
func unpackImages(t *testing.T, archive string) map[string]string {
	t.Helper()
	data, err := os.ReadFile(archive)
	if err != nil {
		t.Fatal(err)
	}
	entries := tarEntries(t, data)
	var manifest []struct {
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(entries["manifest.json"], &manifest); err != nil {
		t.Fatal(err)
	}
	roots := map[string]string{}
	for i, m := range manifest {
		root := filepath.Join(t.TempDir(), "rootfs", string(rune('a'+i)))
		for _, l := range m.Layers {
			if err := untar(root, entries[l]); err != nil {
				t.Fatalf("%s %s: %v", m.RepoTags[0], l, err)
			}
		}
		roots[m.RepoTags[0]] = root
	}
	return roots
}

// untar applies one layer: a later entry replaces what is at its path.
func untar(root string, layer []byte) error {
	tr := tar.NewReader(bytes.NewReader(layer))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		p := filepath.Join(root, h.Name)
		if h.Typeflag != tar.TypeDir {
			os.Remove(p)
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, os.FileMode(h.Mode))
		case tar.TypeSymlink:
			err = os.Symlink(h.Linkname, p)
		default:
			var body []byte
			body, err = io.ReadAll(tr)
			if err == nil {
				err = os.WriteFile(p, body, os.FileMode(h.Mode))
			}
		}
		if err != nil {
			return err
		}
	}
}

// tarEntries reads a tarball's regular files by name.
func tarEntries(t *testing.T, data []byte) map[string][]byte {
	t.Helper()
	entries := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return entries
		}
		if err != nil {
			t.Fatal(err)
		}
		entries[h.Name], _ = io.ReadAll(tr)
	}
}
