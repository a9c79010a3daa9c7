package dns

import (
	"fmt"
	"strconv"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

// The metrics keep CoreDNS's names and labels, so the dashboards and alerts
// operators already have for CoreDNS keep working when netplane replaces it.
// Every per-query series is resolved when the server starts: the query path
// indexes arrays instead of hashing label values.

// monitoredTypes are the query types with their own series, as CoreDNS's
// monitor list; every other type is counted as "other".
var monitoredTypes = []uint16{
	dns.TypeA, dns.TypeAAAA, dns.TypeCNAME, dns.TypeSRV, dns.TypePTR, dns.TypeTXT,
	dns.TypeSOA, dns.TypeNS, dns.TypeMX, dns.TypeDS, dns.TypeDNSKEY, dns.TypeHTTPS,
	dns.TypeSVCB, dns.TypeANY, dns.TypeAXFR, dns.TypeIXFR,
}

const (
	zoneCluster = iota // the cluster domain
	zoneOther          // everything forwarded (and reverse names)
	zones
)

type metrics struct {
	requests    [zones][2][2][]prometheus.Counter // zone, proto (udp, tcp), family (v4, v6), type
	responses   [zones][]prometheus.Counter       // rcode 0..23
	duration    [zones][]prometheus.Observer      // type
	cacheHits   [2]prometheus.Counter             // success, denial
	cacheMisses prometheus.Counter
	cacheStale  prometheus.Counter
	rejected    *prometheus.CounterVec
	autopath    prometheus.Counter
	upstreamRc  *prometheus.CounterVec
	upstreamEr  *prometheus.CounterVec
	program     *prometheus.HistogramVec
}

func typeIndex(t uint16) int {
	for i, m := range monitoredTypes {
		if m == t {
			return i
		}
	}
	return len(monitoredTypes)
}

func typeName(i int) string {
	if i == len(monitoredTypes) {
		return "other"
	}
	return dns.TypeToString[monitoredTypes[i]]
}

// newMetrics registers the DNS metrics on reg. server labels the series the
// way CoreDNS does ("dns://:53").
func newMetrics(reg prometheus.Registerer, server, origin string) (*metrics, error) {
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "coredns", Subsystem: "dns", Name: "requests_total",
		Help: "Counter of DNS requests made per zone, protocol, family and type."}, []string{"server", "zone", "view", "proto", "family", "type"})
	responses := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "coredns", Subsystem: "dns", Name: "responses_total",
		Help: "Counter of response status codes."}, []string{"server", "zone", "view", "rcode", "plugin"})
	duration := prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "coredns", Subsystem: "dns", Name: "request_duration_seconds",
		Help: "Histogram of the time (in seconds) each request took.", Buckets: prometheus.ExponentialBuckets(0.00025, 2, 16)},
		[]string{"server", "zone", "view", "type"})
	hits := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "coredns", Subsystem: "cache", Name: "hits_total",
		Help: "The count of cache hits."}, []string{"server", "type", "zones", "view"})
	miss := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "coredns", Subsystem: "cache", Name: "misses_total",
		Help: "The count of cache misses."}, []string{"server", "zones", "view"})
	stale := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "coredns", Subsystem: "cache", Name: "served_stale_total",
		Help: "The count of requests served from stale cache entries."}, []string{"server", "zones", "view"})
	autopath := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "coredns", Subsystem: "autopath", Name: "success_total",
		Help: "Counter of requests that did autopath."}, []string{"server"})
	m := &metrics{
		upstreamRc: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "coredns", Subsystem: "forward", Name: "responses_total",
			Help: "Counter of responses received per upstream."}, []string{"to", "rcode"}),
		upstreamEr: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "coredns", Subsystem: "forward", Name: "request_errors_total",
			Help: "Counter of upstream queries that failed (timeout, network error, SERVFAIL or REFUSED)."}, []string{"to"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "netplane", Subsystem: "dns", Name: "config_rejected_total",
			Help: "Counter of forwarding settings refused (kept the last good ones), by where they came from: file or configmap."}, []string{"source"}),
		program: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "coredns", Subsystem: "kubernetes", Name: "dns_programming_duration_seconds",
			Help:    "Histogram of the time (in seconds) from an EndpointSlice's last-change-trigger-time to its records being served.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 20)}, []string{"service_kind"}),
	}
	zoneLabel := [zones]string{origin, "."}
	for z := range zones {
		for p, proto := range []string{"udp", "tcp"} {
			for f, fam := range []string{"1", "2"} {
				for i := 0; i <= len(monitoredTypes); i++ {
					m.requests[z][p][f] = append(m.requests[z][p][f], requests.WithLabelValues(server, zoneLabel[z], "", proto, fam, typeName(i)))
				}
			}
		}
		for rc := 0; rc < 24; rc++ {
			name := dns.RcodeToString[rc]
			if name == "" {
				name = strconv.Itoa(rc)
			}
			m.responses[z] = append(m.responses[z], responses.WithLabelValues(server, zoneLabel[z], "", name, ""))
		}
		for i := 0; i <= len(monitoredTypes); i++ {
			m.duration[z] = append(m.duration[z], duration.WithLabelValues(server, zoneLabel[z], "", typeName(i)))
		}
	}
	m.cacheHits = [2]prometheus.Counter{hits.WithLabelValues(server, "success", ".", ""), hits.WithLabelValues(server, "denial", ".", "")}
	m.cacheMisses = miss.WithLabelValues(server, ".", "")
	m.cacheStale = stale.WithLabelValues(server, ".", "")
	m.autopath = autopath.WithLabelValues(server)
	if reg != nil {
		for _, c := range []prometheus.Collector{requests, responses, duration, hits, miss, stale, autopath, m.upstreamRc, m.upstreamEr, m.rejected, m.program} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("registering DNS metrics: %w", err)
			}
		}
	}
	return m, nil
}

// query records one answered query.
func (m *metrics) query(zone int, tcp, v6 bool, qtype uint16, rcode int, took time.Duration) {
	if m == nil {
		return
	}
	p, f, t := 0, 0, typeIndex(qtype)
	if tcp {
		p = 1
	}
	if v6 {
		f = 1
	}
	m.requests[zone][p][f][t].Inc()
	if rcode >= 0 && rcode < len(m.responses[zone]) {
		m.responses[zone][rcode].Inc()
	}
	m.duration[zone][t].Observe(took.Seconds())
}

func (m *metrics) cacheHit(negative bool) {
	if m == nil {
		return
	}
	if negative {
		m.cacheHits[1].Inc()
	} else {
		m.cacheHits[0].Inc()
	}
}

func (m *metrics) cacheMiss() {
	if m != nil {
		m.cacheMisses.Inc()
	}
}

func (m *metrics) servedStale() {
	if m != nil {
		m.cacheStale.Inc()
	}
}

// rejectedConfig counts forwarding settings refused from source.
func (m *metrics) rejectedConfig(source string) {
	if m != nil {
		m.rejected.WithLabelValues(source).Inc()
	}
}

func (m *metrics) autopathHit() {
	if m != nil {
		m.autopath.Inc()
	}
}

func (m *metrics) upstreamResponse(to string, rcode int) {
	if m != nil {
		m.upstreamRc.WithLabelValues(to, dns.RcodeToString[rcode]).Inc()
	}
}

func (m *metrics) upstreamError(to string) {
	if m != nil {
		m.upstreamEr.WithLabelValues(to).Inc()
	}
}

func (m *metrics) programmed(kind string, took time.Duration) {
	if m != nil {
		m.program.WithLabelValues(kind).Observe(took.Seconds())
	}
}
