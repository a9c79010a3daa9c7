package lab

import (
	"context"
	"fmt"
	"net"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// DNS objects: the chart's Deployment of netplane --role=dns pods behind
// the kube-dns Service.
const (
	DNSNamespace  = "kube-system"
	DNSDeployment = "netplane-dns"
	DNSService    = "kube-dns"
)

// deployDNS starts the fake upstream DNS server on its underlay host; the
// upstream stack also gets the kube-dns Service and CoreDNS's Deployment
// (netplane's DNS is the chart's). It does not wait for the pods:
// WaitReady does.
func (l *Lab) deployDNS(ctx context.Context) error {
	up, err := l.start(l.Upstream, "upstream-dns", l.bin.testimage, "upstream", "--listen="+net.JoinHostPort(l.Config.UpstreamDNS(), "53"))
	if err != nil {
		return err
	}
	l.cp.procs = append(l.cp.procs, up)
	if !l.upstream() {
		return nil
	}
	labels := map[string]string{"k8s-app": "kube-dns"}
	service := func() error {
		_, err := l.Client.CoreV1().Services(DNSNamespace).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: DNSService, Labels: labels},
			Spec: corev1.ServiceSpec{ClusterIP: l.Config.DNSServiceIP(), Selector: labels, Ports: []corev1.ServicePort{
				{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: intstr.FromInt32(53)},
				{Name: "dns-tcp", Protocol: corev1.ProtocolTCP, Port: 53, TargetPort: intstr.FromInt32(53)},
			}}}, metav1.CreateOptions{})
		return err
	}
	if err := createAll(service); err != nil {
		return err
	}
	return l.deployCoreDNS(ctx, labels)
}

// createAll runs create calls in order; an object that exists already is
// left as it is.
func createAll(creates ...func() error) error {
	for _, create := range creates {
		if err := create(); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	return nil
}

// WaitReady waits until every node is Ready and the cluster DNS has ready
// endpoints, and says which is missing if not. A kubelet reports its node
// Ready only once containerd reports the network ready, which it does once
// the node DaemonSet's pod has written the CNI configuration.
func (l *Lab) WaitReady(ctx context.Context, timeout time.Duration) error {
	return l.waitFor(timeout, "every node Ready and a ready cluster DNS", func(ctx context.Context) error {
		for _, n := range l.Nodes {
			if err := n.Ready(ctx); err != nil {
				return err
			}
		}
		d, err := l.Client.AppsV1().Deployments(DNSNamespace).Get(ctx, l.DNSDeploymentName(), metav1.GetOptions{})
		if err != nil {
			return err
		}
		if d.Status.ReadyReplicas < 1 {
			return fmt.Errorf("no ready %s pod yet (%s)", l.DNSDeploymentName(), l.podProblems(ctx, DNSNamespace, l.DNSPodSelector()))
		}
		return nil
	})
}
