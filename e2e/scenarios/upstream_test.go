package scenarios

import (
	"encoding/xml"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/netplane/netplane/e2e/framework"
)

// conformanceTests is how many [sig-network] tests of the pinned
// k8s.io/kubernetes carry [Conformance]; a rename upstream shows here.
const conformanceTests = 47

// TestUpstreamNetworkConformance runs every [sig-network] [Conformance]
// test of Kubernetes' own e2e suite (e2e.test from hack/build-e2e.sh,
// unmodified) against the lab: upstream's test images on real kubelets,
// netplane for every network role. 4 ginkgo processes, as
// hack/conformance.sh runs them: about 70 s on 2 cores.
func TestUpstreamNetworkConformance(t *testing.T) {
	l := needReady(t)
	e2e := framework.RequireBinary(t, "e2e.test")
	ginkgo := framework.RequireBinary(t, "ginkgo")
	kubectl := framework.RequireBinary(t, "kubectl")
	dir := t.TempDir()
	cmd := exec.Command(ginkgo, "--procs=4", "--no-color", "--timeout=30m",
		`--focus=\[sig-network\].*\[Conformance\]`, e2e, "--",
		"--kubeconfig="+l.Kubeconfig, "--provider=skeleton",
		fmt.Sprintf("--num-nodes=%d", len(l.Nodes)), "--kubectl-path="+kubectl, "--report-dir="+dir)
	cmd.Dir = filepath.Join(framework.RepoRoot(), "hack", "tools", "kube") // the module pinning ginkgo
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
	passed := 0
	for _, c := range cases {
		switch {
		case c.Failure != nil:
			t.Errorf("FAIL %s\n%s", c.Name, c.Failure.Message)
		case c.Status == "passed" && strings.Contains(c.Name, "[Conformance]"):
			passed++
		}
	}
	if passed+countFailed(cases) != conformanceTests {
		t.Errorf("%d [sig-network] [Conformance] tests ran, want %d", passed+countFailed(cases), conformanceTests)
	}
	if runErr != nil && !t.Failed() {
		t.Errorf("ginkgo: %v; its log:\n%s", runErr, tail(logPath, 60))
	}
	t.Logf("%d of %d upstream Conformance tests passed in %v", passed, conformanceTests, time.Since(start).Round(time.Second))
}

func countFailed(cases []junitCase) int {
	n := 0
	for _, c := range cases {
		if c.Failure != nil {
			n++
		}
	}
	return n
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
