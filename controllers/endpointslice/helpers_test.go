package endpointslice

import (
	"fmt"
	"sync/atomic"

	"github.com/go-logr/logr"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

func logrDiscard() logr.Logger { return logr.Discard() }

func intstrFromInt(i int) intstr.IntOrString { return intstr.FromInt32(int32(i)) }

// newFakeClient is a fake clientset that, like the API server, names
// objects created with generateName and bumps a slice's generation on
// every write, which the stale-cache tracker relies on. onWrite sees
// each written slice as stored (recorded actions hold copies from before).
func newFakeClient(onWrite func(verb string, s *discovery.EndpointSlice)) *fake.Clientset {
	c := fake.NewClientset()
	var n atomic.Int64
	c.PrependReactor("create", "endpointslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
		s := a.(k8stesting.CreateAction).GetObject().(*discovery.EndpointSlice)
		if s.Name == "" && s.GenerateName != "" {
			s.Name = fmt.Sprintf("%s%05d", s.GenerateName, n.Add(1))
		}
		s.Generation = 1
		onWrite("create", s.DeepCopy())
		return false, nil, nil
	})
	c.PrependReactor("update", "endpointslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
		s := a.(k8stesting.UpdateAction).GetObject().(*discovery.EndpointSlice)
		s.Generation++
		onWrite("update", s.DeepCopy())
		return false, nil, nil
	})
	return c
}
