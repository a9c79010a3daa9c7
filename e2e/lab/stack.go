package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/netplane/netplane/e2e/framework"
)

// What runs the lab's network. StackUpstream runs, in netplane's place, the
// systems it replaces, so that a test failing in both stacks is known to be
// the lab's: kube-controller-manager's own EndpointSlice controllers,
// CoreDNS, kube-proxy in nftables mode, and the reference bridge,
// host-local and portmap CNI plugins with a route per node to every other
// node's pod CIDRs (host-gw, so one subnet), without NetworkPolicy.
const (
	StackNetplane = "netplane"
	StackUpstream = "upstream"
)

// upstreamTools are the binaries StackUpstream needs (make anchors).
var upstreamTools = []string{"kube-proxy", "coredns", "cni/bridge", "cni/host-local", "cni/portmap", "nft", "iptables"}

// CoreDNS objects of StackUpstream, named as kubeadm names them.
const (
	coreDNSDeployment = "coredns"
	coreDNSImage      = "lab.local/coredns:dev"
)

func (l *Lab) upstream() bool { return l.Config.Stack == StackUpstream }

// ServiceTable is the nftables table of the stack's Service proxy.
func (l *Lab) ServiceTable() string {
	if l.upstream() {
		return "kube-proxy"
	}
	return "netplane"
}

// DNSPodSelector selects the cluster DNS pods of the lab's stack.
func (l *Lab) DNSPodSelector() string {
	if l.upstream() {
		return "k8s-app=kube-dns"
	}
	return "app.kubernetes.io/name=netplane,app.kubernetes.io/component=dns"
}

// DNSDeploymentName is the cluster DNS Deployment of the lab's stack.
func (l *Lab) DNSDeploymentName() string {
	if l.upstream() {
		return coreDNSDeployment
	}
	return DNSDeployment
}

// startUpstreamNodeNetwork gives node n what a kind node of the upstream
// stack has once its pod CIDRs are allocated: the bridge conflist, a route
// to every other node's pod CIDRs, masquerade of pod traffic leaving the
// cluster CIDRs (kindnet's rule), and kube-proxy.
func (l *Lab) startUpstreamNodeNetwork(n *Node, cidrs map[string][]string) error {
	for _, p := range []string{"bridge", "host-local", "portmap"} {
		if err := copyFile(framework.Binary("cni/"+p), n.fsPath(filepath.Join("/opt/cni/bin", p))); err != nil {
			return err
		}
	}
	// A range and a default route per family of the node's pod CIDRs.
	var ranges, routes []any
	for _, c := range cidrs[n.Name] {
		ranges = append(ranges, []any{map[string]string{"subnet": c}})
		routes = append(routes, map[string]string{"dst": defaultRoute(c)})
	}
	conf, err := json.MarshalIndent(map[string]any{
		"cniVersion": "1.0.0", "name": "lab-bridge",
		"plugins": []any{
			map[string]any{"type": "bridge", "bridge": "cni0", "isGateway": true, "hairpinMode": true,
				"ipam": map[string]any{"type": "host-local", "ranges": ranges, "dataDir": filepath.Join(n.Dir, "cni", "ipam"),
					"routes": routes}},
			map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}},
		},
	}, "", "  ")
	if err != nil {
		return err
	}
	cmds := [][]string{
		{"sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=1"},
		{"sysctl", "-qw", "net.bridge.bridge-nf-call-ip6tables=1"},
	}
	for _, other := range l.Nodes {
		if other == n {
			continue
		}
		for _, c := range cidrs[other.Name] {
			cmds = append(cmds, []string{"ip", "route", "replace", c, "via", other.addrFor(c)})
		}
	}
	if err := run(n.NS, cmds...); err != nil {
		return fmt.Errorf("%s: %w", n.Name, err)
	}
	nft := n.NS.Command("nft", "-f", "-")
	nft.Stdin = strings.NewReader(masquerade(strings.Split(l.Config.ClusterCIDRs(), ",")))
	if out, err := nft.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: nft: %v: %s", n.Name, err, out)
	}
	if err := os.WriteFile(filepath.Join(n.CNIConf, "10-bridge.conflist"), conf, 0o644); err != nil {
		return err
	}
	return n.startKubeProxy()
}

// defaultRoute is the default route of cidr's family.
func defaultRoute(cidr string) string {
	if strings.Contains(cidr, ":") {
		return "::/0"
	}
	return "0.0.0.0/0"
}

// masquerade is kindnet's rule for each of the cluster CIDRs: pod traffic
// leaving them through the node's underlay link takes the node's address.
func masquerade(clusterCIDRs []string) string {
	var rules strings.Builder
	for _, c := range clusterCIDRs {
		ip := "ip"
		if strings.Contains(c, ":") {
			ip = "ip6"
		}
		fmt.Fprintf(&rules, "\t\t%s saddr %s %s daddr != %s oifname \"eth0\" masquerade\n", ip, c, ip, c)
	}
	return "table inet lab-masq {\n\tchain postrouting {\n\t\ttype nat hook postrouting priority srcnat;\n" + rules.String() + "\t}\n}\n"
}

// kubeProxyConfig runs kube-proxy in nftables mode; maxPerCore 0 leaves
// nf_conntrack_max alone, a machine-wide setting no namespace holds.
const kubeProxyConfig = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clientConnection:
  kubeconfig: {{kubeconfig}}
hostnameOverride: {{node}}
clusterCIDR: {{clusterCIDRs}}
conntrack:
  maxPerCore: 0
healthzBindAddress: 0.0.0.0:10256
metricsBindAddress: 127.0.0.1:10249
`

// RestartKubeProxy stops the node's kube-proxy and starts it again, as a
// DaemonSet's rolling update replaces its pod, and waits until its health
// server says it has synced. Only the process that runs the lab can.
func (n *Node) RestartKubeProxy(ctx context.Context) error {
	n.mu.Lock()
	p := n.network
	n.mu.Unlock()
	if p == nil {
		return errors.New("kube-proxy runs in another process (the lab's)")
	}
	p.Stop(30 * time.Second)
	if err := n.startKubeProxy(); err != nil {
		return err
	}
	return n.lab.waitFor(time.Minute, n.Name+"'s kube-proxy healthy", func(ctx context.Context) error {
		out, err := n.NS.Exec("curl", "-sf", "http://127.0.0.1:10256/healthz")
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})
}

func (n *Node) startKubeProxy() error {
	conf := strings.NewReplacer("{{kubeconfig}}", n.lab.kubeconfigFor("system:kube-proxy"), "{{node}}", n.Name,
		"{{clusterCIDRs}}", n.lab.Config.ClusterCIDRs()).Replace(kubeProxyConfig)
	path := filepath.Join(n.Dir, "kube-proxy.yaml")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		return err
	}
	p, err := n.lab.start(n.NS, n.Name+"-kube-proxy", framework.Binary("kube-proxy"), "--config="+path, "--v=1")
	n.mu.Lock()
	n.network = p
	n.mu.Unlock()
	return err
}

// corefile is CoreDNS's configuration as kubeadm writes it (its lameduck
// among it), forwarding to the lab's upstream DNS server of the cluster's
// family.
const corefile = `.:53 {
    errors
    health :8080 {
        lameduck 5s
    }
    ready :8181
    kubernetes ` + ClusterDomain + ` in-addr.arpa ip6.arpa {
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }
    forward . %s
    cache 30
    loop
    reload
    loadbalance
}
`

// coreDNSObjects are CoreDNS's ServiceAccount, RBAC, Corefile and
// Deployment; the kube-dns Service is the lab's own.
func coreDNSObjects(labels map[string]string, upstreamDNS string) (*corev1.ServiceAccount, *rbacv1.ClusterRole, *rbacv1.ClusterRoleBinding, *corev1.ConfigMap, *appsv1.Deployment) {
	meta := metav1.ObjectMeta{Name: coreDNSDeployment, Namespace: DNSNamespace}
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "system:coredns"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"services", "pods", "namespaces", "endpoints"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}},
	}}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "system:coredns"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "system:coredns"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: DNSNamespace, Name: coreDNSDeployment}}}
	cm := &corev1.ConfigMap{ObjectMeta: meta, Data: map[string]string{"Corefile": fmt.Sprintf(corefile, upstreamDNS)}}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: coreDNSDeployment, Namespace: DNSNamespace, Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2),
			// kubeadm's strategy.
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType, RollingUpdate: &appsv1.RollingUpdateDeployment{
				MaxUnavailable: ptr.To(intstr.FromInt32(1)), MaxSurge: ptr.To(intstr.FromString("25%"))}},
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					ServiceAccountName: coreDNSDeployment,
					DNSPolicy:          corev1.DNSDefault,
					Volumes: []corev1.Volume{{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
						LocalObjectReference: corev1.LocalObjectReference{Name: coreDNSDeployment}}}}},
					Containers: []corev1.Container{{
						Name: "coredns", Image: coreDNSImage, Args: []string{"-conf", "/etc/coredns/Corefile"},
						VolumeMounts: []corev1.VolumeMount{{Name: "config", MountPath: "/etc/coredns", ReadOnly: true}},
						Ports: []corev1.ContainerPort{{Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP},
							{Name: "dns-tcp", ContainerPort: 53, Protocol: corev1.ProtocolTCP}},
						ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/ready", Port: intstr.FromInt32(8181)}},
							PeriodSeconds: 1, FailureThreshold: 1},
					}},
				},
			},
		},
	}
	return &corev1.ServiceAccount{ObjectMeta: meta}, role, binding, cm, d
}

// deployCoreDNS creates coreDNSObjects.
func (l *Lab) deployCoreDNS(ctx context.Context, labels map[string]string) error {
	sa, role, binding, cm, d := coreDNSObjects(labels, l.Config.UpstreamDNS())
	return createAll(
		func() error {
			_, err := l.Client.CoreV1().ServiceAccounts(DNSNamespace).Create(ctx, sa, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := l.Client.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := l.Client.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := l.Client.CoreV1().ConfigMaps(DNSNamespace).Create(ctx, cm, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := l.Client.AppsV1().Deployments(DNSNamespace).Create(ctx, d, metav1.CreateOptions{})
			return err
		},
	)
}
