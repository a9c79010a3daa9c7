package agent

import (
	"context"
	"net"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

const heartbeatPeriod = 10 * time.Second

// registerNode creates the Node (or takes over an existing one) and sets
// its status: the node lifecycle controller then removes the not-ready
// taint and node IPAM gives it pod CIDRs.
func (a *Agent) registerNode(ctx context.Context) error {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: a.cfg.NodeName, Labels: map[string]string{
		"kubernetes.io/hostname": a.cfg.NodeName, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
	}}}
	_, err := a.client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return a.updateNodeStatus(ctx)
}

// updateNodeStatus retries on conflicts: the node IPAM controller writes
// the same Node when it gives out pod CIDRs.
func (a *Agent) updateNodeStatus(ctx context.Context) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error { return a.tryUpdateNodeStatus(ctx) })
}

func (a *Agent) tryUpdateNodeStatus(ctx context.Context) error {
	node, err := a.client.CoreV1().Nodes().Get(ctx, a.cfg.NodeName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	now := metav1.Now()
	var addrs []corev1.NodeAddress
	for _, ip := range a.cfg.NodeIPs {
		addrs = append(addrs, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip})
	}
	addrs = append(addrs, corev1.NodeAddress{Type: corev1.NodeHostName, Address: a.cfg.NodeName})
	capacity := corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("8Gi"),
		corev1.ResourcePods: resource.MustParse("110"),
	}
	ready := corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
		Message: "lab agent is posting ready status", LastHeartbeatTime: now, LastTransitionTime: now}
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
			ready.LastTransitionTime = c.LastTransitionTime
		}
	}
	node.Status.Addresses = addrs
	node.Status.Capacity, node.Status.Allocatable = capacity, capacity
	node.Status.Conditions = []corev1.NodeCondition{ready}
	node.Status.NodeInfo = corev1.NodeSystemInfo{KubeletVersion: "v1.37.1-lab", ContainerRuntimeVersion: "containerd://1.6",
		OperatingSystem: "linux", Architecture: "amd64", KernelVersion: "lab"}
	_, err = a.client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
	return err
}

// heartbeat renews the node's Lease and Ready condition, as the kubelet
// does, so the node lifecycle controller never marks it unreachable.
func (a *Agent) heartbeat(ctx context.Context) {
	for {
		if err := a.renewLease(ctx); err != nil {
			klog.ErrorS(err, "renew node lease")
		}
		if err := a.updateNodeStatus(ctx); err != nil {
			klog.ErrorS(err, "update node status")
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(heartbeatPeriod):
		}
	}
}

func (a *Agent) renewLease(ctx context.Context) error {
	leases := a.client.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	now := metav1.NewMicroTime(time.Now())
	lease, err := leases.Get(ctx, a.cfg.NodeName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: a.cfg.NodeName},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(a.cfg.NodeName), LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &now},
		}, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	lease.Spec.RenewTime = &now
	_, err = leases.Update(ctx, lease, metav1.UpdateOptions{})
	return err
}

// hostIPs are the node's InternalIPs as a pod's status.hostIPs.
func (a *Agent) hostIPs() []corev1.HostIP {
	var out []corev1.HostIP
	for _, ip := range a.cfg.NodeIPs {
		if net.ParseIP(ip) != nil {
			out = append(out, corev1.HostIP{IP: ip})
		}
	}
	return out
}
