package scenarios

import (
	"encoding/xml"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/netplane/netplane/e2e/framework"
)

// conformanceSubset are the [sig-network] [Conformance] tests of
// Kubernetes' own e2e suite that `make test` runs against the lab, one or
// more for each part of netplane: cluster DNS, the EndpointSlice
// controller and its Endpoints mirroring, the Service proxier (ClusterIP,
// NodePort, session affinity, ports of two protocols), hostPort, and the
// pod network on and across nodes. `make conformance` runs all 47.
var conformanceSubset = []string{
	"DNS should provide DNS for the cluster",
	"DNS should provide DNS for services",
	"DNS should resolve DNS of partial qualified names for services",
	"DNS should provide DNS for pods for Hostname",
	"DNS should provide DNS for ExternalName services",
	"EndpointSlice should create Endpoints and EndpointSlices for Pods matching a Service",
	"EndpointSlice should support a Service with multiple ports specified in multiple EndpointSlices",
	"EndpointSliceMirroring should mirror a custom Endpoints resource through create update and delete",
	"Services should serve a basic endpoint from pods",
	"Services should serve multiport endpoints from pods",
	"Services should be able to create a functioning NodePort service",
	"Services should have session affinity work for service with type clusterIP",
	"Services should serve endpoints on same port and different protocols",
	"Services should be able to change the type from ExternalName to NodePort",
	"HostPort validates that there is no conflict between pods with same hostPort but different hostIP and protocol",
	"Networking Granular Checks: Pods should function for intra-pod communication: http",
	"Networking Granular Checks: Pods should function for node-pod communication: udp",
}

// TestUpstreamConformanceSubset runs conformanceSubset with upstream's
// e2e.test (hack/build-e2e.sh), unmodified, against the lab: upstream's
// own test images on real kubelets, netplane for every network role.
func TestUpstreamConformanceSubset(t *testing.T) {
	l := needReady(t)
	e2e := framework.RequireBinary(t, "e2e.test")
	kubectl := framework.RequireBinary(t, "kubectl")
	var focus []string
	for _, name := range conformanceSubset {
		focus = append(focus, regexp.QuoteMeta(name))
	}
	dir := t.TempDir()
	cmd := exec.Command(e2e, "--kubeconfig="+l.Kubeconfig, "--provider=skeleton",
		fmt.Sprintf("--num-nodes=%d", len(l.Nodes)), "--kubectl-path="+kubectl,
		"--report-dir="+dir, "--ginkgo.no-color", "--ginkgo.timeout=40m",
		`--ginkgo.focus=\[sig-network\] (`+strings.Join(focus, "|")+`).*\[Conformance\]`)
	logPath := filepath.Join(dir, "e2e.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	start := time.Now()
	runErr := cmd.Run()
	logFile.Close()
	cases, err := readJUnit(filepath.Join(dir, "junit_01.xml"))
	if err != nil {
		t.Fatalf("e2e.test: %v (%v); its log:\n%s", err, runErr, tail(logPath, 60))
	}
	ran := map[string]bool{}
	for _, c := range cases {
		if c.Status == "skipped" {
			continue
		}
		for _, name := range conformanceSubset {
			if strings.Contains(c.Name, name) {
				ran[name] = true
			}
		}
		if c.Failure != nil {
			t.Errorf("FAIL %s\n%s", c.Name, c.Failure.Message)
		}
	}
	for _, name := range conformanceSubset {
		if !ran[name] {
			t.Errorf("%q did not run: renamed upstream, or skipped", name)
		}
	}
	if runErr != nil && !t.Failed() {
		t.Errorf("e2e.test: %v; its log:\n%s", runErr, tail(logPath, 60))
	}
	t.Logf("%d upstream Conformance tests in %v", len(ran), time.Since(start).Round(time.Second))
}

type junitCase struct {
	Name    string `xml:"name,attr"`
	Status  string `xml:"status,attr"`
	Failure *struct {
		Message string `xml:"message,attr"`
	} `xml:"failure"`
}

// readJUnit returns the test cases of ginkgo's JUnit report.
func readJUnit(path string) ([]junitCase, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var report struct {
		Suites []struct {
			Cases []junitCase `xml:"testcase"`
		} `xml:"testsuite"`
	}
	if err := xml.Unmarshal(data, &report); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var cases []junitCase
	for _, s := range report.Suites {
		cases = append(cases, s.Cases...)
	}
	return cases, nil
}

func tail(path string, lines int) string {
	data, _ := os.ReadFile(path)
	all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}
