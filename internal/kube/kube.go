// Package kube builds the Kubernetes client configuration the roles share:
// --kubeconfig, then $KUBECONFIG, then the in-cluster configuration, with an
// optional explicit API server endpoint and client-side rate limits.
package kube

import (
	"fmt"
	"os"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/internal/version"
)

// RestConfig returns the client configuration for cc.
func RestConfig(cc v1alpha1.ClientConnection) (*rest.Config, error) {
	path := cc.Kubeconfig
	if path == "" {
		path = os.Getenv("KUBECONFIG")
	}
	var cfg *rest.Config
	var err error
	switch {
	case path != "":
		cfg, err = clientcmd.BuildConfigFromFlags(cc.ControlPlaneEndpoint, path)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
		}
	default:
		cfg, err = rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("no kubeconfig given (--kubeconfig or $KUBECONFIG) and not running in a cluster: %w", err)
		}
		if cc.ControlPlaneEndpoint != "" {
			// In a pod that programs the kubernetes Service VIP itself, the
			// in-cluster host (that VIP) may not work yet; keep the token and CA.
			cfg.Host = cc.ControlPlaneEndpoint
		}
	}
	cfg.QPS = cc.QPS
	cfg.Burst = int(cc.Burst)
	cfg.UserAgent = "netplane/" + version.Version
	return cfg, nil
}
