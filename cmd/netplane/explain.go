package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/config"
	"github.com/netplane/netplane/explain"
	"github.com/netplane/netplane/internal/kube"
	"github.com/netplane/netplane/nodeview"
)

// nodeConfigFile is where the chart mounts the node agent's configuration:
// in the agent's pod, explain reads the overlay mode and the API server
// endpoint from it.
const nodeConfigFile = "/etc/netplane/config.yaml"

// runExplain is `netplane explain`: why a connection works or fails. It
// only reads, from the API server and (on a node) the kernel. It is long
// for its flags, declared one per line.
func runExplain(args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("netplane explain", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.SortFlags = false
	from := fs.String("from", "", "Source: NAMESPACE/POD, POD (in --namespace), or an address (a node, an external client).")
	to := fs.String("to", "", "Destination: NAMESPACE/POD, svc/NAMESPACE/NAME, a DNS name as the source pod would resolve it, or an address.")
	port := fs.String("port", "", "Destination port: PORT[/tcp|udp|sctp], a number or a name; defaults to the Service's only port.")
	ns := fs.StringP("namespace", "n", "default", "Namespace of a bare POD in --from or --to.")
	output := fs.StringP("output", "o", "text", "text or json (an Explanation, apiVersion netplane.io/v1alpha1).")
	cfgFile := fs.String(config.ConfigFlag, "", "A netplane Configuration file to read the overlay mode, cluster domain and API server endpoint from (default "+nodeConfigFile+" when it exists).")
	kubeconfig := fs.String("kubeconfig", "", "Path to a kubeconfig. Empty: $KUBECONFIG, then the in-cluster config.")
	endpoint := fs.String("control-plane-endpoint", os.Getenv(config.EnvName("control-plane-endpoint")), "API server URL overriding the kubeconfig's.")
	overlayMode := fs.String("overlay", os.Getenv(config.EnvName("overlay")), "The overlay's mode (cross-subnet, always, never); default: the configuration's.")
	encryption := fs.String("encryption", os.Getenv(config.EnvName("encryption")), "The node role's encryption (none, wireguard); default: the configuration's.")
	domain := fs.String("cluster-domain", os.Getenv(config.EnvName("cluster-domain")), "The cluster's DNS domain; default: the configuration's.")
	timeout := fs.Duration("timeout", 30*time.Second, "Give up after this long.")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: netplane explain --from=SOURCE --to=DESTINATION [--port=PORT[/tcp|udp|sctp]] [-o text|json]\n\n"+
			"Says why a connection works or fails, step by step: DNS, the Service and the endpoints the\n"+
			"source's node chooses, NetworkPolicy at both ends, the path, and on a node its kernel.\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return exitOK
		}
		fmt.Fprintf(stderr, "netplane explain: %v\n", err)
		return exitUsage
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "netplane explain: %s\n", strings.ReplaceAll(err.Error(), "\n", "; "))
		return exitFailure
	}
	switch {
	case *from == "" || *to == "":
		fmt.Fprintln(stderr, "netplane explain: --from and --to are required (netplane explain --help)")
		return exitUsage
	case *output != "text" && *output != "json":
		fmt.Fprintf(stderr, "netplane explain: -o %s: text or json\n", *output)
		return exitUsage
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "netplane explain: unexpected argument %q\n", fs.Arg(0))
		return exitUsage
	}
	pq, err := explain.ParsePort(*port)
	if err != nil {
		return fail(err)
	}
	cfg, err := nodeConfig(*cfgFile)
	if err != nil {
		return fail(err)
	}
	cc := cfg.ClientConnection
	cc.Kubeconfig = *kubeconfig
	if *endpoint != "" {
		cc.ControlPlaneEndpoint = *endpoint
	}
	cc.QPS, cc.Burst = 50, 100
	rc, err := kube.RestConfig(cc)
	if err != nil {
		return fail(err)
	}
	rc.Timeout = *timeout
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return fail(err)
	}
	cfg.Node.Overlay.Mode = or(*overlayMode, cfg.Node.Overlay.Mode)
	cfg.Node.Encryption.Mode = or(*encryption, cfg.Node.Encryption.Mode)
	q := explain.Question{From: *from, To: *to, Namespace: *ns, Port: pq,
		ClusterDomain: or(*domain, cfg.DNS.ClusterDomain), Settings: nodeview.SettingsOf(cfg.Node)}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	x, err := explain.Run(ctx, client, q, explain.NewKernel)
	if err != nil {
		return fail(err)
	}
	if *output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(x)
	} else {
		err = explain.WriteText(stdout, x)
	}
	if err != nil {
		return fail(err)
	}
	return exitOK
}

// nodeConfig reads a Configuration file for the few settings explain
// shares with the node role; the defaults without one.
func nodeConfig(path string) (*v1alpha1.Configuration, error) {
	cfg := v1alpha1.Default()
	if path == "" {
		if _, err := os.Stat(nodeConfigFile); err != nil {
			return cfg, nil
		}
		path = nodeConfigFile
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config file: %w", err)
	}
	if err := yaml.Unmarshal(data, cfg); err != nil {
		return nil, fmt.Errorf("config file %s: %w", path, err)
	}
	return cfg, nil
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
