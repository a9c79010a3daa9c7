package framework

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func TestAPIServerStoresAndReturnsAService(t *testing.T) {
	s := StartAPIServer(t, Options{})
	ctx := Ctx(t)
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "web"},
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}},
		},
	}
	if _, err := s.Client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err := s.Client.CoreV1().Services("default").Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Spec.ClusterIP == "" || got.Spec.Ports[0].TargetPort.IntValue() != 8080 || got.Spec.Selector["app"] != "web" {
		t.Errorf("read back %+v", got.Spec)
	}
	t.Logf("Service web got ClusterIP %s from the real API server at %s", got.Spec.ClusterIP, s.URL)
}
