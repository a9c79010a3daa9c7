package relay

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// reviewsOf answers TokenReviews from users (token → user; absent: not
// authenticated) and SubjectAccessReviews from allowed (users that may
// watch pods), counting the reviews asked.
func reviewsOf(users map[string]string, allowed map[string]bool, asked *int, down *bool) *Reviews {
	c := fake.NewClientset()
	c.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		*asked++
		if *down {
			return true, nil, errors.New("connection refused")
		}
		tr := a.(k8stesting.CreateAction).GetObject().(*authnv1.TokenReview)
		u, ok := users[tr.Spec.Token]
		tr.Status = authnv1.TokenReviewStatus{Authenticated: ok, User: authnv1.UserInfo{Username: u}}
		return true, tr, nil
	})
	c.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		sar := a.(k8stesting.CreateAction).GetObject().(*authzv1.SubjectAccessReview)
		ra := sar.Spec.ResourceAttributes
		sar.Status.Allowed = allowed[sar.Spec.User] && ra.Verb == "watch" && ra.Resource == "pods" && ra.Namespace == ""
		return true, sar, nil
	})
	return &Reviews{Client: c}
}

func TestTheRelayAdmitsWhomTheAPIServerLetsWatchPods(t *testing.T) {
	users := map[string]string{"node-token": "system:serviceaccount:kube-system:netplane-node", "app-token": "system:serviceaccount:default:app"}
	allowed := map[string]bool{"system:serviceaccount:kube-system:netplane-node": true}
	s := NewStore()
	relist(s, 10, apiPod("a", 1, "10.0.0.1", nil))
	for _, tc := range []struct {
		name, header string
		code         int
	}{
		{"a node role's token", "Bearer node-token", http.StatusOK},
		{"no token", "", http.StatusUnauthorized},
		{"another scheme", "Basic bm9kZTp4", http.StatusUnauthorized},
		{"a token the API server does not know", "Bearer forged", http.StatusForbidden},
		{"a user that may not watch every pod", "Bearer app-token", http.StatusForbidden},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var asked int
			var down bool
			srv := &Server{Store: s, Auth: reviewsOf(users, allowed, &asked, &down)}
			req := httptest.NewRequest(http.MethodGet, Path+"?limit=10", nil)
			if tc.header != "" {
				req.Header.Set("Authorization", tc.header)
			}
			rec := httptest.NewRecorder()
			srv.ServeHTTP(rec, req)
			if rec.Code != tc.code {
				t.Fatalf("status %d, want %d: %s", rec.Code, tc.code, rec.Body.String())
			}
			if tc.code == http.StatusOK && !strings.Contains(rec.Body.String(), "10.0.0.1") {
				t.Error("the admitted request got no pods")
			}
		})
	}
}

func TestAVerdictIsKeptButAnUnansweredReviewIsNot(t *testing.T) {
	var asked int
	var down bool
	a := reviewsOf(map[string]string{"tok": "u"}, map[string]bool{"u": true}, &asked, &down)
	now := time.Unix(1000, 0)
	a.now = func() time.Time { return now }
	ctx := context.Background()
	steps := []struct {
		name  string
		down  bool
		after time.Duration
		ok    bool
		asked int
	}{
		{"first request: reviewed", false, 0, true, 1},
		{"again within a minute: kept", false, 30 * time.Second, true, 1},
		{"after a minute: reviewed again", false, 31 * time.Second, true, 2},
		{"the API server away, verdict still kept", true, 10 * time.Second, true, 2},
		{"expired with the API server away: refused", true, 61 * time.Second, false, 3},
		{"unanswered is not kept: asked again", false, time.Second, true, 4},
	}
	for _, st := range steps {
		down, now = st.down, now.Add(st.after)
		err := a.Admit(ctx, "tok")
		if (err == nil) != st.ok || asked != st.asked {
			t.Fatalf("%s: err %v, %d reviews asked; want ok %v, %d", st.name, err, asked, st.ok, st.asked)
		}
	}
}
