package relay

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Path is where the relay serves the pods' digests, as the API server
// serves pods: a node role lists and watches it with client-go's own
// reflector, as it would the API server.
const Path = "/api/v1/pods"

// bookmarkEvery is how often a quiet watch is told the store's version,
// so that a node role resuming after a relay restart or on another relay
// resumes from a recent version rather than listing again.
const bookmarkEvery = 15 * time.Second

// longestWatch ends a watch that named no timeout: its reflector watches
// again from where it was.
const longestWatch = 30 * time.Minute

// Server serves a store's pods to node roles.
type Server struct {
	Store *Store
	// Auth admits a request's bearer token; nil admits every request.
	Auth    Authorizer
	Metrics *Metrics
	// Bookmarks overrides bookmarkEvery (tests).
	Bookmarks time.Duration
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != Path {
		writeStatus(w, http.StatusNotFound, metav1.StatusReasonNotFound, "the relay serves "+Path+" only")
		return
	}
	if r.Method != http.MethodGet {
		writeStatus(w, http.StatusMethodNotAllowed, metav1.StatusReasonMethodNotAllowed, "the relay is read-only")
		return
	}
	if s.Auth != nil {
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || token == "" {
			writeStatus(w, http.StatusUnauthorized, metav1.StatusReasonUnauthorized, "a bearer token is required")
			return
		}
		if err := s.Auth.Admit(r.Context(), token); err != nil {
			s.Metrics.refused()
			writeStatus(w, http.StatusForbidden, metav1.StatusReasonForbidden, err.Error())
			return
		}
	}
	q := r.URL.Query()
	if q.Get("labelSelector") != "" || q.Get("fieldSelector") != "" || q.Get("sendInitialEvents") != "" {
		writeStatus(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, "the relay serves every pod, by list and watch: no selectors, no streamed lists")
		return
	}
	if !s.Store.Synced() {
		w.Header().Set("Retry-After", "1")
		writeStatus(w, http.StatusServiceUnavailable, metav1.StatusReasonServiceUnavailable, "the relay has not listed the pods yet")
		return
	}
	if v := q.Get("watch"); v == "true" || v == "1" {
		s.watch(w, r)
		return
	}
	s.list(w, r)
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit, _ := strconv.Atoi(q.Get("limit"))
	var after string
	var at uint64
	if c := q.Get("continue"); c != "" {
		var ok bool
		if at, after, ok = readContinue(c); !ok {
			writeStatus(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, "malformed continue token")
			return
		}
	}
	items, rv, next := s.Store.Page(after, limit)
	if at == 0 {
		at = rv
	}
	token := ""
	if next != "" {
		token = writeContinue(at, next)
	}
	body := listBody(items, at, token)
	w.Header().Set("Content-Type", protobufType)
	if len(body) >= compressFrom && strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
		var z bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&z, gzip.BestSpeed) // a valid level
		_, _ = zw.Write(body)
		_ = zw.Close()
		body = z.Bytes()
		w.Header().Set("Content-Encoding", "gzip")
	}
	_, _ = w.Write(body)
	s.Metrics.listed(len(body))
}

// compressFrom is the size from which a page is sent compressed, as the
// API server compresses its responses (a page of 500 digests is about
// 150 kB, a third of that compressed).
const compressFrom = 128 << 10

func writeContinue(rv uint64, after string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatUint(rv, 10) + "/" + after))
}

func readContinue(token string) (uint64, string, bool) {
	b, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil {
		return 0, "", false
	}
	v, after, ok := strings.Cut(string(b), "/")
	rv, err := strconv.ParseUint(v, 10, 64)
	return rv, after, ok && err == nil && rv > 0
}

func (s *Server) watch(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	flusher, _ := w.(http.Flusher)
	from := version(q.Get("resourceVersion"))
	if from == 0 {
		from = s.Store.Version()
	}
	timeout := longestWatch
	if t, err := strconv.Atoi(q.Get("timeoutSeconds")); err == nil && t > 0 {
		timeout = min(timeout, time.Duration(t)*time.Second)
	}
	every := bookmarkEvery
	if s.Bookmarks > 0 {
		every = s.Bookmarks
	}
	w.Header().Set("Content-Type", protobufWatchType)
	w.WriteHeader(http.StatusOK)
	send := func(frames ...[]byte) bool {
		for _, f := range frames {
			if _, err := w.Write(f); err != nil {
				return false
			}
			s.Metrics.sent(len(f))
		}
		if flusher != nil {
			flusher.Flush()
		}
		return true
	}
	send() // the headers: the reader's watch has begun
	c, ok := s.since(r, from)
	if !ok {
		send(goneFrame(fmt.Sprintf("too old resource version: %d (the relay keeps changes from %d on)", from, s.Store.Version())))
		return
	}
	s.Metrics.watching(1)
	defer s.Metrics.watching(-1)
	end := time.NewTimer(timeout)
	defer end.Stop()
	tick := time.NewTicker(every)
	defer tick.Stop()
	bookmarks, told := q.Get("allowWatchBookmarks") == "true", from
	for {
		frames, next, wake, ok := s.Store.Next(c)
		if !ok {
			send(goneFrame("the watch fell behind the relay's kept changes"))
			return
		}
		if len(frames) > 0 && !send(frames...) {
			return
		}
		c = next
		select {
		case <-wake:
		case <-tick.C:
			if v := s.Store.Version(); bookmarks && v > told {
				if !send(bookmarkFrame(v)) {
					return
				}
				told = v
			}
		case <-end.C:
			return
		case <-r.Context().Done():
			return
		}
	}
}

// since is the store's cursor after version from, waiting a few seconds
// for a store behind it: a node role that moves from a relay ahead of this
// one resumes here rather than listing again.
func (s *Server) since(r *http.Request, from uint64) (Cursor, bool) {
	deadline := time.NewTimer(5 * time.Second)
	defer deadline.Stop()
	for {
		wake := s.Store.Changed()
		c, ok := s.Store.Since(from)
		if ok || from < s.Store.Version() {
			return c, ok
		}
		select {
		case <-wake:
		case <-deadline.C:
			return Cursor{}, false
		case <-r.Context().Done():
			return Cursor{}, false
		}
	}
}

func writeStatus(w http.ResponseWriter, code int, reason metav1.StatusReason, msg string) {
	st := &metav1.Status{Status: metav1.StatusFailure, Code: int32(code), Reason: reason, Message: msg} //nolint:gosec // an HTTP status
	w.Header().Set("Content-Type", protobufType)
	w.WriteHeader(code)
	_, _ = w.Write(envelope("Status", mustMarshal(st)))
}
