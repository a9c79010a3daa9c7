package scenario

import (
	"context"
	"fmt"
	"net"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netplane/netplane/e2e/lab"
)

// The IPv4 addresses the external-traffic scenarios use (family.go has
// both families').
const (
	ExternalIPAddr   = "172.30.1.10"
	LoadBalancerAddr = "172.30.1.20"
)

func init() {
	All = []Scenario{
		{"1 ClusterIP: a client on another node reaches all 3 pods, by IP and by name", ClusterIP},
		{"2 sessionAffinity ClientIP: one client always lands on the same pod", SessionAffinity},
		{"3 NodePort: every node answers; Local: only nodes with a pod, client IP kept", NodePort},
		{"4a externalIPs: reachable from the external client", ExternalIPs},
		{"4b LoadBalancer: its status.loadBalancer.ingress IP reachable from outside", LoadBalancer},
		{"5 headless: A = pod IPs, SRV per pod, hostname.subdomain, not-ready published", Headless},
		{"6 ExternalName: CNAME, target resolved through the upstream", ExternalName},
		{"7 scale down/up and failed readiness: endpoints, DNS and rules follow", ScaleAndReadiness},
		{"8 hostPort: a pod reachable on its node's address", HostPort},
		{"9 NetworkPolicy: only pods labelled access=true reach nginx; a default-deny namespace", NetworkPolicy},
		{"10 encryption (NETPLANE_LAB_ENCRYPTION=wireguard): no pod payload crosses the router in clear", Encrypted},
		{"11 helm upgrade under load: every netplane pod replaced, no request, query or held connection lost", Upgrade},
		{"12 encryption rolled in (permissive, strict) and out under load by helm upgrade: nothing in clear, nothing lost", EncryptionRollout},
		{"13 pod relays (helm upgrade relay.enabled): every agent reads pods from one, labels reach the policy tables, also after a relay is deleted", PodRelays},
	}
}

// ClusterIP: the client pod (node-1) reaches all 3 pods through each of
// the Service's ClusterIPs (PreferDualStack: both families in a dual-stack
// lab, the lab's one otherwise), TCP and UDP, and the Service by its
// short, namespaced and fully qualified names.
func ClusterIP(ctx context.Context, l *lab.Lab, logf func(string, ...any)) error {
	pods, _, err := clusterIPExample(ctx, l)
	if err != nil {
		return err
	}
	svc, err := l.Client.CoreV1().Services("default").Get(ctx, "nginx", metav1.GetOptions{})
	if err != nil {
		return err
	}
	if want := len(strings.Split(l.Config.ClusterCIDRs(), ",")); len(svc.Spec.ClusterIPs) != want {
		return fmt.Errorf("the PreferDualStack Service nginx has ClusterIPs %v, want one of each of the lab's %d families", svc.Spec.ClusterIPs, want)
	}
	for _, ip := range svc.Spec.ClusterIPs {
		seen, err := reachAll(ctx, l, "http://"+net.JoinHostPort(ip, "8080")+"/", names(pods))
		if err != nil {
			return err
		}
		logf("ClusterIP %s:8080 reached %v", ip, seen)
		out, err := l.Exec(ctx, "default", "client", "/testimage", "udp", net.JoinHostPort(ip, "8080"))
		if err != nil {
			return fmt.Errorf("UDP through the ClusterIP %s: %w", ip, err)
		}
		logf("UDP %s:8080 answered %s", ip, strings.TrimSpace(out))
	}
	for _, name := range []string{"nginx", "nginx.default", "nginx.default.svc.cluster.local"} {
		if _, err := get(ctx, l, "client", "http://"+name+":8080/"); err != nil {
			return fmt.Errorf("by name %q: %w", name, err)
		}
		logf("by name %s:8080: ok", name)
	}
	return nil
}

// reachAll sends requests from the client pod until every wanted pod has
// answered; any failed request is an error.
func reachAll(ctx context.Context, l *lab.Lab, url string, want []string) ([]string, error) {
	return reachAllFrom(ctx, l, "default", "client", url, want)
}

// reachAllFrom is reachAll from pod client of namespace.
func reachAllFrom(ctx context.Context, l *lab.Lab, namespace, client, url string, want []string) ([]string, error) {
	seen := map[string]bool{}
	// A Service just created is programmed on the nodes a moment later.
	if err := within(ctx, 10*time.Second, func() error {
		pod, err := getIn(ctx, l, namespace, client, url)
		if err == nil {
			seen[pod] = true
		}
		return err
	}); err != nil {
		return nil, fmt.Errorf("no answer from %s: %w", url, err)
	}
	for i := 0; i < 30*len(want); i++ {
		pod, err := getIn(ctx, l, namespace, client, url)
		if err != nil {
			return nil, fmt.Errorf("request %d to %s: %w", i+1, url, err)
		}
		seen[pod] = true
		if len(seen) == len(want) {
			break
		}
	}
	var got []string
	for p := range seen {
		got = append(got, p)
	}
	sort.Strings(got)
	if !sameStrings(got, want) {
		return got, fmt.Errorf("%s: answered by %v, want all of %v", url, got, want)
	}
	return got, nil
}

// SessionAffinity: 10 requests from one client all land on one pod.
func SessionAffinity(ctx context.Context, l *lab.Lab, logf func(string, ...any)) error {
	if err := Apply(ctx, l, "01-clusterip.yaml"); err != nil {
		return err
	}
	if err := Apply(ctx, l, "02-session-affinity.yaml"); err != nil {
		return err
	}
	if _, err := readyPods(ctx, l, "app=nginx", 3); err != nil {
		return err
	}
	ip, err := clusterIP(ctx, l, "nginx-affinity")
	if err != nil {
		return err
	}
	url := "http://" + net.JoinHostPort(ip, "8080") + "/"
	// A Service just created is programmed on the nodes a moment later.
	if err := within(ctx, 10*time.Second, func() error { _, err := get(ctx, l, "client", url); return err }); err != nil {
		return fmt.Errorf("no answer from %s: %w", url, err)
	}
	var first string
	for i := 0; i < 10; i++ {
		pod, err := get(ctx, l, "client", url)
		if err != nil {
			return err
		}
		if first == "" {
			first = pod
		} else if pod != first {
			return fmt.Errorf("request %d went to %s, the first to %s", i+1, pod, first)
		}
	}
	logf("10 requests, all to %s", first)
	return nil
}

// NodePort: from the external client, every node's IP answers on the
// node port; with externalTrafficPolicy Local only node-1 (which has the
// pod) answers, and the pod sees the external client's own address.
func NodePort(ctx context.Context, l *lab.Lab, logf func(string, ...any)) error {
	for _, f := range []string{"01-clusterip.yaml", "03-nodeport.yaml"} {
		if err := Apply(ctx, l, f); err != nil {
			return err
		}
	}
	if _, err := readyPods(ctx, l, "app=nginx", 3); err != nil {
		return err
	}
	if _, err := readyPods(ctx, l, "app=solo", 1); err != nil {
		return err
	}
	for _, n := range l.Nodes {
		url := "http://" + net.JoinHostPort(nodeIP(l, n), "30080") + "/"
		if err := within(ctx, 10*time.Second, func() error { _, err := l.ExternalExec(ctx, "get", url); return err }); err != nil {
			return fmt.Errorf("NodePort on %s: %w", n.Name, err)
		}
		logf("%s answers", url)
	}
	for _, n := range l.Nodes {
		url := "http://" + net.JoinHostPort(nodeIP(l, n), "30081") + "/"
		if n.Name != "node-1" {
			if out, err := l.ExternalExec(ctx, "get", "--timeout=1s", url); err == nil {
				return fmt.Errorf("the Local NodePort on %s (no pod there) answered: %s", n.Name, out)
			}
			logf("%s (no local pod) does not answer", url)
			continue
		}
		var out string
		if err := within(ctx, 10*time.Second, func() (err error) { out, err = l.ExternalExec(ctx, "get", url); return err }); err != nil {
			return fmt.Errorf("the Local NodePort on %s: %w", n.Name, err)
		}
		_, client, err := echo(out)
		if err != nil {
			return err
		}
		if host, _, _ := net.SplitHostPort(client); host != l.Config.ExternalClientIP() {
			return fmt.Errorf("the Local NodePort: the pod saw client %s, want the external client's %s", client, l.Config.ExternalClientIP())
		}
		logf("%s answers and the pod saw %s", url, client)
	}
	return nil
}

// ExternalIPs: the Service's externalIP (of the lab's family), routed on
// the underlay to node-1, answers from the external client.
func ExternalIPs(ctx context.Context, l *lab.Lab, logf func(string, ...any)) error {
	for _, f := range []string{"01-clusterip.yaml", "04-external.yaml"} {
		if err := Apply(ctx, l, f); err != nil {
			return err
		}
	}
	addr := externalIPAddrs[primary(l)]
	if err := setExternalIP(ctx, l, "nginx-externalip", addr); err != nil {
		return err
	}
	if err := l.RouteToNode(addr, l.Nodes[0]); err != nil {
		return err
	}
	return answersFromOutside(ctx, l, logf, addr)
}

// LoadBalancer: the LoadBalancer Service's ingress IP, written into its
// status as a cloud's controller would and routed on the underlay to the
// last node, answers from the external client.
func LoadBalancer(ctx context.Context, l *lab.Lab, logf func(string, ...any)) error {
	for _, f := range []string{"01-clusterip.yaml", "04-external.yaml"} {
		if err := Apply(ctx, l, f); err != nil {
			return err
		}
	}
	addr := loadBalancerAddrs[primary(l)]
	if err := l.RouteToNode(addr, l.Nodes[len(l.Nodes)-1]); err != nil {
		return err
	}
	svc, err := l.Client.CoreV1().Services("default").Get(ctx, "nginx-lb", metav1.GetOptions{})
	if err != nil {
		return err
	}
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: addr}}
	if _, err := l.Client.CoreV1().Services("default").UpdateStatus(ctx, svc, metav1.UpdateOptions{}); err != nil {
		return err
	}
	return answersFromOutside(ctx, l, logf, addr)
}

// answersFromOutside waits for addr:8080 to answer the external client,
// then requires 10 more requests in a row to succeed.
func answersFromOutside(ctx context.Context, l *lab.Lab, logf func(string, ...any), addr string) error {
	if _, err := readyPods(ctx, l, "app=nginx", 3); err != nil {
		return err
	}
	url := "http://" + net.JoinHostPort(addr, "8080") + "/"
	if err := within(ctx, 10*time.Second, func() error { _, err := l.ExternalExec(ctx, "get", "--timeout=1s", url); return err }); err != nil {
		return fmt.Errorf("%s: %w", url, err)
	}
	for i := 0; i < 10; i++ {
		if _, err := l.ExternalExec(ctx, "get", "--timeout=1s", url); err != nil {
			return fmt.Errorf("%s, request %d after it first answered: %w", url, i+1, err)
		}
	}
	logf("%s answers", url)
	return nil
}

// Headless: the Service's A (AAAA in an IPv6 lab) records are the pod IPs (the never-ready web-1
// included, by publishNotReadyAddresses), one SRV record per pod, and each
// pod resolves by hostname.subdomain.
func Headless(ctx context.Context, l *lab.Lab, logf func(string, ...any)) error {
	for _, f := range []string{"01-clusterip.yaml", "05-headless.yaml"} {
		if err := Apply(ctx, l, f); err != nil {
			return err
		}
	}
	if _, err := readyPods(ctx, l, "app=client", 1); err != nil {
		return err
	}
	web0, err := readyPods(ctx, l, "app=web", 1) // web-0: web-1 never gets ready
	if err != nil {
		return err
	}
	var web1 *corev1.Pod
	if err := within(ctx, 60*time.Second, func() error {
		web1, err = l.Client.CoreV1().Pods("default").Get(ctx, "web-1", metav1.GetOptions{})
		if err == nil && web1.Status.PodIP == "" {
			err = fmt.Errorf("web-1 has no IP yet")
		}
		return err
	}); err != nil {
		return err
	}
	want := []string{web0[0].Status.PodIP, web1.Status.PodIP}
	sort.Strings(want)
	rr := addressRecord(l)
	if err := within(ctx, 10*time.Second, func() error {
		got, err := lookup(ctx, l, "client", rr, "web.default.svc.cluster.local")
		if err == nil && !sameStrings(got, want) {
			err = fmt.Errorf("web has %s records %v, want %v", rr, got, want)
		}
		return err
	}); err != nil {
		return err
	}
	logf("%s web.default.svc.cluster.local = %v (web-1 not ready, published)", rr, want)
	srv, err := lookup(ctx, l, "client", "SRV", "_http._tcp.web.default.svc.cluster.local")
	if err != nil {
		return err
	}
	wantSRV := "web-0.web.default.svc.cluster.local. 80 web-1.web.default.svc.cluster.local. 80"
	if strings.Join(srv, " ") != wantSRV {
		return fmt.Errorf("SRV: %v, want %s", srv, wantSRV)
	}
	logf("SRV _http._tcp.web = %v", srv)
	got, err := lookup(ctx, l, "client", rr, "web-0.web")
	if err != nil {
		return err
	}
	if !sameStrings(got, []string{web0[0].Status.PodIP}) {
		return fmt.Errorf("web-0.web has %s records %v, want %s", rr, got, web0[0].Status.PodIP)
	}
	logf("%s web-0.web = %v", rr, got)
	return nil
}

// ExternalName: the Service is a CNAME to www.example., which resolves
// through netplane's forwarder to the lab's upstream.
func ExternalName(ctx context.Context, l *lab.Lab, logf func(string, ...any)) error {
	for _, f := range []string{"01-clusterip.yaml", "06-externalname.yaml"} {
		if err := Apply(ctx, l, f); err != nil {
			return err
		}
	}
	if _, err := readyPods(ctx, l, "app=client", 1); err != nil {
		return err
	}
	var cname []string
	if err := within(ctx, 10*time.Second, func() (err error) {
		cname, err = lookup(ctx, l, "client", "CNAME", "search.default.svc.cluster.local")
		if err == nil && !sameStrings(cname, []string{"www.example."}) {
			err = fmt.Errorf("search has CNAME %v, want www.example", cname)
		}
		return err
	}); err != nil {
		return err
	}
	rr, want := addressRecord(l), upstreamAnswers[primary(l)]
	a, err := lookup(ctx, l, "client", rr, "search")
	if err != nil {
		return err
	}
	if !sameStrings(a, []string{want}) {
		return fmt.Errorf("search resolves (through its CNAME) to %s %v, want %s from the upstream", rr, a, want)
	}
	logf("search -> CNAME %v -> %s %v", cname, rr, a)
	return nil
}

// HostPort: the hostport pod answers on node-2's address from outside.
func HostPort(ctx context.Context, l *lab.Lab, logf func(string, ...any)) error {
	if err := Apply(ctx, l, "08-hostport.yaml"); err != nil {
		return err
	}
	if _, err := readyPods(ctx, l, "app=hostport", 1); err != nil {
		return err
	}
	n := l.Node("node-2")
	url := "http://" + net.JoinHostPort(nodeIP(l, n), "8088") + "/"
	var out string
	if err := within(ctx, 10*time.Second, func() (err error) { out, err = l.ExternalExec(ctx, "get", url); return err }); err != nil {
		return fmt.Errorf("%s: %w", url, err)
	}
	logf("%s: %s", url, strings.TrimSpace(out))
	return nil
}
