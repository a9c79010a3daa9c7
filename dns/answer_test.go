package dns

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/miekg/dns"
)

const soaLine = "cluster.local. 5 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 0 7200 1800 86400 5"

// answerCase is one question and the whole expected answer.
type answerCase struct {
	name   string
	qname  string
	qtype  uint16
	rcode  int
	answer []string
	ns     []string
	extra  []string
	chase  string
}

func nodata(name, qname string, qtype uint16) answerCase {
	return answerCase{name: name, qname: qname, qtype: qtype, ns: []string{soaLine}}
}

func nxdomain(name, qname string, qtype uint16) answerCase {
	return answerCase{name: name, qname: qname, qtype: qtype, rcode: dns.RcodeNameError, ns: []string{soaLine}}
}

// The numbered cases are CoreDNS's own expectations (plugin/kubernetes:
// handler_test.go, ns_test.go, reverse_test.go, handler_pod_*_test.go):
// 1-16 the zone's records, NODATA and NXDOMAIN; 17-27 headless Services;
// 28-40 ExternalName, dual stack, PTR, pod records and edge cases. Cases
// without a number are netplane's own.
var answerCases = []answerCase{
	{name: "1 dns-version TXT", qname: "dns-version.cluster.local.", qtype: dns.TypeTXT,
		answer: []string{`dns-version.cluster.local. 28800 IN TXT "1.1.0"`}},
	nodata("dns-version other type is NODATA", "dns-version.cluster.local.", dns.TypeA),
	{name: "2 ClusterIP A", qname: "svc1.testns.svc.cluster.local.", qtype: dns.TypeA,
		answer: []string{"svc1.testns.svc.cluster.local. 5 IN A 10.96.100.1"}},
	nodata("3 v4 service AAAA is NODATA", "svc1.testns.svc.cluster.local.", dns.TypeAAAA),
	nodata("4 service TXT is NODATA", "svc1.testns.svc.cluster.local.", dns.TypeTXT),
	nodata("5 service SOA is NODATA", "svc1.testns.svc.cluster.local.", dns.TypeSOA),
	nodata("unusual type on a service is NODATA", "svc1.testns.svc.cluster.local.", dns.TypeHINFO),
	{name: "6 bare-name SRV", qname: "svc1.testns.svc.cluster.local.", qtype: dns.TypeSRV,
		answer: []string{"svc1.testns.svc.cluster.local. 5 IN SRV 0 100 80 svc1.testns.svc.cluster.local."},
		extra:  []string{"svc1.testns.svc.cluster.local. 5 IN A 10.96.100.1"}},
	{name: "7 named port SRV", qname: "_http._tcp.svc1.testns.svc.cluster.local.", qtype: dns.TypeSRV,
		answer: []string{"_http._tcp.svc1.testns.svc.cluster.local. 5 IN SRV 0 100 80 svc1.testns.svc.cluster.local."},
		extra:  []string{"svc1.testns.svc.cluster.local. 5 IN A 10.96.100.1"}},
	{name: "8 case is preserved in owner and target zone", qname: "_HtTp._TcP.sVc1.TeStNs.SvC.cLuStEr.LoCaL.", qtype: dns.TypeSRV,
		answer: []string{"_HtTp._TcP.sVc1.TeStNs.SvC.cLuStEr.LoCaL. 5 IN SRV 0 100 80 svc1.testns.svc.cLuStEr.LoCaL."},
		extra:  []string{"svc1.testns.svc.cLuStEr.LoCaL. 5 IN A 10.96.100.1"}},
	{name: "case preserved in A owner", qname: "SvC1.TeStNs.SvC.cLuStEr.LoCaL.", qtype: dns.TypeA,
		answer: []string{"SvC1.TeStNs.SvC.cLuStEr.LoCaL. 5 IN A 10.96.100.1"}},
	{name: "case preserved in negative SOA", qname: "not-a-service.testns.svc.ClUsTeR.lOcAl.", qtype: dns.TypeA, rcode: dns.RcodeNameError,
		ns: []string{"ClUsTeR.lOcAl. 5 IN SOA ns.dns.ClUsTeR.lOcAl. hostmaster.ClUsTeR.lOcAl. 0 7200 1800 86400 5"}},
	nxdomain("unknown port name is NXDOMAIN", "_https._tcp.svc1.testns.svc.cluster.local.", dns.TypeSRV),
	nodata("named port A is NODATA", "_http._tcp.svc1.testns.svc.cluster.local.", dns.TypeA),
	nxdomain("9 unknown service A", "svc0.testns.svc.cluster.local.", dns.TypeA),
	nxdomain("9 unknown service AAAA", "svc0.testns.svc.cluster.local.", dns.TypeAAAA),
	nxdomain("10 unknown namespace A", "svc0.nsnoexist.svc.cluster.local.", dns.TypeA),
	nxdomain("10 unknown namespace TXT", "svc0.nsnoexist.svc.cluster.local.", dns.TypeTXT),
	nodata("11 namespace without service", "testns.svc.cluster.local.", dns.TypeA),
	nxdomain("unknown namespace name", "nsnoexist.svc.cluster.local.", dns.TypeA),
	nodata("12 svc label", "svc.cluster.local.", dns.TypeA),
	nodata("12 pod label", "pod.cluster.local.", dns.TypeA),
	nxdomain("other second-level label", "foo.cluster.local.", dns.TypeA),
	{name: "13 apex SOA", qname: "cluster.local.", qtype: dns.TypeSOA, answer: []string{soaLine}},
	{name: "14 apex NS with glue", qname: "cluster.local.", qtype: dns.TypeNS,
		answer: []string{"cluster.local. 5 IN NS kube-dns.kube-system.svc.cluster.local."},
		extra:  []string{"kube-dns.kube-system.svc.cluster.local. 5 IN A 10.96.0.10"}},
	nodata("15 apex A", "cluster.local.", dns.TypeA),
	nodata("15 apex AAAA", "cluster.local.", dns.TypeAAAA),
	nodata("15 apex SRV", "cluster.local.", dns.TypeSRV),
	nodata("15 apex HINFO", "cluster.local.", dns.TypeHINFO),
	nodata("16 svc NS", "svc.cluster.local.", dns.TypeNS),
	nxdomain("16 foo NS", "foo.cluster.local.", dns.TypeNS),
	nxdomain("16 foo.svc NS", "foo.svc.cluster.local.", dns.TypeNS),

	{name: "17 headless A: ready endpoints only, deduplicated", qname: "hdls1.testns.svc.cluster.local.", qtype: dns.TypeA,
		answer: []string{
			"hdls1.testns.svc.cluster.local. 5 IN A 172.16.0.2",
			"hdls1.testns.svc.cluster.local. 5 IN A 172.16.0.3",
			"hdls1.testns.svc.cluster.local. 5 IN A 172.16.0.4",
			"hdls1.testns.svc.cluster.local. 5 IN A 172.16.0.5",
		}},
	{name: "18 headless AAAA", qname: "hdls1.testns.svc.cluster.local.", qtype: dns.TypeAAAA,
		answer: []string{
			"hdls1.testns.svc.cluster.local. 5 IN AAAA 5678:abcd::1",
			"hdls1.testns.svc.cluster.local. 5 IN AAAA 5678:abcd::2",
		}},
	{name: "19 headless SRV per endpoint", qname: "_http._tcp.hdls1.testns.svc.cluster.local.", qtype: dns.TypeSRV,
		answer: []string{
			"_http._tcp.hdls1.testns.svc.cluster.local. 5 IN SRV 0 16 80 172-16-0-2.hdls1.testns.svc.cluster.local.",
			"_http._tcp.hdls1.testns.svc.cluster.local. 5 IN SRV 0 16 80 172-16-0-3.hdls1.testns.svc.cluster.local.",
			"_http._tcp.hdls1.testns.svc.cluster.local. 5 IN SRV 0 16 80 dup-name.hdls1.testns.svc.cluster.local.",
			"_http._tcp.hdls1.testns.svc.cluster.local. 5 IN SRV 0 16 80 5678-abcd--1.hdls1.testns.svc.cluster.local.",
			"_http._tcp.hdls1.testns.svc.cluster.local. 5 IN SRV 0 16 80 5678-abcd--2.hdls1.testns.svc.cluster.local.",
		},
		extra: []string{
			"172-16-0-2.hdls1.testns.svc.cluster.local. 5 IN A 172.16.0.2",
			"172-16-0-3.hdls1.testns.svc.cluster.local. 5 IN A 172.16.0.3",
			"dup-name.hdls1.testns.svc.cluster.local. 5 IN A 172.16.0.4",
			"dup-name.hdls1.testns.svc.cluster.local. 5 IN A 172.16.0.5",
			"5678-abcd--1.hdls1.testns.svc.cluster.local. 5 IN AAAA 5678:abcd::1",
			"5678-abcd--2.hdls1.testns.svc.cluster.local. 5 IN AAAA 5678:abcd::2",
		}},
	{name: "20 shared hostname", qname: "dup-name.hdls1.testns.svc.cluster.local.", qtype: dns.TypeA,
		answer: []string{
			"dup-name.hdls1.testns.svc.cluster.local. 5 IN A 172.16.0.4",
			"dup-name.hdls1.testns.svc.cluster.local. 5 IN A 172.16.0.5",
		}},
	{name: "21 dashed endpoint name", qname: "172-16-0-2.hdls1.testns.svc.cluster.local.", qtype: dns.TypeA,
		answer: []string{"172-16-0-2.hdls1.testns.svc.cluster.local. 5 IN A 172.16.0.2"}},
	{name: "22 dashed v6 endpoint name", qname: "5678-abcd--1.hdls1.testns.svc.cluster.local.", qtype: dns.TypeAAAA,
		answer: []string{"5678-abcd--1.hdls1.testns.svc.cluster.local. 5 IN AAAA 5678:abcd::1"}},
	nodata("endpoint name of the other family", "5678-abcd--1.hdls1.testns.svc.cluster.local.", dns.TypeA),
	nxdomain("23 bogus endpoint", "bogusendpoint.hdls1.testns.svc.cluster.local.", dns.TypeA),
	nxdomain("a v6 endpoint's address not in its dashed form", "5678-abcd-0-0-0-0-0-1.hdls1.testns.svc.cluster.local.", dns.TypeAAAA),
	nxdomain("a dashed address of an endpoint that has a hostname", "172-16-0-1.svc1.testns.svc.cluster.local.", dns.TypeA),
	nxdomain("unready endpoint name", "172-16-0-9.hdls1.testns.svc.cluster.local.", dns.TypeA),
	{name: "24 portless headless A", qname: "hdlsprtls.testns.svc.cluster.local.", qtype: dns.TypeA,
		answer: []string{"hdlsprtls.testns.svc.cluster.local. 5 IN A 172.16.0.20"}},
	nodata("25 portless headless SRV", "hdlsprtls.testns.svc.cluster.local.", dns.TypeSRV),
	nxdomain("26 headless without ready endpoints", "svc-unready.testns.svc.cluster.local.", dns.TypeA),
	nxdomain("26 headless without ready endpoints, AAAA agrees", "svc-unready.testns.svc.cluster.local.", dns.TypeAAAA),
	nxdomain("26 headless without ready endpoints, SRV port", "_http._tcp.svc-unready.testns.svc.cluster.local.", dns.TypeSRV),
	{name: "27 ClusterIP without endpoints still answers", qname: "svcempty.testns.svc.cluster.local.", qtype: dns.TypeA,
		answer: []string{"svcempty.testns.svc.cluster.local. 5 IN A 10.96.100.2"}},
	{name: "endpoint names under a ClusterIP service", qname: "ep1a.svc1.testns.svc.cluster.local.", qtype: dns.TypeA,
		answer: []string{"ep1a.svc1.testns.svc.cluster.local. 5 IN A 172.16.0.1"}},
	{name: "37 hostname.subdomain", qname: "web-0.sub.testns.svc.cluster.local.", qtype: dns.TypeA,
		answer: []string{"web-0.sub.testns.svc.cluster.local. 5 IN A 172.16.0.40"}},

	{name: "28 ExternalName CNAME", qname: "external.testns.svc.cluster.local.", qtype: dns.TypeCNAME,
		answer: []string{"external.testns.svc.cluster.local. 5 IN CNAME example.net."}},
	{name: "29 ExternalName A asks to chase upstream", qname: "external.testns.svc.cluster.local.", qtype: dns.TypeA,
		answer: []string{"external.testns.svc.cluster.local. 5 IN CNAME example.net."}, chase: "example.net."},
	{name: "30 ExternalName chased in zone", qname: "external-to-service.testns.svc.cluster.local.", qtype: dns.TypeA,
		answer: []string{
			"external-to-service.testns.svc.cluster.local. 5 IN CNAME svc1.testns.svc.cluster.local.",
			"svc1.testns.svc.cluster.local. 5 IN A 10.96.100.1",
		}},
	nxdomain("31 name under ExternalName", "endpoint.external.testns.svc.cluster.local.", dns.TypeCNAME),
	nxdomain("31 deep name under ExternalName", "sub.sub.external.testns.svc.cluster.local.", dns.TypeA),

	{name: "32 dual-stack A", qname: "svc-dual-stack.testns.svc.cluster.local.", qtype: dns.TypeA,
		answer: []string{"svc-dual-stack.testns.svc.cluster.local. 5 IN A 10.96.100.3"}},
	{name: "32 dual-stack AAAA", qname: "svc-dual-stack.testns.svc.cluster.local.", qtype: dns.TypeAAAA,
		answer: []string{"svc-dual-stack.testns.svc.cluster.local. 5 IN AAAA fd00:10:96::3"}},
	{name: "32 dual-stack SRV", qname: "svc-dual-stack.testns.svc.cluster.local.", qtype: dns.TypeSRV,
		answer: []string{"svc-dual-stack.testns.svc.cluster.local. 5 IN SRV 0 100 80 svc-dual-stack.testns.svc.cluster.local."},
		extra: []string{
			"svc-dual-stack.testns.svc.cluster.local. 5 IN A 10.96.100.3",
			"svc-dual-stack.testns.svc.cluster.local. 5 IN AAAA fd00:10:96::3",
		}},
	{name: "33 v6 service AAAA", qname: "svc6.testns.svc.cluster.local.", qtype: dns.TypeAAAA,
		answer: []string{"svc6.testns.svc.cluster.local. 5 IN AAAA fd00:10:96::1"}},
	nodata("33 v6 service A", "svc6.testns.svc.cluster.local.", dns.TypeA),

	nxdomain("38 names deeper than the grammar", "a.b.c.svc1.testns.svc.cluster.local.", dns.TypeA),
	nxdomain("deep pod name", "x.1-2-3-4.testns.pod.cluster.local.", dns.TypeA),
	nxdomain("wildcards are not expanded", "*.testns.svc.cluster.local.", dns.TypeA),
	nodata("36 pod namespace", "testns.pod.cluster.local.", dns.TypeA),
	nxdomain("36 pod name not an address", "blah.testns.pod.cluster.local.", dns.TypeA),
	nxdomain("36 pod in unknown namespace", "1-2-3-4.nsnoexist.pod.cluster.local.", dns.TypeA),
	{name: "36 insecure pod record echoes any address", qname: "1-2-3-4.testns.pod.cluster.local.", qtype: dns.TypeA,
		answer: []string{"1-2-3-4.testns.pod.cluster.local. 5 IN A 1.2.3.4"}},
	{name: "insecure v6 pod record", qname: "fd00-1--5.testns.pod.cluster.local.", qtype: dns.TypeAAAA,
		answer: []string{"fd00-1--5.testns.pod.cluster.local. 5 IN AAAA fd00:1::5"}},
	nodata("v4 pod record AAAA", "1-2-3-4.testns.pod.cluster.local.", dns.TypeAAAA),
}

func TestAnswerFollowsTheSpecAndCoreDNS(t *testing.T) {
	ix := buildIndex(t, fixture())
	z := testZone(podsInsecure)
	for _, tc := range answerCases {
		t.Run(tc.name, func(t *testing.T) {
			runAnswerCase(t, z, ix, tc)
		})
	}
}

func runAnswerCase(t *testing.T, z *Zone, ix *Index, tc answerCase) {
	t.Helper()
	got := z.Answer(ix, dns.Question{Name: tc.qname, Qtype: tc.qtype, Qclass: dns.ClassINET})
	if got.Rcode != tc.rcode {
		t.Errorf("%s %s: rcode %s, want %s", tc.qname, dns.TypeToString[tc.qtype], dns.RcodeToString[got.Rcode], dns.RcodeToString[tc.rcode])
	}
	checkSection(t, "answer", got.Answer, rrs(t, tc.answer...))
	checkSection(t, "authority", got.Ns, rrs(t, tc.ns...))
	checkSection(t, "additional", got.Extra, rrs(t, tc.extra...))
	if got.Chase != tc.chase {
		t.Errorf("chase %q, want %q", got.Chase, tc.chase)
	}
	// A CNAME always comes before the records of its target.
	if len(got.Answer) > 1 && got.Answer[0].Header().Rrtype != dns.TypeCNAME && hasType(got.Answer, dns.TypeCNAME) {
		t.Errorf("CNAME is not first in %v", got.Answer)
	}
}

func hasType(rs []dns.RR, t uint16) bool {
	for _, r := range rs {
		if r.Header().Rrtype == t {
			return true
		}
	}
	return false
}

func TestPodRecordModes(t *testing.T) {
	ix := buildIndex(t, fixture())
	known := "10-244-1-7.testns.pod.cluster.local."
	cases := []struct {
		mode  string
		qname string
		found bool
	}{
		{podsDisabled, known, false},
		{podsInsecure, known, true},
		{podsInsecure, "1-2-3-4.testns.pod.cluster.local.", true},
		{podsVerified, known, true},
		{podsVerified, "1-2-3-4.testns.pod.cluster.local.", false},
		{podsVerified, "10-244-1-7.other.pod.cluster.local.", false}, // right address, wrong namespace
	}
	for _, c := range cases {
		t.Run(c.mode+" "+c.qname, func(t *testing.T) {
			got := testZone(c.mode).Answer(ix, dns.Question{Name: c.qname, Qtype: dns.TypeA, Qclass: dns.ClassINET})
			if found := got.Rcode == dns.RcodeSuccess && len(got.Answer) == 1; found != c.found {
				t.Errorf("found=%v (rcode %s, %d answers), want found=%v", found, dns.RcodeToString[got.Rcode], len(got.Answer), c.found)
			}
			if !c.found && got.Rcode != dns.RcodeNameError {
				t.Errorf("rcode %s, want NXDOMAIN", dns.RcodeToString[got.Rcode])
			}
		})
	}
}

func TestBeforeSyncTheZoneIsServfailNeverNXDOMAIN(t *testing.T) {
	for _, q := range []string{"svc0.testns.svc.cluster.local.", "cluster.local.", "dns-version.cluster.local."} {
		got := testZone(podsInsecure).Answer(NewIndex(), dns.Question{Name: q, Qtype: dns.TypeA, Qclass: dns.ClassINET})
		if got.Rcode != dns.RcodeServerFailure {
			t.Errorf("%s before sync: rcode %s, want SERVFAIL", q, dns.RcodeToString[got.Rcode])
		}
	}
}

func TestApexNSIsNODATAWithoutTheDNSService(t *testing.T) {
	o := fixture()
	o.services = o.services[:len(o.services)-2]
	ix := buildIndex(t, o)
	runAnswerCase(t, testZone(podsInsecure), ix, nodata("apex NS", "cluster.local.", dns.TypeNS))
}

// reverseCases are PTR questions and their answers; nil means the cluster
// does not know the address and the question goes upstream.
var reverseCases = []struct {
	name  string
	qname string
	want  []string
}{
	{"34 ClusterIP", "1.100.96.10.in-addr.arpa.", []string{"1.100.96.10.in-addr.arpa. 5 IN PTR svc1.testns.svc.cluster.local."}},
	{"35 endpoint in two services", "1.0.16.172.in-addr.arpa.", []string{
		"1.0.16.172.in-addr.arpa. 5 IN PTR ep1a.svc1.testns.svc.cluster.local.",
		"1.0.16.172.in-addr.arpa. 5 IN PTR 172-16-0-1.svc1.other.svc.cluster.local.",
	}},
	{"35 endpoint in two slices of one service is one PTR", "2.0.16.172.in-addr.arpa.", []string{
		"2.0.16.172.in-addr.arpa. 5 IN PTR 172-16-0-2.hdls1.testns.svc.cluster.local.",
	}},
	{"35 v6 nibbles", "1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.c.b.a.8.7.6.5.ip6.arpa.", []string{
		"1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.c.b.a.8.7.6.5.ip6.arpa. 5 IN PTR 5678-abcd--1.hdls1.testns.svc.cluster.local.",
	}},
	{"v6 ClusterIP", "1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.6.9.0.0.0.1.0.0.0.0.d.f.ip6.arpa.", []string{
		"1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.6.9.0.0.0.1.0.0.0.0.d.f.ip6.arpa. 5 IN PTR svc6.testns.svc.cluster.local.",
	}},
	{"unknown address falls through", "9.9.9.9.in-addr.arpa.", nil},
	{"unready endpoint falls through", "9.0.16.172.in-addr.arpa.", nil},
	{"partial name falls through", "16.172.in-addr.arpa.", nil},
}

func TestReverse(t *testing.T) {
	ix := buildIndex(t, fixture())
	z := testZone(podsInsecure)
	for _, c := range reverseCases {
		t.Run(c.name, func(t *testing.T) {
			got, ok := z.Reverse(ix, dns.Question{Name: c.qname, Qtype: dns.TypePTR, Qclass: dns.ClassINET})
			if ok != (c.want != nil) {
				t.Fatalf("known=%v, want %v", ok, c.want != nil)
			}
			checkSection(t, "answer", got.Answer, rrs(t, c.want...))
		})
	}
}

func TestServiceUpdatesMoveReverseEntries(t *testing.T) {
	o := fixture()
	ix := buildIndex(t, o)
	c := ix.Edit()
	if c.SetService(svcKey{"testns", "svc1"}, buildService(o.services[0], nil)) == false {
		t.Fatal("dropping svc1's endpoints was not a change")
	}
	if c.SetService(svcKey{"testns", "svc1"}, buildService(o.services[0], nil)) {
		t.Error("the same records twice counted as a change")
	}
	next := c.Done(ix.serial + 5)
	z := testZone(podsInsecure)
	got, _ := z.Reverse(next, dns.Question{Name: "1.0.16.172.in-addr.arpa.", Qtype: dns.TypePTR})
	checkSection(t, "answer", got.Answer, rrs(t, "1.0.16.172.in-addr.arpa. 5 IN PTR 172-16-0-1.svc1.other.svc.cluster.local."))
	if next.serial != ix.serial+5 {
		t.Errorf("serial %d, want %d", next.serial, ix.serial+5)
	}
	// The old index is untouched: a query in flight still sees it whole.
	old, _ := z.Reverse(ix, dns.Question{Name: "1.0.16.172.in-addr.arpa.", Qtype: dns.TypePTR})
	if len(old.Answer) != 2 {
		t.Errorf("old index changed: %v", old.Answer)
	}
	if c := next.Edit(); c.Done(1) != next {
		t.Error("an empty change made a new index")
	}
	// The reverse map names only the Services that still hold an address:
	// once the last one lets it go, the question goes upstream.
	a := netip.MustParseAddr("172.16.0.1")
	if owners := next.reverse.namers(a); !slices.Equal(owners, []svcKey{{"other", "svc1"}}) {
		t.Errorf("172.16.0.1 is named by %v, want only other/svc1", owners)
	}
	c = next.Edit()
	c.SetService(svcKey{"other", "svc1"}, nil)
	last := c.Done(next.serial + 1)
	if got, ok := z.Reverse(last, dns.Question{Name: "1.0.16.172.in-addr.arpa.", Qtype: dns.TypePTR}); ok {
		t.Errorf("an address no Service holds is answered: %v", got.Answer)
	}
	if owners := next.reverse.namers(a); len(owners) != 1 {
		t.Errorf("the previous index's reverse entry changed to %v", owners)
	}
}
