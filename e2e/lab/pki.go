package lab

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"time"
)

// The lab's certificates, all issued by one lab CA: the API server's serving
// certificate names every address a client of the lab uses (the relay on
// 127.0.0.1 too), so any kubeconfig of the lab verifies without a
// tls-server-name, which upstream's e2e framework drops; the API server's
// client certificate is what the kubelets accept for exec, logs,
// port-forward and pods/proxy.
type pki struct {
	CA, APIServerCert, APIServerKey, KubeletClientCert, KubeletClientKey string
}

// apiServerSANs are the names and addresses the API server is reached by:
// the relay in the root namespace, its underlay addresses, the kubernetes
// Service's ClusterIPs and its DNS names.
func apiServerSANs() ([]string, []net.IP) {
	names := []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc." + ClusterDomain, "localhost"}
	ips := []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1"), net.ParseIP(ControlPlaneIP), net.ParseIP(ControlPlaneIP6),
		net.ParseIP("10.96.0.1"), net.ParseIP("fd00:10:96::1")}
	return names, ips
}

// writePKI makes the CA and the certificates in dir.
func writePKI(dir string) (pki, error) {
	p := pki{CA: dir + "/ca.crt", APIServerCert: dir + "/apiserver.crt", APIServerKey: dir + "/apiserver.key",
		KubeletClientCert: dir + "/apiserver-kubelet-client.crt", KubeletClientKey: dir + "/apiserver-kubelet-client.key"}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return p, err
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return p, err
	}
	caTmpl := template(pkix.Name{CommonName: "netplane-lab-ca"})
	caTmpl.IsCA, caTmpl.BasicConstraintsValid = true, true
	caTmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return p, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return p, err
	}
	if err := writePEM(p.CA, "CERTIFICATE", caDER, 0o644); err != nil {
		return p, err
	}
	serving := template(pkix.Name{CommonName: "kube-apiserver"})
	serving.DNSNames, serving.IPAddresses = apiServerSANs()
	serving.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	if err := issue(ca, caKey, serving, p.APIServerCert, p.APIServerKey); err != nil {
		return p, err
	}
	// system:masters, so the kubelet's webhook authorizer admits every
	// request the API server forwards.
	client := template(pkix.Name{CommonName: "kube-apiserver-kubelet-client", Organization: []string{"system:masters"}})
	client.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	return p, issue(ca, caKey, client, p.KubeletClientCert, p.KubeletClientKey)
}

func template(subject pkix.Name) *x509.Certificate {
	serial, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	now := time.Now()
	return &x509.Certificate{SerialNumber: serial, Subject: subject, NotBefore: now.Add(-time.Hour), NotAfter: now.AddDate(1, 0, 0),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment}
}

// issue signs tmpl with the CA and writes the certificate and a new key.
func issue(ca *x509.Certificate, caKey *ecdsa.PrivateKey, tmpl *x509.Certificate, certPath, keyPath string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return fmt.Errorf("issue %s: %w", tmpl.Subject.CommonName, err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if err := writePEM(certPath, "CERTIFICATE", der, 0o644); err != nil {
		return err
	}
	return writePEM(keyPath, "EC PRIVATE KEY", keyDER, 0o600)
}

func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), mode)
}
