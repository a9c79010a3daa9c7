// Command lab-agent is the lab's kubelet stand-in for networking (see
// package agent). It is test infrastructure, not part of netplane.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/netplane/netplane/e2e/lab"
	"github.com/netplane/netplane/e2e/lab/agent"
)

func main() {
	var cfg agent.Config
	var kubeconfig, socket, nodeIPs string
	flag.StringVar(&cfg.NodeName, "node-name", "", "name of the Node")
	flag.StringVar(&nodeIPs, "node-ip", "", "the node's InternalIPs, comma-separated, IPv4 first")
	flag.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig of the agent")
	flag.StringVar(&socket, "cri-socket", "", "the node's containerd socket")
	flag.StringVar(&cfg.PodDir, "pod-dir", "", "directory for pod logs and volumes")
	flag.StringVar(&cfg.ClusterDNS, "cluster-dns", lab.DNSServiceIP, "nameserver of ClusterFirst pods")
	flag.StringVar(&cfg.ClusterDomain, "cluster-domain", lab.ClusterDomain, "cluster DNS domain")
	flag.StringVar(&cfg.UpstreamDNS, "upstream-dns", lab.UpstreamDNSIP, "nameserver of dnsPolicy Default pods")
	klog.InitFlags(nil)
	flag.Parse()
	cfg.NodeIPs = strings.Split(nodeIPs, ",")
	if err := run(cfg, kubeconfig, socket); err != nil {
		fmt.Fprintln(os.Stderr, "lab-agent:", err)
		os.Exit(1)
	}
}

func run(cfg agent.Config, kubeconfig, socket string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	rt, err := lab.DialCRI(socket)
	if err != nil {
		return err
	}
	defer rt.Close()
	return agent.New(cfg, client, rt.Runtime).Run(ctx)
}
