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

	"github.com/netplane/netplane/e2e/framework"
)

// TestARenewedServingCertificateIsServedWithoutARestart: the relay reads
// its certificate again when the files change under it, as a renewed
// Secret's do under the pod; a new connection gets the new one.
func TestARenewedServingCertificateIsServedWithoutARestart(t *testing.T) {
	api := framework.SharedAPIServer(t, framework.Options{})
	ctx := framework.Ctx(t)
	_, crt, key := framework.ServingCert(t, "netplane-relay.kube-system.svc")
	port, _ := runRelay(t, api.Client, crt, key)
	addr := fmt.Sprint("127.0.0.1:", port)

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
