package lab

import (
	"context"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// DNS objects: netplane --role=dns as a Deployment of two pods (so one can
// be replaced while the other answers) behind the kube-dns Service.
const (
	DNSNamespace  = "kube-system"
	DNSDeployment = "netplane-dns"
	DNSService    = "kube-dns"
)

// deployDNS starts the fake upstream DNS server on its underlay host and
// creates the kube-dns Service and netplane's DNS Deployment (CoreDNS's
// in the upstream stack). It does not
// wait for the pods: WaitReady does.
func (l *Lab) deployDNS(ctx context.Context) error {
	up, err := l.start(l.Upstream, "upstream-dns", l.bin.testimage, "upstream", "--listen="+UpstreamDNSIP+":53")
	if err != nil {
		return err
	}
	l.cp.procs = append(l.cp.procs, up)
	if l.roles != nil && l.roles.DNSDeployed {
		return nil
	}
	labels := map[string]string{"k8s-app": "kube-dns"}
	service := func() error {
		_, err := l.Client.CoreV1().Services(DNSNamespace).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: DNSService, Labels: labels},
			Spec: corev1.ServiceSpec{ClusterIP: DNSServiceIP, Selector: labels, Ports: []corev1.ServicePort{
				{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: intstr.FromInt32(53)},
				{Name: "dns-tcp", Protocol: corev1.ProtocolTCP, Port: 53, TargetPort: intstr.FromInt32(53)},
			}}}, metav1.CreateOptions{})
		return err
	}
	if l.upstream() {
		if err := createAll(service); err != nil {
			return err
		}
		return l.deployCoreDNS(ctx, labels)
	}
	return createAll(service,
		func() error {
			_, err := l.Client.CoreV1().ServiceAccounts(DNSNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: DNSDeployment}}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := l.Client.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: DNSDeployment}, Rules: []rbacv1.PolicyRule{
				{APIGroups: []string{""}, Resources: []string{"services", "pods", "namespaces", "endpoints", "configmaps"}, Verbs: []string{"get", "list", "watch"}},
				{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"get", "list", "watch"}},
			}}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := l.Client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: DNSDeployment},
				RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: DNSDeployment},
				Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: DNSNamespace, Name: DNSDeployment}}}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := l.Client.AppsV1().Deployments(DNSNamespace).Create(ctx, dnsDeployment(labels), metav1.CreateOptions{})
			return err
		},
	)
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

func dnsDeployment(labels map[string]string) *appsv1.Deployment {
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: DNSDeployment, Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType, RollingUpdate: &appsv1.RollingUpdateDeployment{
				MaxUnavailable: ptr.To(intstr.FromInt32(0)), MaxSurge: ptr.To(intstr.FromInt32(1))}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					ServiceAccountName: DNSDeployment,
					DNSPolicy:          corev1.DNSDefault,
					// One per node, so losing a node's pod leaves the other.
					Affinity: &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{
						Weight: 100, PodAffinityTerm: corev1.PodAffinityTerm{TopologyKey: "kubernetes.io/hostname", LabelSelector: &metav1.LabelSelector{MatchLabels: labels}}}}}},
					Containers: []corev1.Container{{
						Name: "dns", Image: NetplaneImage,
						Args: []string{"--role=dns", "--dns-bind-address=:53", "--upstream-servers=" + UpstreamDNSIP,
							"--cluster-domain=" + ClusterDomain, "--dns-service=" + DNSNamespace + "/" + DNSService,
							"--health-bind-address=:8080", "--metrics-bind-address=:9153", "--v=2"},
						Ports: []corev1.ContainerPort{{Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP},
							{Name: "dns-tcp", ContainerPort: 53, Protocol: corev1.ProtocolTCP}, {Name: "health", ContainerPort: 8080}},
						ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/readyz", Port: intstr.FromString("health")}},
							PeriodSeconds: 1, FailureThreshold: 1},
					}},
				},
			},
		},
	}
}

// WaitReady waits until every node is Ready and the cluster DNS has ready
// endpoints, and says which is missing if not. A kubelet reports its node
// Ready only once containerd reports the network ready, which it does once
// netplane --role=node has written the CNI configuration.
func (l *Lab) WaitReady(ctx context.Context, timeout time.Duration) error {
	return l.waitFor(timeout, "every node Ready and a ready cluster DNS", func(ctx context.Context) error {
		for _, n := range l.Nodes {
			if err := n.Ready(ctx); err != nil {
				return err
			}
		}
		d, err := l.Client.AppsV1().Deployments(DNSNamespace).Get(ctx, l.dnsDeploymentName(), metav1.GetOptions{})
		if err != nil {
			return err
		}
		if d.Status.ReadyReplicas < 1 {
			return fmt.Errorf("no ready %s pod yet (%s)", l.dnsDeploymentName(), l.podProblems(ctx, DNSNamespace, "k8s-app=kube-dns"))
		}
		return nil
	})
}
