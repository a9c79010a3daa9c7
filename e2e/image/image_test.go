// Package image tests `make image`: the archive it writes imports into a real
// containerd, runs, and keeps the file capability the DNS role needs.
package image

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/netns"
)

// TestMain removes the binaries the tests built.
func TestMain(m *testing.M) { framework.Main(m) }

const ref = "docker.io/netplane/netplane:test"

func TestImageImportsIntoContainerdAndRuns(t *testing.T) {
	framework.RequireRoot(t)
	containerdBin := framework.RequireBinary(t, "containerd")
	ctrBin := framework.RequireBinary(t, "ctr")
	framework.RequireBinary(t, "runc")
	bin := framework.NetplaneBinaries(t)
	dir := framework.TempDir(t, "npimage")

	archive := filepath.Join(dir, "netplane-image.tar")
	build := exec.Command("go", "run", ".", "-bin", bin, "-ref", ref, "-out", archive)
	build.Dir = filepath.Join(framework.RepoRoot(), "hack", "tools", "image")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("image tool: %v\n%s", err, out)
	}

	// containerd runs in a namespace of its own, with its own root, state
	// and socket, so nothing of the machine's is touched.
	sock := filepath.Join(dir, "containerd.sock")
	conf := filepath.Join(dir, "config.toml")
	os.WriteFile(conf, []byte(`version = 2
root = "`+filepath.Join(dir, "root")+`"
state = "`+filepath.Join(dir, "state")+`"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "`+sock+`"
`), 0o600)
	ns := netns.New(t, "image")
	framework.RemoveNewCgroups(t, "netplane-test") // the ctr namespace below
	p := ns.Start(t, containerdBin, "--config", conf)
	defer p.Stop(10 * time.Second)
	ctr := func(args ...string) (string, error) {
		out, err := exec.Command(ctrBin, append([]string{"-a", sock, "-n", "netplane-test"}, args...)...).CombinedOutput()
		return string(out), err
	}
	framework.Eventually(t, 30*time.Second, "containerd answers", func() error {
		if out, err := ctr("version"); err != nil {
			return errors.New(out)
		}
		return nil
	})
	if out, err := ctr("images", "import", archive); err != nil {
		t.Fatalf("ctr images import: %v\n%s", err, out)
	}
	out, err := ctr("run", "--rm", ref, "netplane-version", "/usr/local/bin/netplane", "version")
	if err != nil || !strings.Contains(out, "netplane ") {
		t.Fatalf("running the image: %v\n%s", err, out)
	}
	t.Logf("the imported image runs: %s", strings.TrimSpace(out))

	// The unpacked netplane binary carries cap_net_bind_service+ep.
	found := ""
	filepath.Walk(filepath.Join(dir, "root"), func(path string, info os.FileInfo, err error) error {
		if err != nil || found != "" || !strings.HasSuffix(path, "/usr/local/bin/netplane") {
			return nil
		}
		buf := make([]byte, 64)
		n, err := unix.Getxattr(path, "security.capability", buf)
		if err != nil {
			t.Errorf("%s has no file capability: %v", path, err)
		} else if n < 8 || buf[4] != 0x00 || buf[5] != 0x04 {
			t.Errorf("%s capability % x, want cap_net_bind_service", path, buf[:n])
		}
		found = path
		return nil
	})
	if found == "" {
		t.Fatal("the unpacked image has no /usr/local/bin/netplane")
	}
	// Let the DNS user reach the unpacked binary (the test's own folders).
	for d := filepath.Dir(found); strings.HasPrefix(d, dir); d = filepath.Dir(d) {
		if st, err := os.Stat(d); err == nil {
			os.Chmod(d, st.Mode().Perm()|0o011)
		}
	}
	dnsAsNonRoot(t, found, dir)
}

// dnsAsNonRoot runs the image's binary as the chart's DNS user (65532, no
// capability of its own) and checks that the file capability alone lets it
// listen on port 53 (dir is a folder that user can read): it answers SERVFAIL for the cluster zone while it
// cannot reach an API server, as it does before its first sync.
func dnsAsNonRoot(t *testing.T, bin, dir string) {
	ns := netns.New(t, "dnsuser")
	ns.MustExec(t, "ip", "link", "set", "lo", "up")
	kubeconfig := filepath.Join(dir, "kubeconfig")
	os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o644)
	// nsenter switches the user after entering the namespace, then execs.
	cmd := exec.Command("nsenter", "--net="+ns.Path, "--setuid=65532", "--setgid=65532", "--",
		bin, "--role=dns", "--kubeconfig="+kubeconfig, "--dns-bind-address=127.0.0.1:53",
		"--upstream-servers=127.0.0.1:1", "--health-bind-address=127.0.0.1:0", "--metrics-bind-address=127.0.0.1:0")
	p, err := ns.StartCmd(cmd, filepath.Join(t.TempDir(), "dns.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop(5 * time.Second)
	framework.Eventually(t, 30*time.Second, "the DNS role, as uid 65532, answers on port 53", func() error {
		out, err := ns.Exec("dig", "+time=1", "+tries=1", "@127.0.0.1", "kubernetes.default.svc.cluster.local", "A")
		if err != nil || !strings.Contains(out, "status: SERVFAIL") {
			return fmt.Errorf("dig: %v %s\n%s", err, out, p.Tail(5))
		}
		return nil
	})
}
