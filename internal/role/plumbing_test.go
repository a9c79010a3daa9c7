package role

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestRegisterTakesEachNameOnceAndNothingWithoutARegistry(t *testing.T) {
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "netplane_test_total", Help: "A test counter."})
	for _, tc := range []struct {
		name    string
		d       Deps
		twice   bool
		wantErr bool
	}{
		{"no registry: nothing registered", Deps{}, true, false},
		{"once", Deps{Metrics: prometheus.NewRegistry()}, false, false},
		{"a name twice is an error", Deps{Role: "node", Metrics: prometheus.NewRegistry()}, true, true},
	} {
		err := tc.d.Register(c)
		if tc.twice && err == nil {
			err = tc.d.Register(c)
		}
		if (err != nil) != tc.wantErr {
			t.Errorf("%s: error %v, want one: %v", tc.name, err, tc.wantErr)
		}
	}
}
