package kit

import (
	"context"
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/client-go/util/flowcontrol"
)

// WriteBudget is the controllers' client-side write rate limit
// (--controller-kube-api-qps/burst), owned by the controllers instead of
// client-go so that a worker can wait for its write token BEFORE it takes a
// Service off the queue.
//
// Why: with client-go's limiter a worker dequeues a Service, computes its
// slices and then blocks in the token bucket; when the bucket is the
// bottleneck, flips that arrive during that wait re-dirty the Service and
// cost a second write later. Waiting first means each write carries every
// change up to the moment it is sent.
//
// Every request of the write client is still charged one token by
// Limiter (installed as the rest.Config's RateLimiter), exactly as
// client-go's own limiter would, so the rate and burst are those configured.
// On top of that, workers Reserve: a reservation is a promise that a token
// in the bucket is kept for the caller's next sync. It costs nothing by
// itself; the first write the sync makes for its key takes the token (and
// ends the promise), further writes wait for tokens like any request, and a
// sync that wrote nothing ends its promise in Release, which is how a
// reservation is given back. (rate.Reservation.Cancel cannot do this: it
// restores nothing once the reservation's time has come.)
type WriteBudget struct {
	lim *rate.Limiter

	mu sync.Mutex
	// promised counts reservations not yet used by a write nor released;
	// a new one is granted only while the bucket holds more tokens.
	promised int
	// held maps a key being synced to whether its reservation is unused.
	held map[string]bool
	// changed is closed (and replaced) when promised drops.
	changed chan struct{}
}

// NewWriteBudget returns a budget of qps writes per second with burst.
func NewWriteBudget(qps float32, burst int) *WriteBudget {
	return &WriteBudget{
		lim:     rate.NewLimiter(rate.Limit(qps), burst),
		held:    map[string]bool{},
		changed: make(chan struct{}),
	}
}

// Reservation is one worker's promised token; see WriteBudget.
type Reservation struct {
	b   *WriteBudget
	key string
	// open: not yet used by a write nor released.
	open bool
}

// Reserve waits until the bucket holds a token beyond those already
// promised and promises it to the caller, or returns ctx's error.
func (b *WriteBudget) Reserve(ctx context.Context) (*Reservation, error) {
	for {
		b.mu.Lock()
		now := time.Now()
		missing := float64(b.promised+1) - b.lim.TokensAt(now)
		if missing <= 0 {
			b.promised++
			b.mu.Unlock()
			return &Reservation{b: b, open: true}, nil
		}
		// More promises than the bucket can hold wait for one to end;
		// otherwise for the tokens still missing (or a promise ending).
		fits := b.promised+1 <= b.lim.Burst()
		changed := b.changed
		b.mu.Unlock()
		wait := time.Hour
		if fits {
			wait = time.Duration(math.Ceil(missing / float64(b.lim.Limit()) * float64(time.Second)))
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-changed:
			t.Stop()
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
	}
}

// For attaches the reservation to the key the worker took off the queue:
// the first write for that key uses it. The queue never hands one key to
// two workers at once, so a key identifies the sync.
func (r *Reservation) For(key string) {
	r.b.mu.Lock()
	defer r.b.mu.Unlock()
	if r.open {
		r.key = key
		r.b.held[key] = true
	}
}

// Release ends the reservation if no write used it (the sync wrote
// nothing, or the worker is stopping), so that another worker may dequeue.
func (r *Reservation) Release() {
	r.b.mu.Lock()
	defer r.b.mu.Unlock()
	if !r.open {
		return
	}
	r.open = false
	if r.key != "" {
		if !r.b.held[r.key] {
			return // a write used it
		}
		delete(r.b.held, r.key)
	}
	r.b.drop()
}

// Writing is called before each write made for key (by the slice client
// wrapper): the first one ends key's reservation, as its token is about to
// be taken by Limiter.
func (b *WriteBudget) Writing(key string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.held[key] {
		delete(b.held, key)
		b.drop()
	}
}

func (b *WriteBudget) drop() {
	b.promised--
	close(b.changed)
	b.changed = make(chan struct{})
}

// Limiter is the budget as a client-go rate limiter, for the write client's
// rest.Config: every request waits for one token.
func (b *WriteBudget) Limiter() flowcontrol.RateLimiter { return budgetLimiter{b.lim} }

type budgetLimiter struct{ lim *rate.Limiter }

func (l budgetLimiter) TryAccept() bool { return l.lim.Allow() }

func (l budgetLimiter) Accept() { _ = l.lim.Wait(context.Background()) }

func (l budgetLimiter) Wait(ctx context.Context) error { return l.lim.Wait(ctx) }

func (l budgetLimiter) QPS() float32 { return float32(l.lim.Limit()) }

func (l budgetLimiter) Stop() {}
