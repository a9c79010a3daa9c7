package v1alpha1

import (
	"os"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func duration(d time.Duration) metav1.Duration { return metav1.Duration{Duration: d} }

// Default returns a configuration with every field at its default. Loading
// starts from it, so a field a file or flag does not mention keeps this value.
func Default() *Configuration {
	hostname, _ := os.Hostname()
	return &Configuration{
		TypeMeta: metav1.TypeMeta{APIVersion: GroupVersion, Kind: Kind},
		ClientConnection: ClientConnection{
			// kube-controller-manager's and kube-proxy's own defaults.
			QPS:   20,
			Burst: 30,
		},
		HealthBindAddress:  "0.0.0.0:10290",
		MetricsBindAddress: "0.0.0.0:10291",
		ShutdownTimeout:    duration(10 * time.Second),
		Controller: Controller{
			MaxEndpointsPerSlice:           100,
			MirroringMaxEndpointsPerSubset: 1000,
			ConcurrentSyncs:                5,
			KubeAPIQPS:                     100,
			KubeAPIBurst:                   200,
			LeaderElection: LeaderElection{
				LeaderElect:       true,
				ResourceNamespace: "kube-system",
				ResourceName:      "netplane-controller",
				LeaseDuration:     duration(15 * time.Second),
				RenewDeadline:     duration(10 * time.Second),
				RetryPeriod:       duration(2 * time.Second),
			},
		},
		DNS: DNS{
			BindAddress:     ":53",
			ClusterDomain:   "cluster.local",
			TTL:             5,
			PodRecords:      PodRecordsInsecure,
			Autopath:        true,
			ResolvConf:      "/etc/resolv.conf",
			UpstreamTimeout: duration(2 * time.Second),
			CacheSize:       9984,
			CacheMaxTTL:     duration(30 * time.Second),
			DNSService:      "kube-system/kube-dns",
			// Where Kubernetes documents kube-dns's customisation.
			KubeDNSConfigMap: "kube-system/kube-dns",
			// kubeadm's Corefile: health { lameduck 5s }.
			Lameduck: duration(5 * time.Second),
		},
		Node: Node{
			NodeName:                hostname,
			SyncPeriod:              duration(30 * time.Second),
			MinSyncPeriod:           duration(100 * time.Millisecond),
			ProxyHealthzBindAddress: "0.0.0.0:10256",
			Conntrack:               Conntrack{TCPEstablishedTimeout: duration(24 * time.Hour), TCPCloseWaitTimeout: duration(time.Hour)},
			CNIConfDir:              "/etc/cni/net.d",
			CNIBinDir:               "/opt/cni/bin",
			IPAMStateDir:            "/var/lib/netplane/ipam",
			Bridge:                  "cni0",
			ProcSysDir:              "/proc/sys",
			NetworkPolicy:           NetworkPolicy{Enabled: true},
			Overlay:                 Overlay{Mode: OverlayCrossSubnet, VXLANPort: 4789, VXLANVNI: 1},
			Encryption: Encryption{Mode: EncryptionNone, WireGuardPort: 51820, Implementation: WireGuardAuto,
				PrivateKeyFile: "/var/lib/netplane/wireguard/private.key"},
		},
		Relay: Relay{BindAddress: "0.0.0.0:10292"},
	}
}
