package relay

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Authorizer admits a request by its bearer token.
type Authorizer interface {
	Admit(ctx context.Context, token string) error
}

// How long a verdict on a token is kept: a node role reconnects every few
// minutes (its watch's timeout), and 5,000 of them must not each cost the
// API server two reviews every time.
const (
	admittedFor = time.Minute
	refusedFor  = 10 * time.Second
)

// Reviews admits whoever the API server says may watch every pod: the
// token is reviewed (TokenReview), then its user's right to watch pods in
// all namespaces (SubjectAccessReview). The relay so gives no one what the
// API server would not.
type Reviews struct {
	Client kubernetes.Interface
	now    func() time.Time

	mu       sync.Mutex
	verdicts map[[32]byte]verdict
}

type verdict struct {
	err   error
	until time.Time
}

// Admit implements Authorizer.
func (a *Reviews) Admit(ctx context.Context, token string) error {
	now := time.Now
	if a.now != nil {
		now = a.now
	}
	h := sha256.Sum256([]byte(token))
	a.mu.Lock()
	v, ok := a.verdicts[h]
	a.mu.Unlock()
	if ok && now().Before(v.until) {
		return v.err
	}
	keep, err := a.review(ctx, token)
	if keep {
		a.mu.Lock()
		if a.verdicts == nil || len(a.verdicts) > 100_000 {
			a.verdicts = map[[32]byte]verdict{}
		}
		ttl := admittedFor
		if err != nil {
			ttl = refusedFor
		}
		a.verdicts[h] = verdict{err: err, until: now().Add(ttl)}
		a.mu.Unlock()
	}
	return err
}

// review asks the API server; keep is false when it could not answer, so
// the next request asks again.
func (a *Reviews) review(ctx context.Context, token string) (keep bool, err error) {
	tr, err := a.Client.AuthenticationV1().TokenReviews().Create(ctx, &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
	if err != nil {
		return false, fmt.Errorf("reviewing the token: %w", err)
	}
	if !tr.Status.Authenticated {
		return true, errors.New("the token is not valid")
	}
	u := tr.Status.User
	extra := map[string]authzv1.ExtraValue{}
	for k, v := range u.Extra {
		extra[k] = authzv1.ExtraValue(v)
	}
	sar, err := a.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
		User: u.Username, UID: u.UID, Groups: u.Groups, Extra: extra,
		ResourceAttributes: &authzv1.ResourceAttributes{Verb: "watch", Resource: "pods", Version: "v1"},
	}}, metav1.CreateOptions{})
	if err != nil {
		return false, fmt.Errorf("reviewing %s's access: %w", u.Username, err)
	}
	if !sar.Status.Allowed {
		return true, fmt.Errorf("%s may not watch pods in all namespaces", u.Username)
	}
	return true, nil
}
