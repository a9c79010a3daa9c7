package agent

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// writeStatus writes the pod's phase, IPs, conditions and container
// statuses when they differ from what was written last. ips is nil while
// the pod is not running.
func (w *podWorker) writeStatus(ctx context.Context, pod *corev1.Pod, ips []string) error {
	status := w.status(pod, ips)
	key := statusKey(status)
	if key == w.lastStatus && key == statusKey(pod.Status) {
		return nil
	}
	updated := pod.DeepCopy()
	updated.Status = status
	if _, err := w.a.client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, updated, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update status: %w", err)
	}
	w.lastStatus = key
	return nil
}

func (w *podWorker) status(pod *corev1.Pod, ips []string) corev1.PodStatus {
	now := metav1.Now()
	s := corev1.PodStatus{Phase: corev1.PodPending, HostIPs: w.a.hostIPs(), StartTime: pod.Status.StartTime, QOSClass: pod.Status.QOSClass}
	if s.StartTime == nil {
		s.StartTime = &now
	}
	s.HostIP = s.HostIPs[0].IP
	allReady := ips != nil
	for _, c := range pod.Spec.Containers {
		cs := corev1.ContainerStatus{Name: c.Name, Image: c.Image, ImageID: c.Image}
		if st := w.containers[c.Name]; st != nil && st.id != "" && ips != nil {
			cs.ContainerID, cs.RestartCount, cs.Ready, cs.Started = "containerd://"+st.id, st.restarts, st.ready, &[]bool{true}[0]
			cs.State.Running = &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(st.startedAt)}
		} else {
			cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}
		}
		allReady = allReady && cs.Ready
		s.ContainerStatuses = append(s.ContainerStatuses, cs)
	}
	if ips != nil {
		s.Phase = corev1.PodRunning
		s.PodIP = ips[0]
		for _, ip := range ips {
			s.PodIPs = append(s.PodIPs, corev1.PodIP{IP: ip})
		}
	}
	cond := func(t corev1.PodConditionType, ok bool) corev1.PodCondition {
		c := corev1.PodCondition{Type: t, Status: corev1.ConditionFalse, LastTransitionTime: now}
		if ok {
			c.Status = corev1.ConditionTrue
		}
		for _, old := range pod.Status.Conditions {
			if old.Type == t && old.Status == c.Status {
				c.LastTransitionTime = old.LastTransitionTime
			}
		}
		return c
	}
	s.Conditions = []corev1.PodCondition{
		cond(corev1.PodScheduled, true), cond(corev1.PodReadyToStartContainers, ips != nil),
		cond(corev1.PodInitialized, true), cond(corev1.ContainersReady, allReady), cond(corev1.PodReady, allReady),
	}
	return s
}

// statusKey is the part of a status whose change is worth a write.
func statusKey(s corev1.PodStatus) string {
	key := fmt.Sprintf("%s %v", s.Phase, s.PodIPs)
	for _, c := range s.Conditions {
		key += fmt.Sprintf(" %s=%s", c.Type, c.Status)
	}
	for _, c := range s.ContainerStatuses {
		key += fmt.Sprintf(" %s:%s:%v:%d", c.Name, c.ContainerID, c.Ready, c.RestartCount)
	}
	return key
}
