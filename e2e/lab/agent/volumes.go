package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// mounts makes the volumes the container mounts. The lab supports the
// kinds its pods use: the projected service-account volume the admission
// plugin adds (token, ca.crt, namespace), hostPath and emptyDir.
func (w *podWorker) mounts(ctx context.Context, pod *corev1.Pod, c *corev1.Container) ([]*cri.Mount, error) {
	var out []*cri.Mount
	for _, vm := range c.VolumeMounts {
		var vol *corev1.Volume
		for i := range pod.Spec.Volumes {
			if pod.Spec.Volumes[i].Name == vm.Name {
				vol = &pod.Spec.Volumes[i]
			}
		}
		if vol == nil {
			return nil, fmt.Errorf("volumeMount %s names no volume", vm.Name)
		}
		host, err := w.volume(ctx, pod, vol)
		if err != nil {
			return nil, fmt.Errorf("volume %s: %w", vol.Name, err)
		}
		out = append(out, &cri.Mount{ContainerPath: vm.MountPath, HostPath: filepath.Join(host, vm.SubPath), Readonly: vm.ReadOnly})
	}
	return out, nil
}

func (w *podWorker) volume(ctx context.Context, pod *corev1.Pod, vol *corev1.Volume) (string, error) {
	switch {
	case vol.HostPath != nil:
		return vol.HostPath.Path, nil
	case vol.EmptyDir != nil:
		dir := w.podDir("volumes", vol.Name)
		return dir, os.MkdirAll(dir, 0o777)
	case vol.Projected != nil:
		return w.projected(ctx, pod, vol)
	case vol.ConfigMap != nil:
		return w.configMap(ctx, pod, vol)
	}
	return "", fmt.Errorf("volume kind not supported by the lab agent")
}

func (w *podWorker) projected(ctx context.Context, pod *corev1.Pod, vol *corev1.Volume) (string, error) {
	dir := w.podDir("volumes", vol.Name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	for _, src := range vol.Projected.Sources {
		switch {
		case src.ServiceAccountToken != nil:
			tr, err := w.a.client.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, pod.Spec.ServiceAccountName, &authenticationv1.TokenRequest{
				Spec: authenticationv1.TokenRequestSpec{
					Audiences:         nonEmpty(src.ServiceAccountToken.Audience),
					ExpirationSeconds: src.ServiceAccountToken.ExpirationSeconds,
					BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
				}}, metav1.CreateOptions{})
			if err != nil {
				return "", fmt.Errorf("token request: %w", err)
			}
			if err := os.WriteFile(filepath.Join(dir, src.ServiceAccountToken.Path), []byte(tr.Status.Token), 0o644); err != nil {
				return "", err
			}
		case src.ConfigMap != nil:
			cm, err := w.a.client.CoreV1().ConfigMaps(pod.Namespace).Get(ctx, src.ConfigMap.Name, metav1.GetOptions{})
			if err != nil {
				return "", err
			}
			for _, item := range src.ConfigMap.Items {
				if err := os.WriteFile(filepath.Join(dir, item.Path), []byte(cm.Data[item.Key]), 0o644); err != nil {
					return "", err
				}
			}
		case src.DownwardAPI != nil:
			for _, item := range src.DownwardAPI.Items {
				if item.FieldRef != nil && item.FieldRef.FieldPath == "metadata.namespace" {
					if err := os.WriteFile(filepath.Join(dir, item.Path), []byte(pod.Namespace), 0o644); err != nil {
						return "", err
					}
				}
			}
		}
	}
	return dir, nil
}

// configMap writes the ConfigMap's keys (or the listed items) as files.
func (w *podWorker) configMap(ctx context.Context, pod *corev1.Pod, vol *corev1.Volume) (string, error) {
	dir := w.podDir("volumes", vol.Name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	cm, err := w.a.client.CoreV1().ConfigMaps(pod.Namespace).Get(ctx, vol.ConfigMap.Name, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	files := map[string]string{}
	for k := range cm.Data {
		files[k] = k
	}
	if len(vol.ConfigMap.Items) > 0 {
		files = map[string]string{}
		for _, item := range vol.ConfigMap.Items {
			files[item.Key] = item.Path
		}
	}
	for key, path := range files {
		if err := os.WriteFile(filepath.Join(dir, path), []byte(cm.Data[key]), 0o644); err != nil {
			return "", err
		}
	}
	return dir, nil
}

func nonEmpty(s string) []string {
	if s == "" {
		return nil
	}
	return []string{s}
}
