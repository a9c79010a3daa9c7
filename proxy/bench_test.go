package proxy

import (
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// scaleInput is n ClusterIP Services with 10 endpoints each, the shape
// kube-proxy's own proxier benchmark uses.
func scaleInput(n int) Input {
	var objs []any
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("svc%d", i)
		objs = append(objs, svc("bench", name, func(s *v1.Service) {
			s.Spec.ClusterIP = fmt.Sprintf("172.30.%d.%d", i/250, i%250+1)
			s.Spec.Ports = []v1.ServicePort{tcp("p80", 80)}
		}))
		var eps []ep
		for j := 0; j < 10; j++ {
			eps = append(eps, ep{ip: fmt.Sprintf("10.%d.%d.%d", 1+i/5000, (i/25)%200, (i%25)*10+j+1), node: "node-b"})
		}
		objs = append(objs, slice("bench/"+name, name+"-a", map[string]int32{"p80": 8080}, v1.ProtocolTCP, eps...))
	}
	return input(testNode, objs...)
}

func BenchmarkBuild(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		in := scaleInput(n)
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			for b.Loop() {
				Build(in)
			}
		})
	}
}

// BenchmarkBuildOneChange is the steady state: one EndpointSlice changed
// on top of n Services, with the model's cache warm; "whole" builds from
// every record (a full sync), "told" is given the changed Service only (a
// partial sync, Model.Apply).
func BenchmarkBuildOneChange(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		in := scaleInput(n)
		m := NewModel()
		m.Build(in)
		key := nsName("bench", "svc7")
		svc := in.Services[7]
		if svc.key() != key {
			b.Fatalf("Service 7 is %v", svc.key())
		}
		b.Run(fmt.Sprintf("%d/whole", n), func(b *testing.B) {
			for b.Loop() {
				s := *in.Slices[key][0]
				in.Slices[key] = []*sliceRecord{&s}
				m.Build(in)
			}
		})
		b.Run(fmt.Sprintf("%d/told", n), func(b *testing.B) {
			for b.Loop() {
				s := *in.Slices[key][0]
				in.Slices[key] = []*sliceRecord{&s}
				m.Apply(map[types.NamespacedName]Change{key: {Svc: svc, Slices: in.Slices[key]}})
			}
		})
	}
}
