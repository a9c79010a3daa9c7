package scenario

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/e2e/lab"
)

// Apply creates the objects of one file in examples/ (Deployments,
// Services and Pods), leaving alone those that already exist.
func Apply(ctx context.Context, l *lab.Lab, file string) error {
	data, err := os.ReadFile(filepath.Join(framework.RepoRoot(), "examples", file))
	if err != nil {
		return err
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var raw runtime.RawExtension
		if err := dec.Decode(&raw); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("%s: %w", file, err)
		}
		if len(bytes.TrimSpace(raw.Raw)) == 0 {
			continue
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(raw.Raw, nil, nil)
		if err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
		if err := create(ctx, l, obj); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("%s: %w", file, err)
		}
	}
}

// create makes obj unless an object of that name exists (a Service with
// a fixed nodePort fails validation, not AlreadyExists, on a second create).
func create(ctx context.Context, l *lab.Lab, obj runtime.Object) error {
	var err error
	switch o := obj.(type) {
	case *appsv1.Deployment:
		c := l.Client.AppsV1().Deployments(ns(o.Namespace))
		if _, err = c.Get(ctx, o.Name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			_, err = c.Create(ctx, o, metav1.CreateOptions{})
		}
	case *corev1.Service:
		c := l.Client.CoreV1().Services(ns(o.Namespace))
		if _, err = c.Get(ctx, o.Name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			_, err = c.Create(ctx, o, metav1.CreateOptions{})
		}
	case *corev1.Pod:
		c := l.Client.CoreV1().Pods(ns(o.Namespace))
		if _, err = c.Get(ctx, o.Name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			// In a namespace just made, the default ServiceAccount the
			// admission plugin wants comes a moment later.
			for range 100 {
				_, err = c.Create(ctx, o, metav1.CreateOptions{})
				if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "serviceaccount") {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
	case *corev1.Namespace:
		c := l.Client.CoreV1().Namespaces()
		if _, err = c.Get(ctx, o.Name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			_, err = c.Create(ctx, o, metav1.CreateOptions{})
		}
	case *networkingv1.NetworkPolicy:
		c := l.Client.NetworkingV1().NetworkPolicies(ns(o.Namespace))
		if _, err = c.Get(ctx, o.Name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			_, err = c.Create(ctx, o, metav1.CreateOptions{})
		}
	default:
		err = fmt.Errorf("kind %T not supported by scenario.Apply", obj)
	}
	return err
}

func ns(n string) string {
	if n == "" {
		return "default"
	}
	return n
}

// poll calls fn until it returns nil or ctx ends, returning fn's last error.
func poll(ctx context.Context, every time.Duration, fn func() error) error {
	for {
		err := fn()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(every):
		}
	}
}

// within is poll every 100 ms bounded by timeout.
func within(ctx context.Context, timeout time.Duration, fn func() error) error {
	return withinEvery(ctx, timeout, 100*time.Millisecond, fn)
}

func withinEvery(ctx context.Context, timeout, every time.Duration, fn func() error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return poll(ctx, every, fn)
}

// clusterIPExample deploys examples/01-clusterip.yaml and returns its 3
// ready nginx pods and the nginx Service's ClusterIP once the client pod
// is ready too.
func clusterIPExample(ctx context.Context, l *lab.Lab) ([]corev1.Pod, string, error) {
	if err := Apply(ctx, l, "01-clusterip.yaml"); err != nil {
		return nil, "", err
	}
	pods, err := readyPods(ctx, l, "app=nginx", 3)
	if err != nil {
		return nil, "", err
	}
	if _, err := readyPods(ctx, l, "app=client", 1); err != nil {
		return nil, "", err
	}
	ip, err := clusterIP(ctx, l, "nginx")
	return pods, ip, err
}

// readyPods waits until selector matches want Running, Ready pods and
// returns them sorted by name.
func readyPods(ctx context.Context, l *lab.Lab, selector string, want int) ([]corev1.Pod, error) {
	return readyPodsIn(ctx, l, "default", selector, want)
}

// readyPodsIn is readyPods in namespace.
func readyPodsIn(ctx context.Context, l *lab.Lab, namespace, selector string, want int) ([]corev1.Pod, error) {
	var out []corev1.Pod
	err := within(ctx, 90*time.Second, func() error {
		pods, err := l.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return err
		}
		out = out[:0]
		var states []string
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && podReady(&p) {
				out = append(out, p)
			}
			states = append(states, fmt.Sprintf("%s:%s/ready=%v", p.Name, p.Status.Phase, podReady(&p)))
		}
		if len(out) != want {
			return fmt.Errorf("want %d ready pods %q, have %d: %s", want, selector, len(out), strings.Join(states, " "))
		}
		return nil
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, err
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

var echoLine = regexp.MustCompile(`pod=(\S+) client=(\S+)`)

// echo parses the test server's answer into the pod that served it and
// the client address it saw.
func echo(body string) (pod, client string, err error) {
	m := echoLine.FindStringSubmatch(body)
	if m == nil {
		return "", "", fmt.Errorf("not an echo answer: %q", body)
	}
	return m[1], m[2], nil
}

// get makes one HTTP request from inside a pod and returns the serving pod.
func get(ctx context.Context, l *lab.Lab, fromPod, url string) (string, error) {
	return getIn(ctx, l, "default", fromPod, url)
}

// getIn is get from a pod of namespace.
func getIn(ctx context.Context, l *lab.Lab, namespace, fromPod, url string) (string, error) {
	out, err := l.Exec(ctx, namespace, fromPod, "/testimage", "get", "--timeout=2s", url)
	if err != nil {
		return "", err
	}
	pod, _, err := echo(out)
	return pod, err
}

// lookup resolves a name from inside a pod through its resolv.conf.
func lookup(ctx context.Context, l *lab.Lab, fromPod, typ, name string) ([]string, error) {
	out, err := l.Exec(ctx, "default", fromPod, "/testimage", "lookup", "--type="+typ, name)
	if err != nil {
		return nil, err
	}
	return strings.Fields(out), nil
}

// readyEndpoints are the ready addresses of a Service's EndpointSlices of
// the lab's primary family.
func readyEndpoints(ctx context.Context, l *lab.Lab, service string) ([]string, error) {
	slices, err := l.Client.DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + service})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, s := range slices.Items {
		if s.AddressType != addressType(l) {
			continue
		}
		for _, e := range s.Endpoints {
			if e.Conditions.Ready == nil || *e.Conditions.Ready {
				out = append(out, e.Addresses...)
			}
		}
	}
	sort.Strings(out)
	return out, nil
}

func names(pods []corev1.Pod) []string {
	var out []string
	for _, p := range pods {
		out = append(out, p.Name)
	}
	return out
}

func clusterIP(ctx context.Context, l *lab.Lab, service string) (string, error) {
	svc, err := l.Client.CoreV1().Services("default").Get(ctx, service, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	return svc.Spec.ClusterIP, nil
}

func sameStrings(a, b []string) bool { return strings.Join(a, ",") == strings.Join(b, ",") }
