package wireguard

import (
	"os"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// fakeClient is wgctrl's client over Fake devices by name, as the kernel
// answers: a device that does not exist is os.ErrNotExist.
type fakeClient struct {
	devs   map[string]*Fake
	closed bool
}

func (c *fakeClient) Device(name string) (*wgtypes.Device, error) {
	d, ok := c.devs[name]
	if !ok {
		return nil, os.ErrNotExist
	}
	return d.Device()
}

func (c *fakeClient) ConfigureDevice(name string, cfg wgtypes.Config) error {
	d, ok := c.devs[name]
	if !ok {
		return os.ErrNotExist
	}
	return d.Configure(cfg)
}

func (c *fakeClient) Close() error { c.closed = true; return nil }

func TestKernelDeviceConfiguresItsOwnLinkOnly(t *testing.T) {
	ours, other := NewFake(DeviceName), NewFake("wg0")
	c := &fakeClient{devs: map[string]*Fake{DeviceName: ours, "wg0": other}}
	k := newKernelDevice(DeviceName, c)
	priv, _ := key(1)
	s := NewSyncer(k, priv, DefaultPort)
	plan, err := s.Sync(Input{Self: "self", Underlay: v4, Nodes: cluster(3)}, true)
	if err != nil {
		t.Fatal(err)
	}
	d, err := k.Device()
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Peers) != len(plan.Peers) || d.PrivateKey != priv || d.ListenPort != DefaultPort {
		t.Errorf("kernel device: %d peers (want %d), key set %v, port %d", len(d.Peers), len(plan.Peers), d.PrivateKey == priv, d.ListenPort)
	}
	if o, _ := other.Device(); len(o.Peers) != 0 || len(other.Configs) != 0 {
		t.Errorf("another WireGuard device was configured: %+v", other.Configs)
	}
	if err := k.Close(); err != nil || !c.closed {
		t.Errorf("close: %v, client closed %v", err, c.closed)
	}
}

func TestKernelDeviceGoneSaysSo(t *testing.T) {
	k := newKernelDevice(DeviceName, &fakeClient{devs: map[string]*Fake{}})
	_, err := k.Device()
	if err == nil || !strings.Contains(err.Error(), DeviceName) || !strings.Contains(err.Error(), "gone") {
		t.Errorf("read of a deleted device: %v; want an error naming it and saying it is gone", err)
	}
	s := NewSyncer(k, wgtypes.Key{1}, DefaultPort)
	if _, err := s.Sync(Input{Self: "self", Underlay: v4, Nodes: cluster(1)}, false); err == nil {
		t.Error("sync to a deleted device succeeded")
	}
}

func TestKernelDeviceRefusalsReachTheCaller(t *testing.T) {
	k := newKernelDevice(DeviceName, &fakeClient{devs: map[string]*Fake{DeviceName: NewFake(DeviceName)}})
	err := k.Configure(wgtypes.Config{Peers: []wgtypes.PeerConfig{
		{PublicKey: pub(2), AllowedIPs: ipNets(prefixes("10.244.0.0/16"))},
		{PublicKey: pub(3), AllowedIPs: ipNets(prefixes("10.244.1.0/24"))}}})
	if err == nil || !strings.Contains(err.Error(), "configure WireGuard device "+DeviceName) {
		t.Errorf("overlapping peers: %v; want the refusal, naming the device", err)
	}
}

func TestOpenRefusesAnUnknownImplementation(t *testing.T) {
	if _, _, err := Open("boringtun", DeviceName, 1420, DefaultPort, logr.Discard()); err == nil || !strings.Contains(err.Error(), "auto, kernel, userspace") {
		t.Errorf("got %v", err)
	}
}
