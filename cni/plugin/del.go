package plugin

import (
	"errors"
	"fmt"
	"strings"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/vishvananda/netlink"

	"github.com/netplane/netplane/cni/ipam"
	"github.com/netplane/netplane/cni/link"
)

// cmdDel undoes an ADD. It needs neither the pod's netns nor an earlier
// successful ADD: the host veth name is derived from the attachment and
// deleting it removes the pod end too; the record and its hostPort rules go
// in one store update. The veth goes first so an address is never released
// while still configured in a pod.
func cmdDel(args *skel.CmdArgs) error {
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	if err := deleteLink(VethName(args.ContainerID, args.IfName)); err != nil {
		return types.NewError(types.ErrTryAgainLater, "cannot remove the pod's veth", err.Error())
	}
	store, err := ipam.NewStore(conf.StateDir)
	if err != nil {
		return types.NewError(types.ErrIOFailure, "cannot open the IPAM store", err.Error())
	}
	return store.Update(func(st *ipam.State) error {
		a, ok := st.Release(args.ContainerID, args.IfName)
		if !ok || len(a.PortMappings) == 0 {
			return nil
		}
		return programHostPorts(st)
	})
}

// cmdGC releases every attachment not in cni.dev/valid-attachments, and
// removes veths on our bridge that belong to no attachment (left by a
// plugin killed between creating a veth and recording it). It continues past
// errors and reports them all at the end.
func cmdGC(args *skel.CmdArgs) error {
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	valid := map[types.GCAttachment]bool{}
	for _, a := range conf.ValidAttachments {
		valid[a] = true
	}
	store, err := ipam.NewStore(conf.StateDir)
	if err != nil {
		return types.NewError(types.ErrIOFailure, "cannot open the IPAM store", err.Error())
	}
	keep := map[string]bool{}
	var errs []error
	err = store.Update(func(st *ipam.State) error {
		for _, a := range append([]ipam.Attachment(nil), st.Attachments...) {
			if valid[types.GCAttachment{ContainerID: a.ContainerID, IfName: a.IfName}] {
				keep[a.HostVeth] = true
				continue
			}
			st.Release(a.ContainerID, a.IfName)
		}
		return programHostPorts(st)
	})
	if err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, removeStrayVeths(conf.Bridge, keep)...)
	if err := errors.Join(errs...); err != nil {
		return types.NewError(types.ErrTryAgainLater, "garbage collection was incomplete", err.Error())
	}
	return nil
}

func removeStrayVeths(bridge string, keep map[string]bool) []error {
	br, err := host.LinkByName(bridge)
	if err != nil {
		return nil // no bridge, no pods
	}
	links, err := link.Retry(host.LinkList)
	if err != nil {
		return []error{fmt.Errorf("list links: %w", err)}
	}
	var errs []error
	for _, l := range links {
		name := l.Attrs().Name
		if _, ok := l.(*netlink.Veth); !ok || !strings.HasPrefix(name, "npv") || keep[name] || l.Attrs().MasterIndex != br.Attrs().Index {
			continue
		}
		if err := deleteLink(name); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}
