// Command testimage is the one program inside the lab's container images
// (test infrastructure, not part of netplane). As a pod's container it is a
// small server; through the lab's exec helper it is the client that checks
// run inside pods; in the lab's upstream namespace it is the fake upstream
// DNS server; and as the sandbox image it is the pause process.
//
//	testimage serve [--http=:80] [--udp=:80]   HTTP and UDP echo
//	testimage get URL                          one HTTP GET, body to stdout
//	testimage udp HOST:PORT                    one UDP echo exchange
//	testimage lookup [--type=A|AAAA|SRV|CNAME] NAME   through the pod's resolv.conf
//	testimage upstream [--listen=:53]          fake upstream DNS (*.example.)
//	testimage pause                            wait for SIGTERM
//	testimage load [--get URL] [--lookup NAME] [--hold URL] [--stop-file F]
//	                                           new connections and queries at a rate, and
//	                                           kept connections, until F exists; JSON tally
//	testimage touch PATH                       create a file (stops a load)
//	testimage wait-file PATH                   wait for a file (a load's --started-file)
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/miekg/dns"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: testimage serve|get|udp|lookup|upstream|pause|load|touch ...")
		os.Exit(2)
	}
	cmds := map[string]func([]string) error{
		"serve": serve, "get": get, "udp": udpEcho, "lookup": lookup, "upstream": upstream, "pause": pause,
		"load": load, "touch": touch, "wait-file": waitFile,
	}
	run, ok := cmds[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "testimage: unknown command %q\n", os.Args[1])
		os.Exit(2)
	}
	if err := run(os.Args[2:]); err != nil {
		fmt.Fprintln(os.Stderr, "testimage:", err)
		os.Exit(1)
	}
}

// name is what the echo servers answer with: the pod name from the
// downward API, else the host name (the pod's hostname).
func name() string {
	if n := os.Getenv("POD_NAME"); n != "" {
		return n
	}
	h, _ := os.Hostname()
	return h
}

// serve answers HTTP with "pod=NAME client=IP:PORT". /readyz reports
// readiness, which /ready?v=false|true switches, so a test can fail a pod's
// readinessProbe without killing it.
func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	httpAddr := fs.String("http", ":80", "HTTP listen address")
	udpAddr := fs.String("udp", ":80", "UDP echo listen address; empty disables")
	drain := fs.Duration("drain", 2*time.Second, "time serving goes on after SIGTERM")
	fs.Parse(args)
	var notReady atomic.Bool
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintf(w, "pod=%s client=%s\n", name(), r.RemoteAddr)
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if notReady.Load() {
			http.Error(w, "not ready (set by /ready?v=false)", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/ready", func(w http.ResponseWriter, r *http.Request) {
		notReady.Store(r.URL.Query().Get("v") == "false")
		fmt.Fprintf(w, "ready=%v\n", !notReady.Load())
	})
	if *udpAddr != "" {
		pc, err := net.ListenPacket("udp", *udpAddr)
		if err != nil {
			return err
		}
		go func() {
			buf := make([]byte, 2048)
			for {
				_, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				pc.WriteTo([]byte(fmt.Sprintf("pod=%s client=%s\n", name(), from)), from)
			}
		}()
	}
	srv := &http.Server{Addr: *httpAddr, Handler: mux}
	go drainOnSIGTERM(srv, *drain)
	if err := srv.ListenAndServe(); err != http.ErrServerClosed {
		return err
	}
	return nil
}

// drainOnSIGTERM keeps serving for a while after SIGTERM, as a well-behaved
// server does while the network stops sending it new connections, then
// shuts down.
func drainOnSIGTERM(srv *http.Server, drain time.Duration) {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM)
	<-sig
	time.Sleep(drain)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	srv.Shutdown(ctx)
}

func get(args []string) error {
	fs := flag.NewFlagSet("get", flag.ExitOnError)
	timeout := fs.Duration("timeout", 2*time.Second, "request timeout")
	fs.Parse(args)
	if fs.NArg() != 1 {
		return fmt.Errorf("usage: get URL")
	}
	client := &http.Client{Timeout: *timeout, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get(fs.Arg(0))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	os.Stdout.Write(body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s", resp.Status)
	}
	return nil
}

func udpEcho(args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("usage: udp HOST:PORT")
	}
	c, err := net.Dial("udp", args[0])
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("ping")); err != nil {
		return err
	}
	buf := make([]byte, 2048)
	n, err := c.Read(buf)
	if err != nil {
		return err
	}
	os.Stdout.Write(buf[:n])
	return nil
}

// lookup resolves through Go's own resolver, which reads the pod's
// /etc/resolv.conf (search list, ndots) as glibc would. It prints one
// answer per line, sorted, so checks can compare output.
func lookup(args []string) error {
	fs := flag.NewFlagSet("lookup", flag.ExitOnError)
	typ := fs.String("type", "A", "A, AAAA, SRV or CNAME")
	fs.Parse(args)
	if fs.NArg() != 1 {
		return fmt.Errorf("usage: lookup [--type=T] NAME")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	r := &net.Resolver{PreferGo: true}
	q := fs.Arg(0)
	var out []string
	switch strings.ToUpper(*typ) {
	case "A", "AAAA":
		network := "ip4"
		if strings.ToUpper(*typ) == "AAAA" {
			network = "ip6"
		}
		ips, err := r.LookupIP(ctx, network, q)
		if err != nil {
			return err
		}
		for _, ip := range ips {
			out = append(out, ip.String())
		}
	case "SRV":
		_, srvs, err := r.LookupSRV(ctx, "", "", q)
		if err != nil {
			return err
		}
		for _, s := range srvs {
			out = append(out, fmt.Sprintf("%s %d", s.Target, s.Port))
		}
	case "CNAME":
		c, err := r.LookupCNAME(ctx, q)
		if err != nil {
			return err
		}
		out = append(out, c)
	default:
		return fmt.Errorf("unknown type %q", *typ)
	}
	sort.Strings(out)
	fmt.Println(strings.Join(out, "\n"))
	return nil
}

// upstream is the lab's stand-in for the internet's DNS: every name under
// example. has the A record 192.0.2.10 and the AAAA record 2001:db8::10;
// anything else is NXDOMAIN. Pods
// resolve such names only through netplane's forwarder.
func upstream(args []string) error {
	fs := flag.NewFlagSet("upstream", flag.ExitOnError)
	listen := fs.String("listen", ":53", "UDP and TCP listen address")
	fs.Parse(args)
	h := dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(req)
		if len(req.Question) != 1 {
			m.Rcode = dns.RcodeFormatError
			w.WriteMsg(m)
			return
		}
		q := req.Question[0]
		name := strings.ToLower(q.Name)
		switch {
		case internet[name] != nil:
			for _, rr := range internet[name] {
				if rr.Header().Rrtype == q.Qtype {
					m.Answer = append(m.Answer, rr)
				}
			}
		case !dns.IsSubDomain("example.", name):
			m.Rcode = dns.RcodeNameError
		case q.Qtype == dns.TypeA:
			rr, _ := dns.NewRR(q.Name + " 60 IN A 192.0.2.10")
			m.Answer = append(m.Answer, rr)
		case q.Qtype == dns.TypeAAAA:
			rr, _ := dns.NewRR(q.Name + " 60 IN AAAA 2001:db8::10")
			m.Answer = append(m.Answer, rr)
		}
		w.WriteMsg(m)
	})
	errc := make(chan error, 2)
	for _, proto := range []string{"udp", "tcp"} {
		srv := &dns.Server{Addr: *listen, Net: proto, Handler: h}
		go func() { errc <- srv.ListenAndServe() }()
	}
	return <-errc
}

// internet are the records of the Internet's DNS that upstream's DNS tests
// ask the cluster's upstream for (Google's public resolver, its name and
// reverse names), as the real zones hold them.
var internet = map[string][]dns.RR{}

func init() {
	for _, r := range []string{
		"dns.google. 300 IN A 8.8.8.8",
		"dns.google. 300 IN A 8.8.4.4",
		"dns.google. 300 IN AAAA 2001:4860:4860::8888",
		"dns.google. 300 IN AAAA 2001:4860:4860::8844",
		"8.8.8.8.in-addr.arpa. 300 IN PTR dns.google.",
		"8.8.4.4.in-addr.arpa. 300 IN PTR dns.google.",
		"8.8.8.8.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.6.8.4.0.6.8.4.1.0.0.2.ip6.arpa. 300 IN PTR dns.google.",
	} {
		rr, err := dns.NewRR(r)
		if err != nil {
			panic(err)
		}
		internet[rr.Header().Name] = append(internet[rr.Header().Name], rr)
	}
}

func pause([]string) error {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	return nil
}
