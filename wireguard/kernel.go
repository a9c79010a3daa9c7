package wireguard

import (
	"errors"
	"fmt"
	"io/fs"

	"golang.zx2c4.com/wireguard/wgctrl"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// wgClient is the part of wgctrl's client the kernel device uses; tests
// put a fake in its place.
type wgClient interface {
	Device(name string) (*wgtypes.Device, error)
	ConfigureDevice(name string, cfg wgtypes.Config) error
	Close() error
}

// KernelDevice is the kernel's WireGuard, configured over generic netlink.
type KernelDevice struct {
	name   string
	client wgClient
}

// OpenKernel makes (or adopts) the kernel's wireguard link name, up, in
// the calling thread's network namespace, listening on UDP port.
func OpenKernel(name string, mtu, port int) (*KernelDevice, error) {
	if err := ensureKernelLink(name, mtu); err != nil {
		return nil, err
	}
	c, err := wgctrl.New()
	if err != nil {
		return nil, fmt.Errorf("open WireGuard netlink: %w", err)
	}
	k := newKernelDevice(name, c)
	if err := k.Configure(wgtypes.Config{ListenPort: &port}); err != nil {
		k.Close()
		return nil, err
	}
	return k, nil
}

func newKernelDevice(name string, c wgClient) *KernelDevice {
	return &KernelDevice{name: name, client: c}
}

// Configure applies cfg to the device.
func (k *KernelDevice) Configure(cfg wgtypes.Config) error {
	if err := k.client.ConfigureDevice(k.name, cfg); err != nil {
		return k.explain("configure", err)
	}
	return nil
}

// Device reads the device back.
func (k *KernelDevice) Device() (*wgtypes.Device, error) {
	d, err := k.client.Device(k.name)
	if err != nil {
		return nil, k.explain("read", err)
	}
	return d, nil
}

// Close closes the netlink client; the device, its peers and their keys stay.
func (k *KernelDevice) Close() error { return k.client.Close() }

// explain turns wgctrl's "does not exist" (someone deleted the link) into
// what to do about it.
func (k *KernelDevice) explain(verb string, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s WireGuard device %s: it is gone (deleted by someone else?); it is made again on restart: %w", verb, k.name, err)
	}
	return fmt.Errorf("%s WireGuard device %s: %w", verb, k.name, err)
}
