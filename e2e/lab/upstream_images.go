package lab

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/netplane/netplane/e2e/framework"
)

// Upstream's test images, under the names Kubernetes' e2e suite asks for
// (k8s.io/kubernetes test/utils/image/manifest.go at the pinned version),
// built here so the suite runs unmodified and nothing is pulled.
const (
	PauseImage       = "registry.k8s.io/pause:3.10.2"
	agnhostImage     = "registry.k8s.io/e2e-test-images/agnhost:2.66.1"
	agnhostPrevImage = "registry.k8s.io/e2e-test-images/agnhost:2.55"
	// network-policy-api v0.3.0's conformance suite's (conformance/base).
	agnhostCNPImage    = "registry.k8s.io/e2e-test-images/agnhost:2.45"
	busyboxImage       = "registry.k8s.io/e2e-test-images/busybox:1.37.0-2"
	glibcDNSImage      = "registry.k8s.io/e2e-test-images/glibc-dns-testing:2.1.1"
	nginxImage         = "registry.k8s.io/e2e-test-images/nginx:1.27.0-2"
	nginxNewImage      = "registry.k8s.io/e2e-test-images/nginx:1.28.0-2"
	regression74839    = "registry.k8s.io/e2e-test-images/regression-issue-74839:1.5"
	distrolessIPTables = "registry.k8s.io/build-image/distroless-iptables:v0.9.7"
	upstreamImagesTar  = "upstream-images.tar"
)

// debianTools are the programs upstream's tests run inside agnhost and
// glibc-dns-testing (Alpine's and Debian's userland there), taken from
// this machine's Debian packages with the libraries they load; the name
// on the left is where the image has it.
var debianTools = map[string]string{
	"bin/bash": "bash", "bin/sh": "dash", "usr/bin/curl": "curl", "usr/bin/nc": "nc.openbsd",
	"usr/bin/dig": "dig", "usr/bin/nslookup": "nslookup", "usr/bin/host": "host",
	"usr/bin/getent": "getent", "sbin/ip": "ip", "usr/bin/ss": "ss", "usr/bin/socat": "socat",
	"usr/sbin/nginx": "nginx", "usr/sbin/conntrack": "conntrack", "usr/local/bin/iperf": "iperf",
	// Debian's busybox 1.35 crashes in `wget -T` (its timeout), which the
	// Service tests run in agnhost: GNU wget takes the same options.
	"usr/bin/wget": "wget",
}

// upstreamImages packs the test images into one docker-archive in dir:
// a busybox layer (Debian's static busybox, one link per applet), a
// Debian layer above it with debianTools, and a small top layer per image.
// The binaries agnhost, pause and regression-issue-74839 come from the
// pinned module, coredns (which agnhost and glibc-dns-testing carry as
// /coredns, for the DNS tests' own servers) from CoreDNS's (make tools).
// Only pause is needed by every lab; the demo's tools leave out the other
// three (upstream's suites alone run them), and the images made of them
// are then left out too, named in missing.
func upstreamImages(dir string) (archive string, missing []string, err error) {
	bins := map[string][]byte{}
	for _, name := range []string{"agnhost", "pause", "regression-issue-74839", "coredns"} {
		p := framework.Binary(name)
		if p == "" && name != "pause" {
			missing = append(missing, name)
			continue
		}
		if p == "" {
			return "", nil, fmt.Errorf("%s not found in %s: run `make tools` as root", name, framework.BinDir())
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return "", nil, err
		}
		bins[name] = data
	}
	base, err := busyboxLayer()
	if err != nil {
		return "", nil, err
	}
	debian, err := debianLayer()
	if err != nil {
		return "", nil, err
	}
	var porter []framework.File
	if bins["agnhost"] != nil {
		if porter, err = porterCerts(); err != nil {
			return "", nil, err
		}
	}
	coredns := &framework.Layer{Files: []framework.File{{Path: "coredns", Data: bins["coredns"]}}}
	agnhost := &framework.Layer{Files: append([]framework.File{
		{Path: "agnhost", Data: bins["agnhost"]},
		{Path: "agnhost-2", Link: "agnhost"},
		{Path: "uploads/"},
	}, porter...)}
	nginx := &framework.Layer{Files: []framework.File{
		{Path: "etc/nginx/"}, {Path: "var/log/nginx/"}, {Path: "var/lib/nginx/"}, {Path: "usr/share/nginx/html/"},
		{Path: "etc/nginx/nginx.conf", Data: []byte(nginxConf), Mode: 0o644},
		{Path: "usr/share/nginx/html/index.html", Data: []byte("<!DOCTYPE html>\n<html><body><h1>Welcome to nginx!</h1></body></html>\n"), Mode: 0o644},
	}}
	path := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	images := []framework.Image{
		{Ref: PauseImage, Layers: []*framework.Layer{{Files: []framework.File{{Path: "pause", Data: bins["pause"]}}}}, Entrypoint: []string{"/pause"}},
		{Ref: busyboxImage, Layers: []*framework.Layer{base}, Cmd: []string{"sh"}, Env: path},
		{Ref: agnhostImage, Layers: []*framework.Layer{base, debian, coredns, agnhost}, Entrypoint: []string{"/agnhost"}, Cmd: []string{"pause"}, Env: path},
		{Ref: agnhostPrevImage, Layers: []*framework.Layer{base, debian, coredns, agnhost}, Entrypoint: []string{"/agnhost"}, Cmd: []string{"pause"}, Env: path},
		{Ref: agnhostCNPImage, Layers: []*framework.Layer{base, debian, coredns, agnhost}, Entrypoint: []string{"/agnhost"}, Cmd: []string{"pause"}, Env: path},
		{Ref: glibcDNSImage, Layers: []*framework.Layer{base, debian, coredns}, Cmd: []string{"bash"}, Env: path},
		{Ref: nginxImage, Layers: []*framework.Layer{base, debian, nginx}, Entrypoint: []string{"nginx", "-g", "daemon off;"}, Env: path},
		{Ref: nginxNewImage, Layers: []*framework.Layer{base, debian, nginx}, Entrypoint: []string{"nginx", "-g", "daemon off;"}, Env: path},
		// kube-proxy's own image, which a test runs on the host network
		// to read the node's conntrack table.
		{Ref: distrolessIPTables, Layers: []*framework.Layer{base, debian}, Cmd: []string{"sh"}, Env: path},
		{Ref: regression74839, Layers: []*framework.Layer{base, {Files: []framework.File{{Path: "regression-issue-74839", Data: bins["regression-issue-74839"]}}}},
			Entrypoint: []string{"/regression-issue-74839"}, Env: path},
	}
	needs := map[string][]string{agnhostImage: {"agnhost", "coredns"}, agnhostPrevImage: {"agnhost", "coredns"},
		glibcDNSImage: {"coredns"}, regression74839: {"regression-issue-74839"}}
	images = slices.DeleteFunc(images, func(im framework.Image) bool {
		return slices.ContainsFunc(needs[im.Ref], func(b string) bool { return bins[b] == nil })
	})
	out := filepath.Join(dir, upstreamImagesTar)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", nil, err
	}
	return out, missing, framework.WriteImagesArchive(out, images)
}

// nginxConf serves the welcome page on port 80, as the upstream image does.
const nginxConf = `user nobody nogroup;
worker_processes 1;
pid /run/nginx.pid;
error_log /dev/stderr;
events { worker_connections 256; }
http {
	access_log /dev/stdout;
	server {
		listen 80;
		listen [::]:80;
		root /usr/share/nginx/html;
		index index.html;
	}
}
`

// busyboxLayer is Debian's static busybox with a link per applet, and the
// files every image needs: directories, users and groups (the agnhost
// image's user-defined-in-image among them) and name-service settings.
func busyboxLayer() (*framework.Layer, error) {
	bb, err := exec.LookPath("busybox")
	if err != nil {
		return nil, fmt.Errorf("busybox (Debian's busybox-static) not installed: run `make tools` as root")
	}
	data, err := os.ReadFile(bb)
	if err != nil {
		return nil, err
	}
	list, err := exec.Command(bb, "--list-full").Output()
	if err != nil {
		return nil, fmt.Errorf("busybox --list-full: %w", err)
	}
	files := []framework.File{}
	for _, d := range []string{"bin/", "sbin/", "usr/", "usr/bin/", "usr/sbin/", "usr/local/", "usr/local/bin/", "etc/", "proc/", "sys/", "dev/", "var/", "var/run/", "run/", "root/", "home/", "results/"} {
		files = append(files, framework.File{Path: d})
	}
	files = append(files, framework.File{Path: "tmp/", Mode: 0o1777}, framework.File{Path: "bin/busybox", Data: data})
	for _, applet := range strings.Fields(string(list)) {
		if applet != "bin/busybox" {
			files = append(files, framework.File{Path: applet, Link: "/bin/busybox"})
		}
	}
	etc := map[string]string{
		"etc/passwd":        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\nuser-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\n",
		"etc/group":         "root:x:0:\nnogroup:x:65534:\nuser-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n",
		"etc/nsswitch.conf": "hosts: files dns\nnetworks: files\npasswd: files\ngroup: files\nservices: files\nprotocols: files\n",
		"etc/hosts":         "127.0.0.1 localhost\n",
	}
	for p, c := range etc {
		files = append(files, framework.File{Path: p, Data: []byte(c), Mode: 0o644})
	}
	for _, p := range []string{"/etc/services", "/etc/protocols"} {
		if data, err := os.ReadFile(p); err == nil {
			files = append(files, framework.File{Path: p[1:], Data: data, Mode: 0o644})
		}
	}
	sort.Slice(files, func(i, j int) bool { return files[i].Path < files[j].Path })
	return &framework.Layer{Files: files}, nil
}

// debianLayer copies debianTools and every shared library they load (as
// ldd lists them) from this machine.
func debianLayer() (*framework.Layer, error) {
	libs := map[string]bool{}
	var files []framework.File
	var missing []string
	dests := make([]string, 0, len(debianTools))
	for d := range debianTools {
		dests = append(dests, d)
	}
	sort.Strings(dests)
	for _, dest := range dests {
		src := framework.Binary(debianTools[dest])
		if src == "" {
			missing = append(missing, debianTools[dest])
			continue
		}
		data, err := os.ReadFile(src)
		if err != nil {
			return nil, err
		}
		files = append(files, framework.File{Path: dest, Data: data})
		deps, err := sharedLibraries(src)
		if err != nil {
			return nil, err
		}
		for _, l := range deps {
			libs[l] = true
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("not installed: %s: run `make tools` as root", strings.Join(missing, ", "))
	}
	dirs := map[string]bool{}
	for l := range libs {
		data, err := os.ReadFile(l)
		if err != nil {
			return nil, err
		}
		for d := filepath.Dir(l); d != "/"; d = filepath.Dir(d) {
			dirs[d[1:]+"/"] = true
		}
		files = append(files, framework.File{Path: l[1:], Data: data})
	}
	for d := range dirs {
		files = append(files, framework.File{Path: d})
	}
	sort.Slice(files, func(i, j int) bool { return files[i].Path < files[j].Path })
	return &framework.Layer{Files: files}, nil
}

var lddPath = regexp.MustCompile(`(/\S+) \(0x`)

// sharedLibraries lists the absolute paths ldd reports for a binary,
// the dynamic loader included; none for a static binary.
func sharedLibraries(bin string) ([]string, error) {
	out, err := exec.Command("ldd", bin).CombinedOutput()
	if err != nil {
		if bytes.Contains(out, []byte("not a dynamic executable")) {
			return nil, nil
		}
		return nil, fmt.Errorf("ldd %s: %v: %s", bin, err, out)
	}
	var libs []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if m := lddPath.FindStringSubmatch(sc.Text()); m != nil {
			libs = append(libs, m[1])
		}
	}
	return libs, nil
}

// porterCerts are the TLS files agnhost's porter serves with, from the
// pinned module's source.
func porterCerts() ([]framework.File, error) {
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "k8s.io/kubernetes")
	cmd.Dir = filepath.Join(framework.RepoRoot(), "hack", "tools", "kube")
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list k8s.io/kubernetes: %w", err)
	}
	return readModuleFiles(strings.TrimSpace(string(out)), "test/images/agnhost/porter", "localhost.crt", "localhost.key")
}

func readModuleFiles(root, dir string, names ...string) ([]framework.File, error) {
	var files []framework.File
	for _, n := range names {
		data, err := os.ReadFile(filepath.Join(root, dir, n))
		if err != nil {
			return nil, err
		}
		files = append(files, framework.File{Path: n, Data: data, Mode: 0o644})
	}
	return files, nil
}
