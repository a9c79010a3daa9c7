package lab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Exec runs a command in a running container of a pod (the first one) as
// `kubectl exec` would, through CRI ExecSync on the pod's node, and returns
// its stdout; a non-zero exit is an error carrying stderr. Every pod image
// of the lab holds /testimage, the client for HTTP, UDP and DNS checks.
func (l *Lab) Exec(ctx context.Context, namespace, pod string, argv ...string) (string, error) {
	p, err := l.Client.CoreV1().Pods(namespace).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	n := l.Node(p.Spec.NodeName)
	if n == nil {
		return "", fmt.Errorf("pod %s/%s is on node %q, not one of the lab's", namespace, pod, p.Spec.NodeName)
	}
	c, err := DialCRI(n.Socket)
	if err != nil {
		return "", err
	}
	defer c.Close()
	id, err := c.podContainer(ctx, string(p.UID), "")
	if err != nil {
		return "", err
	}
	resp, err := c.Runtime.ExecSync(ctx, &cri.ExecSyncRequest{ContainerId: id, Cmd: argv, Timeout: 10})
	if err != nil {
		return "", fmt.Errorf("exec in %s/%s: %w", namespace, pod, err)
	}
	if resp.ExitCode != 0 {
		return string(resp.Stdout), fmt.Errorf("%s in %s/%s exited %d: %s%s", strings.Join(argv, " "), namespace, pod, resp.ExitCode,
			strings.TrimSpace(string(resp.Stderr)), strings.TrimSpace(string(resp.Stdout)))
	}
	return string(resp.Stdout), nil
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
