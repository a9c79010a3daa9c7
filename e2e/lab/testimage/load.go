package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
)

// listFlag is a flag that may be given more than once.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// TargetResult is one target's tally: requests made at the rate, failed,
// the longest time between two answered requests, and the first failure.
type TargetResult struct {
	Kind       string        `json:"kind"`
	Target     string        `json:"target"`
	OK         int64         `json:"ok"`
	Failed     int64         `json:"failed"`
	LongestGap time.Duration `json:"longestGap"`
	GapEnded   time.Time     `json:"gapEnded,omitzero"` // when the longest gap ended
	FirstError string        `json:"firstError,omitempty"`
	LastError  string        `json:"lastError,omitempty"`
	// FailedBy counts the failures by the second (15:04:05) they were
	// sent in: where in a disruption they fell.
	FailedBy map[string]int `json:"failedBy,omitempty"`

	answered func() // called on the first answer
}

// LoadResult is what load prints as JSON when it stops.
type LoadResult struct {
	Started time.Time      `json:"started"`
	Seconds float64        `json:"seconds"`
	Stopped string         `json:"stopped"` // "stop-file", or "max" when --max ended it
	Targets []TargetResult `json:"targets"`
	Held    []HeldResult   `json:"held"`
}

// load opens new connections to every --get URL and sends a DNS query
// (one UDP exchange with the first nameserver of resolv.conf, no retry)
// for every --lookup name, each at --rate per second, and keeps one HTTP
// connection per --hold URL open with a request every 200 ms, until
// --stop-file exists (or --max has passed); then it prints a LoadResult.
// Once every target has answered it makes --started-file.
func load(args []string) error {
	res, err := runLoad(args)
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}

func runLoad(args []string) (LoadResult, error) {
	fs := flag.NewFlagSet("load", flag.ExitOnError)
	var gets, lookups, holds listFlag
	fs.Var(&gets, "get", "URL to GET on a new connection at the rate (repeatable)")
	fs.Var(&lookups, "lookup", "name to query at the rate (repeatable)")
	lookupType := fs.String("lookup-type", "A", "record type of every --lookup: A or AAAA")
	fs.Var(&holds, "hold", "URL to GET every 200 ms on one kept connection (repeatable)")
	rate := fs.Int("rate", 10, "new requests per second of each --get and --lookup")
	timeout := fs.Duration("timeout", 2*time.Second, "timeout of one request")
	stopFile := fs.String("stop-file", "/tmp/load.stop", "load stops once this file exists")
	startedFile := fs.String("started-file", "/tmp/load.started", "made once every target has answered")
	maxTime := fs.Duration("max", 10*time.Minute, "load stops after this long at the latest")
	fs.Parse(args)
	server, err := nameserver()
	if len(lookups) > 0 && err != nil {
		return LoadResult{}, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), *maxTime)
	defer cancel()
	var sawStop atomic.Bool
	go func() {
		for ctx.Err() == nil {
			if _, err := os.Stat(*stopFile); err == nil {
				sawStop.Store(true)
				cancel()
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	start := time.Now()
	var wg sync.WaitGroup
	res := LoadResult{Started: start}
	res.Targets = make([]TargetResult, 0, len(gets)+len(lookups))
	for _, u := range gets {
		res.Targets = append(res.Targets, TargetResult{Kind: "get", Target: u})
	}
	for _, q := range lookups {
		res.Targets = append(res.Targets, TargetResult{Kind: "dns", Target: q})
	}
	res.Held = make([]HeldResult, len(holds))
	var answered sync.WaitGroup
	answered.Add(len(res.Targets) + len(holds))
	go func() {
		answered.Wait()
		os.WriteFile(*startedFile, nil, 0o644)
	}()
	for i := range res.Targets {
		t := &res.Targets[i]
		t.answered = answered.Done
		req := func() error { return getOnce(t.Target, *timeout, nil) }
		if t.Kind == "dns" {
			req = func() error { return queryOnce(server, t.Target, dns.StringToType[*lookupType], *timeout) }
		}
		wg.Add(1)
		go func() { defer wg.Done(); atRate(ctx, *rate, req, t) }()
	}
	for i, u := range holds {
		wg.Add(1)
		h := held{url: u, interval: 200 * time.Millisecond, timeout: *timeout, dial: (&net.Dialer{Timeout: *timeout}).DialContext}
		go func() { defer wg.Done(); res.Held[i] = h.run(ctx, answered.Done) }()
	}
	<-ctx.Done()
	wg.Wait()
	res.Seconds = time.Since(start).Seconds()
	res.Stopped = "max"
	if sawStop.Load() {
		res.Stopped = "stop-file"
	}
	return res, nil
}

// atRate starts req every 1/rate s, each in its own goroutine so a slow
// one does not delay the next, and tallies the outcomes into t.
func atRate(ctx context.Context, rate int, req func() error, t *TargetResult) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	last := time.Now()
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			return
		case <-tick.C:
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sent := time.Now()
			err := req()
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if t.FailedBy == nil {
					t.FailedBy = map[string]int{}
				}
				t.FailedBy[sent.Format("15:04:05")]++
				t.LastError = time.Now().Format("15:04:05.000 ") + err.Error()
				t.Failed++
				if t.FirstError == "" {
					t.FirstError = time.Now().Format("15:04:05.000 ") + err.Error()
				}
				return
			}
			if t.OK++; t.OK == 1 {
				t.answered()
			}
			now := time.Now()
			if gap := now.Sub(last); gap > t.LongestGap {
				t.LongestGap, t.GapEnded = gap, now
			}
			last = now
		}()
	}
}

// getOnce is one GET on a new connection, its name looked up by a
// resolver of its own (dialling dnsDial, or resolv.conf's servers when
// nil). Go's resolvers share a lookup of one name while it is in flight:
// with one resolver for all requests, a query lost in a disruption holds
// every later request for that name until its 5 s timeout, and they fail
// long after the network is back.
func getOnce(url string, timeout time.Duration, dnsDial func(ctx context.Context, network, address string) (net.Conn, error)) error {
	dialer := &net.Dialer{Resolver: &net.Resolver{PreferGo: true, Dial: dnsDial}}
	client := &http.Client{Timeout: timeout, Transport: &http.Transport{DisableKeepAlives: true, DialContext: dialer.DialContext}}
	resp, err := client.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		return errors.New(resp.Status)
	}
	return nil
}

// queryOnce is one UDP exchange on a new socket: a lost query is a
// failure, not a retry.
func queryOnce(server, name string, qtype uint16, timeout time.Duration) error {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	c := &dns.Client{Timeout: timeout}
	r, _, err := c.Exchange(m, server)
	if err != nil {
		return err
	}
	if r.Rcode != dns.RcodeSuccess || len(r.Answer) == 0 {
		return fmt.Errorf("%s: %s with %d answers", name, dns.RcodeToString[r.Rcode], len(r.Answer))
	}
	return nil
}

// nameserver is the first nameserver of /etc/resolv.conf, as host:53.
func nameserver() (string, error) {
	data, err := os.ReadFile("/etc/resolv.conf")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "nameserver" {
			return net.JoinHostPort(f[1], "53"), nil
		}
	}
	return "", errors.New("/etc/resolv.conf names no nameserver")
}

// touch creates a file, for a test to stop a load by its --stop-file.
func touch(args []string) error {
	if len(args) != 1 {
		return errors.New("usage: touch PATH")
	}
	return os.WriteFile(args[0], nil, 0o644)
}

// waitFile waits up to 30 s for a file to exist: a load's --started-file.
func waitFile(args []string) error {
	if len(args) != 1 {
		return errors.New("usage: wait-file PATH")
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(args[0]); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not there after 30s", args[0])
		}
		time.Sleep(20 * time.Millisecond)
	}
}
