// Package ipam owns the pod IP addresses of one node: which address of the
// node's pod CIDR(s) belongs to which attachment (container ID + interface
// name). The allocation logic is a pure function of a State value; store.go
// keeps that value on disk, locked and crash-safe, for the netplane-cni
// plugin processes that run in parallel, one per pod.
package ipam

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"go4.org/netipx"
)

// PortMapping is one hostPort of an attachment, remembered so that DEL and GC
// can remove its forwarding rules without the pod's original request.
type PortMapping struct {
	HostPort      uint16     `json:"hostPort"`
	ContainerPort uint16     `json:"containerPort"`
	Protocol      string     `json:"protocol"` // tcp or udp
	HostIP        netip.Addr `json:"hostIP,omitzero"`
}

// Attachment is one pod interface and everything ADD made for it that must be
// undone by DEL or GC.
type Attachment struct {
	ContainerID  string         `json:"containerID"`
	IfName       string         `json:"ifname"`
	IPs          []netip.Prefix `json:"ips"` // pod address with its range's prefix length
	HostVeth     string         `json:"hostVeth,omitempty"`
	PortMappings []PortMapping  `json:"portMappings,omitempty"`
}

// State is the whole allocation table of a node.
type State struct {
	// BootID is the kernel boot the attachments belong to; attachments of an
	// earlier boot are gone with their network namespaces.
	BootID string `json:"bootID"`
	// Last is the last address handed out per range (keyed by the range's
	// prefix), so allocation continues after it and a just-released address
	// is not reused at once.
	Last        map[string]netip.Addr `json:"last,omitempty"`
	Attachments []Attachment          `json:"attachments"`
}

// Request asks for one address from each range.
type Request struct {
	ContainerID string
	IfName      string
	// Requested addresses are honoured when they are inside a range and free.
	Requested []netip.Addr
}

// ErrExhausted says a range has no free address.
type ErrExhausted struct{ Range netip.Prefix }

func (e *ErrExhausted) Error() string {
	return fmt.Sprintf("pod CIDR %s is full: every address is in use; delete unused pods or give the node a larger pod CIDR", e.Range)
}

// ErrDuplicate says the attachment already holds addresses.
var ErrDuplicate = errors.New("this container ID and interface already hold IP addresses")

// Find returns the attachment of (containerID, ifname), if any.
func (s *State) Find(containerID, ifname string) (Attachment, bool) {
	i := s.index(containerID, ifname)
	if i < 0 {
		return Attachment{}, false
	}
	return s.Attachments[i], true
}

func (s *State) index(containerID, ifname string) int {
	return slices.IndexFunc(s.Attachments, func(a Attachment) bool {
		return a.ContainerID == containerID && a.IfName == ifname
	})
}

// Allocate takes one free address from each range for req and records the
// attachment (with the given host veth and port mappings). Nothing changes
// when it fails.
func (s *State) Allocate(ranges []netip.Prefix, req Request, hostVeth string, ports []PortMapping) (Attachment, error) {
	if s.index(req.ContainerID, req.IfName) >= 0 {
		return Attachment{}, ErrDuplicate
	}
	used := s.used()
	for _, want := range req.Requested {
		if !slices.ContainsFunc(ranges, func(r netip.Prefix) bool { return r.Contains(want) }) {
			return Attachment{}, fmt.Errorf("requested IP %s is outside the node's pod CIDRs %v: request an address inside them or none", want, ranges)
		}
	}
	a := Attachment{ContainerID: req.ContainerID, IfName: req.IfName, HostVeth: hostVeth, PortMappings: ports}
	last := map[string]netip.Addr{}
	for _, r := range ranges {
		ip, err := pick(r, req.Requested, used, s.Last[r.String()])
		if err != nil {
			return Attachment{}, err
		}
		used[ip] = true
		last[r.String()] = ip
		a.IPs = append(a.IPs, netip.PrefixFrom(ip, r.Bits()))
	}
	if s.Last == nil {
		s.Last = map[string]netip.Addr{}
	}
	for k, v := range last {
		// A requested address does not move the round-robin cursor.
		if !slices.Contains(req.Requested, v) {
			s.Last[k] = v
		}
	}
	s.Attachments = append(s.Attachments, a)
	return a, nil
}

// pick chooses the address for one range: a requested one if the request has
// one in this range, otherwise the first free address after last.
func pick(r netip.Prefix, requested []netip.Addr, used map[netip.Addr]bool, last netip.Addr) (netip.Addr, error) {
	first, end := Usable(r)
	for _, want := range requested {
		if !r.Contains(want) {
			continue
		}
		if want.Less(first) || end.Less(want) {
			return netip.Addr{}, fmt.Errorf("requested IP %s is reserved in pod CIDR %s (network, gateway or broadcast address)", want, r)
		}
		if used[want] {
			return netip.Addr{}, fmt.Errorf("requested IP %s is already in use by another pod", want)
		}
		return want, nil
	}
	start := first
	if last.IsValid() && r.Contains(last) && !last.Less(first) && last.Less(end) {
		start = last.Next()
	}
	// Walk from start to end, then wrap from first; len(used)+1 steps
	// always find a free address when one exists, however large the range.
	ip := start
	for range len(used) + 1 {
		if !used[ip] {
			return ip, nil
		}
		if ip == end {
			ip = first
		} else {
			ip = ip.Next()
		}
		if ip == start {
			break
		}
	}
	return netip.Addr{}, &ErrExhausted{Range: r}
}

func (s *State) used() map[netip.Addr]bool {
	used := map[netip.Addr]bool{}
	for _, a := range s.Attachments {
		for _, p := range a.IPs {
			used[p.Addr()] = true
		}
	}
	return used
}

// Release removes the attachment of (containerID, ifname) and returns it;
// releasing an unknown attachment is not an error (DEL is idempotent).
func (s *State) Release(containerID, ifname string) (Attachment, bool) {
	i := s.index(containerID, ifname)
	if i < 0 {
		return Attachment{}, false
	}
	a := s.Attachments[i]
	s.Attachments = slices.Delete(s.Attachments, i, i+1)
	return a, true
}

// Usable is the first and last address pods may get in r: the network
// address and the gateway (network+1) are excluded, and for IPv4 the
// broadcast address too.
func Usable(r netip.Prefix) (first, last netip.Addr) {
	r = r.Masked()
	first = r.Addr().Next().Next()
	last = netipx.PrefixLastIP(r)
	if r.Addr().Is4() {
		last = last.Prev()
	}
	return first, last
}

// Gateway is the address of the node's bridge in r: the first after the
// network address.
func Gateway(r netip.Prefix) netip.Addr { return r.Masked().Addr().Next() }

// ValidateRange rejects a pod CIDR that leaves no address for pods.
func ValidateRange(r netip.Prefix) error {
	if r.Addr().Is4In6() {
		return fmt.Errorf("pod CIDR %s is an IPv4-mapped IPv6 prefix: write it as IPv4", r)
	}
	if r != r.Masked() {
		return fmt.Errorf("pod CIDR %s has host bits set: use %s", r, r.Masked())
	}
	max := 30
	if r.Addr().Is6() {
		max = 126
	}
	if r.Bits() > max {
		return fmt.Errorf("pod CIDR %s is too small: it needs at least a /%d to hold a gateway and one pod", r, max)
	}
	return nil
}
