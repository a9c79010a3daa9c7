package explain

import (
	"fmt"
	"io"
	"strings"
)

// WriteText prints x for people: the steps in order, then the verdict.
func WriteText(w io.Writer, x *Explanation) error {
	var b strings.Builder
	from := describe(x.From)
	if x.From.Pod != "" {
		from = "pod " + from + " (" + x.From.IP
		if x.From.Node != "" {
			from += " on node " + x.From.Node
		}
		from += ")"
	} else if x.From.What != "" {
		from += " (" + x.From.What + ")"
	}
	fmt.Fprintf(&b, "From: %s\nTo:   %s", from, x.To)
	if x.Port != nil {
		fmt.Fprintf(&b, " %s/%d", x.Port.Protocol, x.Port.Port)
		if x.Port.Name != "" {
			fmt.Fprintf(&b, " (%s)", x.Port.Name)
		}
	}
	b.WriteString("\n")
	step := 0
	next := func(title string) { step++; fmt.Fprintf(&b, "\n%d. %s\n", step, title) }
	if r := x.Resolution; r != nil {
		next(fmt.Sprintf("Resolution of %q (search %s, ndots %d), answered by netplane's DNS", r.Name, strings.Join(r.Search, " "), r.Ndots))
		for _, q := range r.Tried {
			fmt.Fprintf(&b, "   %-50s %s\n", q.Name, q.Rcode)
			for _, a := range q.Answer {
				fmt.Fprintf(&b, "      %s\n", a)
			}
		}
		if r.Address != "" {
			fmt.Fprintf(&b, "   -> %s\n", r.Address)
		}
	}
	if s := x.Service; s != nil {
		next(fmt.Sprintf("Service %s/%s", s.Namespace, s.Name))
		writeService(&b, s)
	}
	for _, be := range x.Backends {
		if be.Path == PathNone && be.Egress == "" {
			continue // an endpoint not chosen: said above
		}
		next(fmt.Sprintf("Backend %s %s:%d on node %s", or(be.Pod, "(no pod)"), be.IP, be.Port, or(be.Node, "-")))
		fmt.Fprintf(&b, "   egress from %s: %s\n", describe(x.From), be.Egress)
		fmt.Fprintf(&b, "   ingress to %s: %s\n", nameOf(be), be.Ingress)
		fmt.Fprintf(&b, "   path: %s", be.PathText)
		if be.MTU > 0 {
			fmt.Fprintf(&b, "; pod MTU %d", be.MTU)
		}
		fmt.Fprintf(&b, "\n   -> %s\n", be.Verdict)
	}
	if k := x.Kernel; k != nil {
		next("Kernel of node " + k.Node)
		if k.Agrees {
			fmt.Fprintf(&b, "   holds what the model says (%d checks)\n", len(k.Checked))
		} else {
			b.WriteString("   DIFFERS from the model:\n")
			for _, d := range k.Differences {
				fmt.Fprintf(&b, "      %s\n", d)
			}
		}
		if len(k.Conntrack) == 0 {
			b.WriteString("   conntrack: no entry for this flow\n")
		}
		for _, c := range k.Conntrack {
			fmt.Fprintf(&b, "   conntrack: %s\n", c)
		}
	}
	fmt.Fprintf(&b, "\nVerdict: %s\n", x.Reason)
	_, err := io.WriteString(w, b.String())
	return err
}

// writeService prints the Service step: the Service, its endpoints, the
// node's choice.
func writeService(b *strings.Builder, s *Service) {
	fmt.Fprintf(b, "   type %s, address %s port %d", s.Type, s.Address, s.Port)
	if s.PortName != "" {
		fmt.Fprintf(b, " (%s)", s.PortName)
	}
	if s.NodePort != 0 {
		fmt.Fprintf(b, ", node port %d", s.NodePort)
	}
	fmt.Fprintf(b, "\n   sessionAffinity %s", s.SessionAffinity)
	if s.AffinityTimeout > 0 {
		fmt.Fprintf(b, " (%ds)", s.AffinityTimeout)
	}
	fmt.Fprintf(b, ", internalTrafficPolicy %s", s.InternalTrafficPolicy)
	if s.ExternalTrafficPolicy != "" {
		fmt.Fprintf(b, ", externalTrafficPolicy %s", s.ExternalTrafficPolicy)
	}
	fmt.Fprintf(b, "\n   endpoints (EndpointSlices):\n")
	if len(s.Endpoints) == 0 {
		b.WriteString("      none\n")
	}
	for _, e := range s.Endpoints {
		fmt.Fprintf(b, "      %s:%d %-28s node %-12s zone %-8s %s  [%s]%s\n", e.IP, e.Port, e.Pod, or(e.Node, "-"), or(e.Zone, "-"),
			conditions(e), e.Slice, map[bool]string{true: "  chosen"}[e.Chosen])
	}
	fmt.Fprintf(b, "   choice: %s\n", s.Choice)
	switch {
	case s.Reject:
		fmt.Fprintf(b, "   node %s rejects the connection (no endpoints)\n", or(s.ChosenBy, "?"))
	case s.Drop:
		fmt.Fprintf(b, "   node %s drops the connection\n", or(s.ChosenBy, "?"))
	}
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func conditions(e Endpoint) string {
	var c []string
	for _, x := range []struct {
		on   bool
		name string
	}{{e.Ready, "ready"}, {e.Serving, "serving"}, {e.Terminating, "terminating"}} {
		if x.on {
			c = append(c, x.name)
		}
	}
	if len(c) == 0 {
		return "not ready"
	}
	return strings.Join(c, ",")
}
