package lab

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/netplane/netplane/e2e/framework"
)

// CRI is a client of one node's containerd over its CRI socket.
type CRI struct {
	Runtime cri.RuntimeServiceClient
	Images  cri.ImageServiceClient
	conn    *grpc.ClientConn
}

// DialCRI connects to a containerd CRI socket.
func DialCRI(socket string) (*CRI, error) {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("CRI %s: %w", socket, err)
	}
	return &CRI{Runtime: cri.NewRuntimeServiceClient(conn), Images: cri.NewImageServiceClient(conn), conn: conn}, nil
}

// Close closes the connection.
func (c *CRI) Close() error { return c.conn.Close() }

// WaitReady waits until the runtime answers Version.
func (c *CRI) WaitReady(ctx context.Context, timeout time.Duration) error {
	return framework.Poll(ctx, 100*time.Millisecond, timeout, "containerd CRI answering", func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := c.Runtime.Version(ctx, &cri.VersionRequest{})
		return err
	})
}

// RemoveAllSandboxes stops and removes every pod sandbox, which makes
// containerd run the CNI DEL, unmount the sandbox's shm and rootfs mounts,
// remove its network namespace and end its shims.
func (c *CRI) RemoveAllSandboxes(ctx context.Context) error {
	resp, err := c.Runtime.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{})
	if err != nil {
		return err
	}
	var firstErr error
	for _, sb := range resp.Items {
		if _, err := c.Runtime.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: sb.Id}); err != nil && firstErr == nil {
			firstErr = fmt.Errorf("stop sandbox %s (%s): %w", sb.Id[:12], sb.Metadata.GetName(), err)
		}
		if _, err := c.Runtime.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: sb.Id}); err != nil && firstErr == nil {
			firstErr = fmt.Errorf("remove sandbox %s (%s): %w", sb.Id[:12], sb.Metadata.GetName(), err)
		}
	}
	return firstErr
}

// ExecCRI runs a command in the first running container of a pod through
// its node's containerd (CRI ExecSync), not through the kubelet: for load
// that must go on while a kubelet is down or has just restarted and not yet
// re-listed its pods. It returns stdout; a non-zero exit is an error.
func (l *Lab) ExecCRI(ctx context.Context, namespace, pod string, argv ...string) (string, error) {
	p, err := l.Client.CoreV1().Pods(namespace).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	n := l.Node(p.Spec.NodeName)
	if n == nil {
		return "", fmt.Errorf("pod %s/%s is on no lab node (%q)", namespace, pod, p.Spec.NodeName)
	}
	c, err := DialCRI(n.Socket)
	if err != nil {
		return "", err
	}
	defer c.Close()
	list, err := c.Runtime.ListContainers(ctx, &cri.ListContainersRequest{Filter: &cri.ContainerFilter{
		State:         &cri.ContainerStateValue{State: cri.ContainerState_CONTAINER_RUNNING},
		LabelSelector: map[string]string{"io.kubernetes.pod.namespace": namespace, "io.kubernetes.pod.name": pod},
	}})
	if err != nil {
		return "", err
	}
	if len(list.Containers) == 0 {
		return "", fmt.Errorf("no running container of %s/%s on %s", namespace, pod, n.Name)
	}
	timeout := int64(30)
	if d, ok := ctx.Deadline(); ok {
		timeout = max(1, int64(time.Until(d).Seconds()))
	}
	resp, err := c.Runtime.ExecSync(ctx, &cri.ExecSyncRequest{ContainerId: list.Containers[0].Id, Cmd: argv, Timeout: timeout})
	if err != nil {
		return "", fmt.Errorf("exec in %s/%s: %w", namespace, pod, err)
	}
	if resp.ExitCode != 0 {
		return string(resp.Stdout), fmt.Errorf("%s in %s/%s exited %d: %s", strings.Join(argv, " "), namespace, pod, resp.ExitCode, bytes.TrimSpace(resp.Stderr))
	}
	return string(resp.Stdout), nil
}
