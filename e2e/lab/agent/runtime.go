package agent

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// CRI labels, the same the kubelet puts on what it creates; they let the
// agent find its pods again after a restart.
const (
	labelPodUID       = "io.kubernetes.pod.uid"
	labelPodName      = "io.kubernetes.pod.name"
	labelPodNamespace = "io.kubernetes.pod.namespace"
	labelContainer    = "io.kubernetes.container.name"
)

// ensureRunning makes the pod's sandbox and containers exist and run.
func (w *podWorker) ensureRunning(ctx context.Context, pod *corev1.Pod) error {
	sbConfig, err := w.sandboxConfig(pod)
	if err != nil {
		return err
	}
	if err := w.ensureSandbox(ctx, sbConfig); err != nil {
		return err
	}
	for i := range pod.Spec.Containers {
		if err := w.ensureContainer(ctx, pod, &pod.Spec.Containers[i], sbConfig); err != nil {
			return fmt.Errorf("container %s: %w", pod.Spec.Containers[i].Name, err)
		}
	}
	return nil
}

func (w *podWorker) podDir(elem ...string) string {
	return filepath.Join(append([]string{w.a.cfg.PodDir, string(w.uid)}, elem...)...)
}

func (w *podWorker) sandboxConfig(pod *corev1.Pod) (*cri.PodSandboxConfig, error) {
	hostname := pod.Name
	if pod.Spec.Hostname != "" {
		hostname = pod.Spec.Hostname
	}
	if pod.Spec.HostNetwork {
		hostname = ""
	}
	var ports []*cri.PortMapping
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			if p.HostPort > 0 && !pod.Spec.HostNetwork {
				ports = append(ports, &cri.PortMapping{Protocol: cri.Protocol(cri.Protocol_value[string(p.Protocol)]),
					ContainerPort: p.ContainerPort, HostPort: p.HostPort, HostIp: p.HostIP})
			}
		}
	}
	return &cri.PodSandboxConfig{
		Metadata:     &cri.PodSandboxMetadata{Name: pod.Name, Namespace: pod.Namespace, Uid: string(pod.UID)},
		Hostname:     hostname,
		LogDirectory: w.podDir("logs"),
		DnsConfig:    w.dnsConfig(pod),
		PortMappings: ports,
		Labels:       map[string]string{labelPodUID: string(pod.UID), labelPodName: pod.Name, labelPodNamespace: pod.Namespace},
		Linux: &cri.LinuxPodSandboxConfig{SecurityContext: &cri.LinuxSandboxSecurityContext{
			NamespaceOptions: &cri.NamespaceOption{Network: networkMode(pod), Pid: cri.NamespaceMode_CONTAINER, Ipc: cri.NamespaceMode_POD},
		}},
	}, nil
}

// networkMode is the node's network for hostNetwork pods, else the pod's own.
func networkMode(pod *corev1.Pod) cri.NamespaceMode {
	if pod.Spec.HostNetwork {
		return cri.NamespaceMode_NODE
	}
	return cri.NamespaceMode_POD
}

// dnsConfig is the resolv.conf the kubelet would give the pod.
func (w *podWorker) dnsConfig(pod *corev1.Pod) *cri.DNSConfig {
	policy := pod.Spec.DNSPolicy
	if policy == "" {
		policy = corev1.DNSClusterFirst
	}
	if policy == corev1.DNSClusterFirst && pod.Spec.HostNetwork {
		policy = corev1.DNSDefault
	}
	dc := &cri.DNSConfig{}
	switch policy {
	case corev1.DNSClusterFirst, corev1.DNSClusterFirstWithHostNet:
		d := w.a.cfg.ClusterDomain
		dc.Servers = []string{w.a.cfg.ClusterDNS}
		dc.Searches = []string{pod.Namespace + ".svc." + d, "svc." + d, d}
		dc.Options = []string{"ndots:5"}
	case corev1.DNSDefault:
		dc.Servers = []string{w.a.cfg.UpstreamDNS}
	}
	if c := pod.Spec.DNSConfig; c != nil {
		dc.Servers = append(dc.Servers, c.Nameservers...)
		dc.Searches = append(dc.Searches, c.Searches...)
		for _, o := range c.Options {
			if o.Value != nil {
				dc.Options = append(dc.Options, o.Name+":"+*o.Value)
			} else {
				dc.Options = append(dc.Options, o.Name)
			}
		}
	}
	return dc
}

// ensureSandbox adopts the pod's ready sandbox or runs a new one; a sandbox
// that is no longer ready (its network or pause process gone) is replaced.
func (w *podWorker) ensureSandbox(ctx context.Context, config *cri.PodSandboxConfig) error {
	resp, err := w.a.runtime.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{Filter: &cri.PodSandboxFilter{
		LabelSelector: map[string]string{labelPodUID: string(w.uid)}}})
	if err != nil {
		return err
	}
	var attempt uint32
	for _, sb := range resp.Items {
		if sb.State == cri.PodSandboxState_SANDBOX_READY {
			w.sandboxID = sb.Id
			return nil
		}
		attempt = max(attempt, sb.Metadata.GetAttempt()+1)
		w.a.runtime.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: sb.Id})
		w.a.runtime.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: sb.Id})
	}
	config.Metadata.Attempt = attempt
	run, err := w.a.runtime.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: config})
	if err != nil {
		return fmt.Errorf("run sandbox: %w", err)
	}
	w.sandboxID = run.PodSandboxId
	w.containers = map[string]*containerState{}
	return nil
}

// ensureContainer adopts the running container of that name in the
// sandbox, starts a created one, or (re)creates it, counting restarts.
func (w *podWorker) ensureContainer(ctx context.Context, pod *corev1.Pod, c *corev1.Container, sb *cri.PodSandboxConfig) error {
	st := w.containers[c.Name]
	if st == nil {
		st = &containerState{}
		w.containers[c.Name] = st
	}
	resp, err := w.a.runtime.ListContainers(ctx, &cri.ListContainersRequest{Filter: &cri.ContainerFilter{
		PodSandboxId: w.sandboxID, LabelSelector: map[string]string{labelContainer: c.Name}}})
	if err != nil {
		return err
	}
	for _, ctr := range resp.Containers {
		switch ctr.State {
		case cri.ContainerState_CONTAINER_RUNNING:
			if st.id != ctr.Id {
				st.id, st.startedAt = ctr.Id, time.Unix(0, ctr.CreatedAt)
				st.restarts = max(st.restarts, int32(ctr.Metadata.GetAttempt()))
			}
			return nil
		case cri.ContainerState_CONTAINER_CREATED:
			_, err := w.a.runtime.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: ctr.Id})
			return err
		default: // exited: restart it, as restartPolicy Always does
			st.restarts = max(st.restarts, int32(ctr.Metadata.GetAttempt())+1)
			st.id, st.ready, st.okRun = "", false, 0
			w.a.runtime.RemoveContainer(ctx, &cri.RemoveContainerRequest{ContainerId: ctr.Id})
		}
	}
	config, err := w.containerConfig(ctx, pod, c, uint32(st.restarts))
	if err != nil {
		return err
	}
	created, err := w.a.runtime.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: w.sandboxID, Config: config, SandboxConfig: sb})
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	if _, err := w.a.runtime.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: created.ContainerId}); err != nil {
		return fmt.Errorf("start: %w", err)
	}
	st.id, st.startedAt, st.ready, st.okRun, st.failRun = created.ContainerId, time.Now(), false, 0, 0
	return nil
}

func (w *podWorker) containerConfig(ctx context.Context, pod *corev1.Pod, c *corev1.Container, attempt uint32) (*cri.ContainerConfig, error) {
	mounts, err := w.mounts(ctx, pod, c)
	if err != nil {
		return nil, err
	}
	return &cri.ContainerConfig{
		Metadata:   &cri.ContainerMetadata{Name: c.Name, Attempt: attempt},
		Image:      &cri.ImageSpec{Image: c.Image},
		Command:    c.Command,
		Args:       c.Args,
		WorkingDir: c.WorkingDir,
		Envs:       w.envs(pod, c),
		Mounts:     mounts,
		Labels:     map[string]string{labelPodUID: string(pod.UID), labelContainer: c.Name},
		LogPath:    fmt.Sprintf("%s_%d.log", c.Name, attempt),
		Linux: &cri.LinuxContainerConfig{SecurityContext: &cri.LinuxContainerSecurityContext{
			NamespaceOptions: &cri.NamespaceOption{Network: networkMode(pod), Pid: cri.NamespaceMode_CONTAINER, Ipc: cri.NamespaceMode_POD},
		}},
	}, nil
}

// envs are the container's variables, with the downward-API fields tests
// use, and the kubernetes Service's address as the kubelet injects it.
func (w *podWorker) envs(pod *corev1.Pod, c *corev1.Container) []*cri.KeyValue {
	out := []*cri.KeyValue{{Key: "KUBERNETES_SERVICE_HOST", Value: []byte("10.96.0.1")}, {Key: "KUBERNETES_SERVICE_PORT", Value: []byte("443")}}
	for _, e := range c.Env {
		v := e.Value
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			switch e.ValueFrom.FieldRef.FieldPath {
			case "metadata.name":
				v = pod.Name
			case "metadata.namespace":
				v = pod.Namespace
			case "spec.nodeName":
				v = pod.Spec.NodeName
			case "status.hostIP":
				v = w.a.cfg.NodeIPs[0]
			}
		}
		out = append(out, &cri.KeyValue{Key: e.Name, Value: []byte(v)})
	}
	return out
}

// sandboxIPs are the pod's IPs as the CNI plugin reported them to
// containerd, primary first.
func (w *podWorker) sandboxIPs(ctx context.Context, pod *corev1.Pod) ([]string, error) {
	if pod.Spec.HostNetwork {
		return w.a.cfg.NodeIPs, nil
	}
	st, err := w.a.runtime.PodSandboxStatus(ctx, &cri.PodSandboxStatusRequest{PodSandboxId: w.sandboxID})
	if err != nil {
		return nil, err
	}
	n := st.Status.GetNetwork()
	if n.GetIp() == "" {
		return nil, fmt.Errorf("sandbox %s has no IP", w.sandboxID)
	}
	ips := []string{n.GetIp()}
	for _, ip := range n.GetAdditionalIps() {
		ips = append(ips, ip.GetIp())
	}
	return ips, nil
}

// removeSandboxes stops the pod's containers with the grace period, then
// stops and removes its sandboxes.
func (w *podWorker) removeSandboxes(ctx context.Context, grace int64) error {
	resp, err := w.a.runtime.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{Filter: &cri.PodSandboxFilter{
		LabelSelector: map[string]string{labelPodUID: string(w.uid)}}})
	if err != nil {
		return err
	}
	for _, sb := range resp.Items {
		ctrs, err := w.a.runtime.ListContainers(ctx, &cri.ListContainersRequest{Filter: &cri.ContainerFilter{PodSandboxId: sb.Id}})
		if err != nil {
			return err
		}
		for _, c := range ctrs.Containers {
			if c.State == cri.ContainerState_CONTAINER_RUNNING {
				w.a.runtime.StopContainer(ctx, &cri.StopContainerRequest{ContainerId: c.Id, Timeout: grace})
			}
		}
		if _, err := w.a.runtime.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: sb.Id}); err != nil && !strings.Contains(err.Error(), "not found") {
			return err
		}
		if _, err := w.a.runtime.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: sb.Id}); err != nil && !strings.Contains(err.Error(), "not found") {
			return err
		}
	}
	return nil
}
