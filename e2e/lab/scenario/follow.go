package scenario

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/netplane/netplane/e2e/lab"
)

// podInfo is a ready pod as the timing checks need it.
type podInfo struct{ Name, IP string }

func podIPsOf(pods []podInfo) []string {
	var out []string
	for _, p := range pods {
		out = append(out, p.IP)
	}
	sort.Strings(out)
	return out
}

func podNamesOf(pods []podInfo) []string {
	var out []string
	for _, p := range pods {
		out = append(out, p.Name)
	}
	return out
}

// podWatch follows the ready pods of a selector through a watch, noting when
// the set last changed: the moment a change reached the API server, as close
// as a client can see it.
type podWatch struct {
	stop func()

	mu      sync.Mutex
	pods    map[string]*corev1.Pod
	ready   []podInfo
	changed time.Time
	err     error
}

func watchReadyPods(ctx context.Context, l *lab.Lab, selector string) (*podWatch, error) {
	c := l.Client.CoreV1().Pods("default")
	list, err := c.List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	wi, err := c.Watch(ctx, metav1.ListOptions{LabelSelector: selector, ResourceVersion: list.ResourceVersion})
	if err != nil {
		cancel()
		return nil, err
	}
	w := &podWatch{pods: map[string]*corev1.Pod{}, changed: time.Now()}
	for i := range list.Items {
		w.pods[list.Items[i].Name] = &list.Items[i]
	}
	w.ready = readySet(w.pods)
	done := make(chan struct{})
	w.stop = func() { cancel(); wi.Stop(); <-done }
	go func() {
		defer close(done)
		for ev := range wi.ResultChan() {
			w.apply(ev, time.Now())
		}
		w.mu.Lock()
		if w.err == nil && ctx.Err() == nil {
			w.err = fmt.Errorf("the watch of pods %q ended early", selector)
		}
		w.mu.Unlock()
	}()
	return w, nil
}

func (w *podWatch) apply(ev watch.Event, at time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	p, ok := ev.Object.(*corev1.Pod)
	switch {
	case ev.Type == watch.Error || !ok:
		w.err = fmt.Errorf("watching pods: %v", ev.Object)
		return
	case ev.Type == watch.Deleted:
		delete(w.pods, p.Name)
	default:
		w.pods[p.Name] = p
	}
	if ready := readySet(w.pods); !slices.Equal(ready, w.ready) {
		w.ready, w.changed = ready, at
	}
}

// waitFor returns the ready pods once there are want of them, and when that
// set appeared.
func (w *podWatch) waitFor(ctx context.Context, want int, timeout time.Duration) ([]podInfo, time.Time, error) {
	deadline := time.Now().Add(timeout)
	for {
		w.mu.Lock()
		ready, changed, err := w.ready, w.changed, w.err
		w.mu.Unlock()
		switch {
		case err != nil:
			return nil, time.Time{}, err
		case len(ready) == want:
			return ready, changed, nil
		case time.Now().After(deadline):
			return nil, time.Time{}, fmt.Errorf("want %d ready pods, have %v after %v", want, podNamesOf(ready), timeout)
		}
		select {
		case <-ctx.Done():
			return nil, time.Time{}, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// readySet is what an endpoint controller publishes as ready: running,
// Ready, not terminating, with an IP; sorted by name.
func readySet(pods map[string]*corev1.Pod) []podInfo {
	var out []podInfo
	for _, p := range pods {
		if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && podReady(p) && p.Status.PodIP != "" {
			out = append(out, podInfo{p.Name, p.Status.PodIP})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// observer is one view of a Service that must come to show the change; check
// returns nil once it does and says what it saw otherwise.
type observer struct {
	name  string
	check func(context.Context) error
}

// observe runs every observer's check in a loop until it passes and returns,
// per observer, the time from since to the end of its first passing check
// (an upper bound of when the view followed) and what the checks saw on the
// way. It fails when one does not pass within 30 seconds.
func observe(ctx context.Context, since time.Time, obs []observer) ([]time.Duration, []string, error) {
	out := make([]time.Duration, len(obs))
	seen := make([]string, len(obs))
	errs := make([]error, len(obs))
	var wg sync.WaitGroup
	for i, o := range obs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var trace []string
			last := ""
			errs[i] = withinEvery(ctx, 30*time.Second, 10*time.Millisecond, func() error {
				cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				defer cancel()
				err := o.check(cctx)
				if msg := fmt.Sprint(err); err != nil && msg != last {
					trace = append(trace, fmt.Sprintf("at %v: %s", time.Since(since).Round(time.Millisecond), msg))
					last = msg
				}
				return err
			})
			out[i] = max(0, time.Since(since)).Round(time.Millisecond)
			seen[i] = strings.Join(trace, "; ")
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return nil, nil, fmt.Errorf("%s did not follow: %w (seen: %s)", obs[i].name, err, seen[i])
		}
	}
	return out, seen, nil
}

// nodeLookup asks the cluster DNS Service for name's address records of
// the lab's family (A or AAAA) from a node's namespace, so through that
// node's rules.
func nodeLookup(ctx context.Context, l *lab.Lab, n *lab.Node, name string) ([]string, error) {
	var conn net.Conn
	if err := n.NS.Do(func() error {
		var err error
		conn, err = (&net.Dialer{}).DialContext(ctx, "udp", net.JoinHostPort(l.Config.DNSServiceIP(), "53"))
		return err
	}); err != nil {
		return nil, err
	}
	defer conn.Close()
	m := new(dns.Msg).SetQuestion(dns.Fqdn(name), dns.StringToType[addressRecord(l)])
	c := &dns.Client{Timeout: 500 * time.Millisecond}
	r, _, err := c.ExchangeWithConnContext(ctx, m, &dns.Conn{Conn: conn})
	if err != nil {
		return nil, fmt.Errorf("lookup of %s from %s: %w", name, n.Name, err)
	}
	if r.Rcode != dns.RcodeSuccess {
		return nil, fmt.Errorf("lookup of %s from %s: %s", name, n.Name, dns.RcodeToString[r.Rcode])
	}
	var out []string
	for _, rr := range r.Answer {
		switch a := rr.(type) {
		case *dns.A:
			out = append(out, a.A.String())
		case *dns.AAAA:
			out = append(out, a.AAAA.String())
		}
	}
	sort.Strings(out)
	return out, nil
}

// probeRequests is how many requests in a row must reach only wanted pods
// (and all of them) before a node's rules count as followed: with one stale
// pod of three, 20 random picks all miss it with a chance of 3 in 10,000.
const probeRequests = 20

// onlyReaches sends probeRequests HTTP requests to target from a node's
// namespace, each on a new connection, and passes when every one was
// answered by a wanted pod and every wanted pod answered.
func onlyReaches(ctx context.Context, n *lab.Node, target string, wantPods []string) error {
	client := &http.Client{
		Timeout: time.Second,
		Transport: &http.Transport{
			DisableKeepAlives: true,
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				var c net.Conn
				err := n.NS.Do(func() error {
					var err error
					c, err = (&net.Dialer{Timeout: 300 * time.Millisecond}).DialContext(ctx, network, addr)
					return err
				})
				return c, err
			},
		},
	}
	defer client.CloseIdleConnections()
	allowed := map[string]bool{}
	for _, p := range wantPods {
		allowed[p] = true
	}
	// In parallel, so that one check takes one round trip, not twenty.
	pods := make([]string, probeRequests)
	errs := make([]error, probeRequests)
	var wg sync.WaitGroup
	for i := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pods[i], errs[i] = nodeGet(ctx, client, "http://"+target+"/")
		}()
	}
	wg.Wait()
	seen := map[string]bool{}
	for i, pod := range pods {
		if errs[i] != nil {
			return fmt.Errorf("from %s: %w", n.Name, errs[i])
		}
		if !allowed[pod] {
			return fmt.Errorf("from %s: reached %s, not one of %v", n.Name, pod, wantPods)
		}
		seen[pod] = true
	}
	if len(seen) != len(allowed) {
		return fmt.Errorf("from %s: %d requests reached only %v of %v", n.Name, probeRequests, keys(seen), wantPods)
	}
	return nil
}

func nodeGet(ctx context.Context, client *http.Client, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	pod, _, err := echo(string(body))
	return pod, err
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// perNode makes one observer per lab node.
func perNode(l *lab.Lab, what string, check func(context.Context, *lab.Node) error) []observer {
	var out []observer
	for _, n := range l.Nodes {
		out = append(out, observer{what + " on " + n.Name, func(ctx context.Context) error { return check(ctx, n) }})
	}
	return out
}

func joinTimings(obs []observer, d []time.Duration) string {
	var parts []string
	for i, o := range obs {
		parts = append(parts, fmt.Sprintf("%s %v", o.name, d[i]))
	}
	return strings.Join(parts, ", ")
}
