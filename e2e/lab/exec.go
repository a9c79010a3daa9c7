package lab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"
)

// Exec runs a command in the first container of a pod, as `kubectl exec`
// does: through the API server's pods/exec, which reaches the pod's kubelet.
// It returns stdout; a non-zero exit is an error carrying stderr. Every pod
// image of the lab holds /testimage, the client for HTTP, UDP and DNS
// checks.
func (l *Lab) Exec(ctx context.Context, namespace, pod string, argv ...string) (string, error) {
	req := l.Client.CoreV1().RESTClient().Post().Resource("pods").Namespace(namespace).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Command: argv, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ex, err := remotecommand.NewSPDYExecutor(l.RestConfig, "POST", req.URL())
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	err = ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &stdout, Stderr: &stderr})
	var exit utilexec.ExitError
	switch {
	case errors.As(err, &exit):
		return stdout.String(), fmt.Errorf("%s in %s/%s exited %d: %s%s", strings.Join(argv, " "), namespace, pod, exit.ExitStatus(),
			strings.TrimSpace(stderr.String()), strings.TrimSpace(stdout.String()))
	case err != nil:
		return stdout.String(), fmt.Errorf("exec in %s/%s: %w", namespace, pod, err)
	}
	return stdout.String(), nil
}

// Node is the lab node of that name, or nil.
func (l *Lab) Node(name string) *Node {
	for _, n := range l.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// ExternalExec runs the test program in the external client's namespace (the
// machine's view from outside the cluster, on the underlay).
func (l *Lab) ExternalExec(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + l.External.Path, "--", l.bin.testimage}, args...)...)
	out, err := cmd.Output()
	if err != nil {
		msg := err.Error()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			msg += ": " + strings.TrimSpace(string(ee.Stderr))
		}
		return string(out), fmt.Errorf("testimage %s from the external client: %s", strings.Join(args, " "), msg)
	}
	return string(out), ctx.Err()
}

// Ready is nil when the kubelet reports the node Ready, else says why not.
func (n *Node) Ready(ctx context.Context) error {
	node, err := n.lab.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
			return nil
		}
		if c.Type == corev1.NodeReady {
			cni := "netplane --role=node has not written a CNI configuration into " + n.CNIConf
			if n.hasCNIConfig() {
				cni = "the CNI configuration is written"
			}
			return fmt.Errorf("node %s is not Ready (%s: %s; %s)", n.Name, c.Reason, c.Message, cni)
		}
	}
	return fmt.Errorf("node %s has no Ready condition yet", n.Name)
}

func (n *Node) hasCNIConfig() bool {
	entries, _ := os.ReadDir(n.CNIConf)
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".conflist") || strings.HasSuffix(e.Name(), ".conf") {
			return true
		}
	}
	return false
}

// podProblems summarises why pods matching selector are not ready.
func (l *Lab) podProblems(ctx context.Context, namespace, selector string) string {
	pods, err := l.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, p := range pods.Items {
		s := fmt.Sprintf("%s on %q: %s", p.Name, p.Spec.NodeName, p.Status.Phase)
		for _, c := range p.Status.Conditions {
			if c.Type == "Ready" {
				s += " Ready=" + string(c.Status)
			}
		}
		out = append(out, s)
	}
	if len(out) == 0 {
		return "no pods"
	}
	return strings.Join(out, "; ")
}

// TestProgram is the lab's test program (testimage) on the machine, to run
// in a host's namespace.
func (l *Lab) TestProgram() string { return l.bin.testimage }
