package scenario

import (
	"context"
	"fmt"
	"net"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netplane/netplane/e2e/lab"
)

// The NetworkPolicy scenario (examples/09-network-policy.yaml), as a user
// tries it: by name through the cluster DNS, from inside pods.

const policyNS = "policy-demo"

// NetworkPolicy: only pods labelled access=true reach nginx; a client
// without the label resolves the name but gets no answer, and gets one
// once labelled; namespace locked (default deny both ways) is reached by
// nobody and reaches nothing, while its pod stays Ready.
func NetworkPolicy(ctx context.Context, l *lab.Lab, logf func(string, ...any)) error {
	if err := Apply(ctx, l, "09-network-policy.yaml"); err != nil {
		return err
	}
	nginx, err := readyPodsIn(ctx, l, policyNS, "app=nginx", 2)
	if err != nil {
		return err
	}
	for _, pod := range []string{"client-access", "client-other"} {
		if err := running(ctx, l, policyNS, pod); err != nil {
			return err
		}
	}
	url := "http://nginx:8080/"
	seen, err := reachAllFrom(ctx, l, policyNS, "client-access", url, names(nginx))
	if err != nil {
		return fmt.Errorf("client-access (access=true): %w", err)
	}
	logf("client-access (access=true) reaches nginx by name, both pods: %v", seen)
	if err := deniedByName(ctx, l, "client-other", url, logf); err != nil {
		return err
	}
	if err := explainPolicy(ctx, l, logf); err != nil {
		return err
	}
	for _, label := range []string{"true", ""} {
		if err := accessFollows(ctx, l, label, logf); err != nil {
			return err
		}
	}
	return lockedNamespace(ctx, l, logf)
}

// deniedByName: the client resolves the Service's name (DNS is not what
// stops it) and every request times out.
func deniedByName(ctx context.Context, l *lab.Lab, client, url string, logf func(string, ...any)) error {
	out, err := l.Exec(ctx, policyNS, client, "/testimage", "lookup", "--type="+addressRecord(l), "nginx")
	if err != nil {
		return fmt.Errorf("%s cannot resolve nginx: %w", client, err)
	}
	for i := range 3 {
		if body, err := getIn(ctx, l, policyNS, client, url); err == nil {
			return fmt.Errorf("%s (no access label) reached nginx on try %d: %s", client, i+1, body)
		}
	}
	logf("%s (no access label) resolves nginx to %s but 3 of 3 requests time out", client, strings.TrimSpace(out))
	return nil
}

// lockedNamespace: default deny both ways. web is Ready (its kubelet
// probes come from its node), client-access cannot reach it, and it
// reaches neither the DNS nor nginx's ClusterIP.
func lockedNamespace(ctx context.Context, l *lab.Lab, logf func(string, ...any)) error {
	web, err := readyPodsIn(ctx, l, "locked", "", 1)
	if err != nil {
		return err
	}
	logf("locked/web is Ready: its node's probes pass the default deny")
	if body, err := getIn(ctx, l, policyNS, "client-access", "http://"+net.JoinHostPort(web[0].Status.PodIP, "80")+"/"); err == nil {
		return fmt.Errorf("client-access reached locked/web: %s", body)
	}
	logf("client-access -> locked/web %s:80: denied (ingress)", web[0].Status.PodIP)
	if out, err := l.Exec(ctx, "locked", "web", "/testimage", "lookup", "--type="+addressRecord(l), "nginx."+policyNS); err == nil {
		return fmt.Errorf("locked/web resolved a name through the cluster DNS: %s", strings.TrimSpace(out))
	}
	svc, err := l.Client.CoreV1().Services(policyNS).Get(ctx, "nginx", metav1.GetOptions{})
	if err != nil {
		return err
	}
	if body, err := getIn(ctx, l, "locked", "web", "http://"+net.JoinHostPort(svc.Spec.ClusterIP, "8080")+"/"); err == nil {
		return fmt.Errorf("locked/web reached nginx's ClusterIP: %s", body)
	}
	logf("locked/web -> DNS and nginx's ClusterIP %s: denied (egress)", svc.Spec.ClusterIP)
	return nil
}

// setAccess sets (or with "" removes) a pod's access label.
func setAccess(ctx context.Context, l *lab.Lab, pod, value string) error {
	p, err := l.Client.CoreV1().Pods(policyNS).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if p.Labels == nil {
		p.Labels = map[string]string{}
	}
	if value == "" {
		delete(p.Labels, "access")
	} else {
		p.Labels["access"] = value
	}
	_, err = l.Client.CoreV1().Pods(policyNS).Update(ctx, p, metav1.UpdateOptions{})
	return err
}

// running waits until a pod is Running with an address.
func running(ctx context.Context, l *lab.Lab, namespace, pod string) error {
	return within(ctx, 90*time.Second, func() error {
		p, err := l.Client.CoreV1().Pods(namespace).Get(ctx, pod, metav1.GetOptions{})
		if err == nil && (p.Status.Phase != "Running" || p.Status.PodIP == "") {
			err = fmt.Errorf("%s/%s is %s", namespace, pod, p.Status.Phase)
		}
		return err
	})
}

// accessFollows sets client-other's access label (or with "" removes it)
// and waits up to 10 s for nginx to admit it (or to deny it) by name.
func accessFollows(ctx context.Context, l *lab.Lab, label string, logf func(string, ...any)) error {
	if err := setAccess(ctx, l, "client-other", label); err != nil {
		return err
	}
	admit, start := label == "true", time.Now()
	if err := within(ctx, 10*time.Second, func() error {
		_, err := getIn(ctx, l, policyNS, "client-other", "http://nginx:8080/")
		switch {
		case admit && err != nil:
			return err
		case !admit && err == nil:
			return fmt.Errorf("still admitted")
		}
		return nil
	}); err != nil {
		return fmt.Errorf("client-other, access label %q: %w", label, err)
	}
	logf("client-other, access label %q: admitted %v after %v", label, admit, time.Since(start).Round(time.Millisecond))
	return nil
}
