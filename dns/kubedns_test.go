package dns

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/netplane/netplane/e2e/framework"
)

// queryLog is one query's outcome, as a client sending a query every 10 ms
// saw it.
type queryLog struct {
	at  time.Time // when the answer came
	ip  string
	err error
}

// querier asks one name of a server every 10 ms until stopped, and keeps
// every outcome.
type querier struct {
	mu         sync.Mutex
	log        []queryLog
	quit, done chan struct{}
}

func startQuerier(server, name string) *querier {
	q := &querier{quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(q.done)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		c := &dns.Client{Timeout: time.Second}
		for {
			select {
			case <-q.quit:
				return
			case <-tick.C:
			}
			m, _, err := c.Exchange(query(name, dns.TypeA), server)
			var ip string
			if err == nil {
				ip, err = answerIP(m)
			}
			q.mu.Lock()
			q.log = append(q.log, queryLog{time.Now(), ip, err})
			q.mu.Unlock()
		}
	}()
	return q
}

// stop ends the queries and returns every outcome.
func (q *querier) stop() []queryLog {
	select {
	case <-q.quit:
	default:
		close(q.quit)
	}
	<-q.done
	return q.log
}

// answers waits until the client has got answers from the server of ip
// for 20 queries in a row, and returns when the first of them came.
func (q *querier) answers(t *testing.T, ip, what string) time.Time {
	t.Helper()
	var first time.Time
	framework.EventuallyEvery(t, 10*time.Millisecond, 3*time.Second, what, func() error {
		q.mu.Lock()
		defer q.mu.Unlock()
		run := 0
		for i := len(q.log) - 1; i >= 0 && q.log[i].ip == ip; i-- {
			run, first = run+1, q.log[i].at
		}
		if run < 20 {
			return fmt.Errorf("%d answers in a row from %s", run, ip)
		}
		return nil
	})
	return first
}

func TestTheKubeDNSConfigMapReroutesWithin2sWithoutAFailedQuery(t *testing.T) {
	api := framework.SharedAPIServer(t, framework.Options{})
	ctx := framework.Ctx(t)
	up, corp, corp2 := answering(t, "192.0.2.1"), answering(t, "10.0.0.1"), answering(t, "10.0.0.2")
	const ns, name = "kube-system", "kube-dns-reroute"
	c := dnsConfig(t, up.Addr)
	c.KubeDNSConfigMap = ns + "/" + name
	s, reg := startServer(t, c, api.Client, true)
	cms := api.Client.CoreV1().ConfigMaps(ns)
	if _, err := api.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	q := startQuerier(s.Listeners.Addr, "www.corp.example.")
	defer q.stop() // when the test ends early
	q.answers(t, "192.0.2.1", "the upstream server to answer")

	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Data: map[string]string{"stubDomains": fmt.Sprintf(`{"corp.example": [%q]}`, corp.Addr)}}
	if _, err := cms.Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	written := time.Now()
	took := q.answers(t, "10.0.0.1", "the new ConfigMap's stub domain to apply").Sub(written)
	t.Logf("ConfigMap created → first answer from its stub domain's server: %v", took)
	if took > 2*time.Second {
		t.Errorf("the ConfigMap applied %v after its write, want within 2s", took)
	}

	cm.Data["stubDomains"] = fmt.Sprintf(`{"corp.example": [%q]}`, corp2.Addr)
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	written = time.Now()
	took = q.answers(t, "10.0.0.2", "the changed stub domain to apply").Sub(written)
	t.Logf("ConfigMap updated → first answer from the new server: %v", took)
	if took > 2*time.Second {
		t.Errorf("the ConfigMap applied %v after its write, want within 2s", took)
	}

	// Malformed: the last good configuration stays, and the author is told.
	cm.Data["stubDomains"] = fmt.Sprintf(`{"corp.example": %q}`, corp.Addr)
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	framework.EventuallyEvery(t, 10*time.Millisecond, 5*time.Second, "a Warning event on the ConfigMap", func() error {
		evs, err := api.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=ConfigMap,involvedObject.name=" + name})
		if err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Type == corev1.EventTypeWarning && e.Reason == "InvalidDNSConfig" && strings.Contains(e.Message, "data.stubDomains: must be a JSON object") {
				return nil
			}
		}
		return fmt.Errorf("no such event among %d", len(evs.Items))
	})
	if n := gatheredValue(t, reg, "netplane_dns_config_rejected_total", "source", "configmap"); n != 1 {
		t.Errorf("%v rejected ConfigMaps counted, want 1", n)
	}
	q.answers(t, "10.0.0.2", "the last good stub domain to stay")

	// Deleted: the file's forwarding again.
	if err := cms.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	q.answers(t, "192.0.2.1", "the file's forwarding after the delete")

	var errs []error
	log := q.stop()
	for _, r := range log {
		if r.err != nil {
			errs = append(errs, fmt.Errorf("at %s: %w", r.at.Format("15:04:05.000"), r.err))
		}
	}
	t.Logf("%d queries every 10 ms across the changes, %d failed", len(log), len(errs))
	if err := errors.Join(errs...); err != nil {
		t.Error(err)
	}
}

// TestARelistAppliesTheKubeDNSConfigMapOnlyWhenItChanged: after an API
// server outage the watch lists again; the ConfigMap it finds unchanged
// is not applied again (nor, when invalid, reported again), one changed
// or gone is.
func TestARelistAppliesTheKubeDNSConfigMapOnlyWhenItChanged(t *testing.T) {
	cm := func(rv string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "kube-dns", ResourceVersion: rv},
			Data: map[string]string{"upstreamNameservers": `["10.0.0.` + rv + `"]`}}
	}
	for _, tc := range []struct {
		name  string
		steps func(w *configMapWatch)
		want  []string // what apply was handed, "deleted" for nil
	}{
		{"absent at the first list", func(w *configMapWatch) { _ = w.Replace(nil, "") }, nil},
		{"listed", func(w *configMapWatch) { _ = w.Replace([]any{cm("1")}, "") }, []string{"10.0.0.1"}},
		{"relisted unchanged", func(w *configMapWatch) {
			_ = w.Replace([]any{cm("1")}, "")
			_ = w.Replace([]any{cm("1")}, "")
		}, []string{"10.0.0.1"}},
		{"relisted changed", func(w *configMapWatch) {
			_ = w.Replace([]any{cm("1")}, "")
			_ = w.Replace([]any{cm("2")}, "")
		}, []string{"10.0.0.1", "10.0.0.2"}},
		{"gone at the relist", func(w *configMapWatch) {
			_ = w.Replace([]any{cm("1")}, "")
			_ = w.Replace(nil, "")
			_ = w.Replace(nil, "")
		}, []string{"10.0.0.1", "deleted"}},
		{"watched, then relisted unchanged", func(w *configMapWatch) {
			_ = w.Add(cm("1"))
			_ = w.Update(cm("3"))
			_ = w.Replace([]any{cm("3")}, "")
		}, []string{"10.0.0.1", "10.0.0.3"}},
		{"deleted, then absent at the relist", func(w *configMapWatch) {
			_ = w.Add(cm("1"))
			_ = w.Delete(cm("1"))
			_ = w.Replace(nil, "")
		}, []string{"10.0.0.1", "deleted"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			w := &configMapWatch{ns: "kube-system", name: "kube-dns", apply: func(data map[string]string) error {
				if data == nil {
					got = append(got, "deleted")
				} else {
					got = append(got, strings.Trim(data["upstreamNameservers"], `[]"`))
				}
				return nil
			}}
			tc.steps(w)
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("applied %v, want %v", got, tc.want)
			}
		})
	}
}
