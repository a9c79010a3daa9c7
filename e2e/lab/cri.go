package lab

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
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
	deadline := time.Now().Add(timeout)
	var err error
	for time.Now().Before(deadline) {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err = c.Runtime.Version(cctx, &cri.VersionRequest{})
		cancel()
		if err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("containerd CRI not answering after %v: %w", timeout, err)
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
