package relay

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/pem"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/e2e/framework"
	"github.com/netplane/netplane/internal/informer"
	"github.com/netplane/netplane/internal/role"
)

// TestARenewedServingCertificateIsServedWithoutARestart: the relay reads
// its certificate again when the files change under it, as a renewed
// Secret's do under the pod; a new connection gets the new one.
func TestARenewedServingCertificateIsServedWithoutARestart(t *testing.T) {
	api := framework.SharedAPIServer(t, framework.Options{})
	ctx := framework.Ctx(t)
	ports, err := framework.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprint("127.0.0.1:", ports[0])
	_, crt, key := framework.ServingCert(t, "netplane-relay.kube-system.svc")
	cfg := v1alpha1.Default()
	cfg.Roles = []string{v1alpha1.RoleRelay}
	cfg.Relay = v1alpha1.Relay{BindAddress: addr, TLSCertFile: crt, TLSKeyFile: key}
	d := role.Deps{Role: v1alpha1.RoleRelay, Config: cfg, Client: api.Client, Factory: informer.New(api.Client),
		Checks: role.NewChecks(), Metrics: prometheus.NewRegistry(), Log: testr.New(t)}
	relayCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- Role(d)[0].Run(relayCtx) }()
	t.Cleanup(func() { stop(); <-done })

	served := func() ([]byte, error) {
		conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // reads the certificate served
		if err != nil {
			return nil, err
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].Raw, nil
	}
	leaf := func(path string) []byte {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		p, _ := pem.Decode(b)
		return p.Bytes
	}
	wait := func(want []byte, what string) {
		t.Helper()
		err := framework.Poll(ctx, 50*time.Millisecond, 30*time.Second, what, func(context.Context) error {
			got, err := served()
			if err == nil && !bytes.Equal(got, want) {
				err = fmt.Errorf("another certificate served")
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	wait(leaf(crt), "the first certificate served")

	// Renewed as a Secret volume renews: new files moved over the old.
	_, crt2, key2 := framework.ServingCert(t, "netplane-relay.kube-system.svc")
	for _, mv := range [][2]string{{key2, key}, {crt2, crt}} {
		if err := os.Rename(mv[0], mv[1]); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	wait(leaf(crt), "the renewed certificate served")
	t.Logf("renewed certificate served %v after the files changed", time.Since(start).Round(time.Millisecond))
}
