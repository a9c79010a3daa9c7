package endpointslice

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestSplicerLetsANarrowedSyncOnlyUpdateItsCuts: in a narrowed sync of a
// Service, a create or delete of its slices, or an update that does not
// fit its cut, is refused and widens the sync; other Services' writes and
// slices without a cut pass as they are.
func TestSplicerLetsANarrowedSyncOnlyUpdateItsCuts(t *testing.T) {
	ep := func(pod string) discovery.Endpoint {
		return discovery.Endpoint{Addresses: []string{"10.0.0.1"}, TargetRef: &corev1.ObjectReference{Name: pod}}
	}
	slice := func(name, svc string, eps ...discovery.Endpoint) *discovery.EndpointSlice {
		return &discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{discovery.LabelServiceName: svc}},
			AddressType: discovery.AddressTypeIPv4, Endpoints: eps}
	}
	whole := slice("a-1", "a", ep("p0"), ep("p1"), ep("p2"))
	cuts := map[string]cut{"a-1": {whole: whole, at: []int{1}}}
	for _, tc := range []struct {
		name    string
		write   func(s *splicer) (bool, error) // whether it went through
		wantOK  bool
		widened bool
	}{
		{"an update of the cut is spliced", func(s *splicer) (bool, error) {
			out, err := s.update("ns", slice("a-1", "a", ep("p1")))
			return err == nil && len(out.Endpoints) == 3 && out.Endpoints[1].TargetRef.Name == "p1", err
		}, true, false},
		{"an update with another endpoint widens", func(s *splicer) (bool, error) {
			_, err := s.update("ns", slice("a-1", "a", ep("p2")))
			return err == nil, err
		}, false, true},
		{"an update with another port widens", func(s *splicer) (bool, error) {
			part := slice("a-1", "a", ep("p1"))
			part.Ports = []discovery.EndpointPort{{Name: new("http")}}
			_, err := s.update("ns", part)
			return err == nil, err
		}, false, true},
		{"a create for the Service widens", func(s *splicer) (bool, error) { return s.allowed("ns", "a", ""), nil }, false, true},
		{"a delete of the cut widens", func(s *splicer) (bool, error) { return s.allowed("ns", "", "a-1"), nil }, false, true},
		{"a create for another Service passes", func(s *splicer) (bool, error) { return s.allowed("ns", "b", ""), nil }, true, false},
		{"an update of a slice without a cut passes", func(s *splicer) (bool, error) {
			in := slice("b-1", "b", ep("q"))
			out, err := s.update("ns", in)
			return err == nil && out == in, err
		}, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSplicer()
			s.begin("ns", "a", cuts)
			ok, _ := tc.write(s)
			if widened := s.end("ns", "a", cuts); ok != tc.wantOK || widened != tc.widened {
				t.Errorf("went through %v, widened %v; want %v, %v", ok, widened, tc.wantOK, tc.widened)
			}
			if len(s.cuts)+len(s.services)+len(s.widen) != 0 {
				t.Error("the sync's end left state behind")
			}
		})
	}
}
