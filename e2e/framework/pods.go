package framework

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// CreatePod creates p and then sets its status from p.Status, as its
// kubelet would (no kubelet runs beside a test API server); status.podIP
// is the first of status.podIPs when unset. A pod that exists already (a
// retry after a status update failed) has its status set.
func CreatePod(ctx context.Context, c kubernetes.Interface, p *corev1.Pod) (*corev1.Pod, error) {
	status := p.Status
	if status.PodIP == "" && len(status.PodIPs) > 0 {
		status.PodIP = status.PodIPs[0].IP
	}
	created, err := c.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		created, err = c.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
	}
	if err != nil {
		return nil, fmt.Errorf("pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	created.Status = status
	updated, err := c.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("pod %s/%s status: %w", p.Namespace, p.Name, err)
	}
	return updated, nil
}
