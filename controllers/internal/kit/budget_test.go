package kit

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// budgetClient is a client whose only rate limit is budget's, against a
// loopback server that answers every request, and the number of requests
// the server saw.
func budgetClient(t *testing.T, budget *WriteBudget) (kubernetes.Interface, *atomic.Int32) {
	t.Helper()
	var seen atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{"name":"x","namespace":"ns"},"addressType":"IPv4","endpoints":[]}`))
	}))
	t.Cleanup(srv.Close)
	c, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL, RateLimiter: budget.Limiter()})
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewMetrics(prometheus.NewRegistry(), "test", func() int { return 0 })
	if err != nil {
		t.Fatal(err)
	}
	return CountWrites(c, m, budget, logr.Discard()), &seen
}

func testSlice(svc string) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: svc + "-x",
		Labels: map[string]string{discoveryv1.LabelServiceName: svc}}, AddressType: discoveryv1.AddressTypeIPv4}
}

// TestWriteBudgetLimitsEveryWrite sends creates, updates and deletes, from
// several goroutines, through a client limited only by the budget (10/s,
// burst 2): they must take at least as long as the bucket allows. Writes
// that bypassed the limiter would be done in milliseconds.
func TestWriteBudgetLimitsEveryWrite(t *testing.T) {
	budget := NewWriteBudget(10, 2)
	c, seen := budgetClient(t, budget)
	api := c.DiscoveryV1().EndpointSlices("ns")
	ctx := context.Background()
	start := time.Now()
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Go(func() {
			s := testSlice("a")
			var err error
			switch i {
			case 0:
				_, err = api.Create(ctx, s, metav1.CreateOptions{})
			case 1:
				_, err = api.Update(ctx, s, metav1.UpdateOptions{})
			default:
				err = api.Delete(ctx, s.Name, metav1.DeleteOptions{})
			}
			if err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	for range 3 {
		if _, err := api.Update(ctx, testSlice("b"), metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// 6 writes, 2 from the burst, 4 more at 100 ms each.
	if took := time.Since(start); took < 350*time.Millisecond {
		t.Errorf("6 writes at 10/s with burst 2 took %v, want at least 400 ms", took)
	}
	if n := seen.Load(); n != 6 {
		t.Errorf("server saw %d requests, want 6", n)
	}
}

// TestLoopReservesBeforeDequeuing runs one worker under a budget of 10/s,
// burst 1: a sync that writes takes the token, so the next key is only
// taken off the queue once a new token is there (100 ms later); syncs that
// write nothing give their reservation back and follow at once.
func TestLoopReservesBeforeDequeuing(t *testing.T) {
	budget := NewWriteBudget(10, 1)
	c, seen := budgetClient(t, budget)
	m, err := NewMetrics(prometheus.NewRegistry(), "loop", func() int { return 0 })
	if err != nil {
		t.Fatal(err)
	}
	q := NewQueue("test")
	var mu sync.Mutex
	taken := map[string]time.Time{}
	var done sync.WaitGroup
	done.Add(5)
	l := &Loop{Queue: q, Metrics: m, Log: testr.New(t), Budget: budget,
		Sync: func(ctx context.Context, key string) error {
			defer done.Done()
			mu.Lock()
			taken[key] = time.Now()
			mu.Unlock()
			if key[len("ns/")] == 'w' { // keys starting with w write their slice
				_, err := c.DiscoveryV1().EndpointSlices("ns").Update(ctx, testSlice(key[len("ns/"):]), metav1.UpdateOptions{})
				return err
			}
			return nil
		}}
	for _, k := range []string{"ns/w1", "ns/w2", "ns/n1", "ns/n2", "ns/n3"} {
		q.Add(k)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { l.Run(ctx, 1); close(stopped) }()
	done.Wait()
	cancel()
	<-stopped

	gap := func(a, b string) time.Duration { return taken[b].Sub(taken[a]) }
	if d := gap("ns/w1", "ns/w2"); d < 80*time.Millisecond {
		t.Errorf("w2 taken %v after w1 wrote, want about 100 ms (a token first)", d)
	}
	if d := gap("ns/w2", "ns/n1"); d < 80*time.Millisecond {
		t.Errorf("n1 taken %v after w2 wrote, want about 100 ms (a token first)", d)
	}
	if d := gap("ns/n1", "ns/n3"); d > 60*time.Millisecond {
		t.Errorf("n3 taken %v after n1, want at once: syncs without writes give their token back", d)
	}
	if n := seen.Load(); n != 2 {
		t.Errorf("server saw %d writes, want 2", n)
	}
	budget.mu.Lock()
	defer budget.mu.Unlock()
	if budget.promised != 0 || len(budget.held) != 0 {
		t.Errorf("after stopping: %d reservations promised, %d held, want none", budget.promised, len(budget.held))
	}
}
