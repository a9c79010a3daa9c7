// Package agent is the lab's node agent: a stand-in for the kubelet that
// does only what the network needs. It is test infrastructure, not part of
// netplane. It registers its Node (InternalIPs, capacity, Ready) and keeps
// its heartbeat; runs the Pods bound to it through CRI on the node's
// containerd, so containerd invokes the node's CNI plugin exactly as under a
// kubelet; probes httpGet readiness; writes Pod status (IPs, phase, Ready);
// and removes the sandboxes of deleted Pods. Restarting it leaves running
// pods alone: it adopts them again by their CRI labels.
package agent

import (
	"context"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"
)

// Config is what the agent needs to know about its node.
type Config struct {
	NodeName      string
	NodeIPs       []string // InternalIPs, IPv4 first
	PodDir        string   // per-pod files: logs, volumes
	ClusterDNS    string   // nameserver of pods with dnsPolicy ClusterFirst
	ClusterDomain string
	UpstreamDNS   string // nameserver of pods with dnsPolicy Default
}

// Agent runs the pods of one node.
type Agent struct {
	cfg     Config
	client  kubernetes.Interface
	runtime cri.RuntimeServiceClient
	pods    listersv1.PodLister

	mu      sync.Mutex
	workers map[types.UID]*podWorker
}

// New makes an agent.
func New(cfg Config, client kubernetes.Interface, runtime cri.RuntimeServiceClient) *Agent {
	return &Agent{cfg: cfg, client: client, runtime: runtime, workers: map[types.UID]*podWorker{}}
}

// Run registers the node and runs its pods until ctx ends.
func (a *Agent) Run(ctx context.Context) error {
	if err := a.registerNode(ctx); err != nil {
		return err
	}
	go a.heartbeat(ctx)
	factory := informers.NewSharedInformerFactoryWithOptions(a.client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", a.cfg.NodeName).String()
	}))
	inf := factory.Core().V1().Pods()
	a.pods = inf.Lister()
	inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { a.podChanged(ctx, obj) },
		UpdateFunc: func(_, obj any) { a.podChanged(ctx, obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			a.podChanged(ctx, obj)
		},
	})
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.Informer().HasSynced) {
		return ctx.Err()
	}
	klog.InfoS("pods synced; running", "node", a.cfg.NodeName)
	// Sandboxes whose pod is gone (deleted while the agent was down, or
	// force-deleted) get a worker too, which removes them.
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		a.adoptOrphans(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// podChanged wakes the pod's worker, starting one for a new pod.
func (a *Agent) podChanged(ctx context.Context, obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	a.worker(ctx, pod.UID, pod.Namespace, pod.Name).notify()
}

func (a *Agent) worker(ctx context.Context, uid types.UID, namespace, name string) *podWorker {
	a.mu.Lock()
	defer a.mu.Unlock()
	w := a.workers[uid]
	if w == nil {
		w = newPodWorker(a, uid, namespace, name)
		a.workers[uid] = w
		go func() {
			w.run(ctx)
			a.mu.Lock()
			delete(a.workers, uid)
			a.mu.Unlock()
		}()
	}
	return w
}

func (a *Agent) adoptOrphans(ctx context.Context) {
	resp, err := a.runtime.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{})
	if err != nil {
		klog.ErrorS(err, "list sandboxes")
		return
	}
	for _, sb := range resp.Items {
		uid := types.UID(sb.Labels[labelPodUID])
		if uid == "" {
			continue
		}
		a.worker(ctx, uid, sb.Labels[labelPodNamespace], sb.Labels[labelPodName]).notify()
	}
}
