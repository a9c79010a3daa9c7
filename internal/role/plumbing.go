package role

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
)

// Register registers a part's metrics with the process's registry, or
// nowhere when Metrics is nil. Every part registers the same way, when it
// is built; a name registered twice is a programming error, returned.
func (d Deps) Register(cs ...prometheus.Collector) error {
	if d.Metrics == nil {
		return nil
	}
	for _, c := range cs {
		if err := d.Metrics.Register(c); err != nil {
			return fmt.Errorf("role %s: registering its metrics: %w", d.Role, err)
		}
	}
	return nil
}

// Recorder is how a part writes Kubernetes events through the process's
// client, as component on host (a node's name, kubelet's convention; ""
// off a node), and the stop of its broadcaster for when the part ends.
func (d Deps) Recorder(component, host string) (record.EventRecorder, func()) {
	b := record.NewBroadcaster()
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: d.Client.CoreV1().Events("")})
	return b.NewRecorder(scheme.Scheme, v1.EventSource{Component: component, Host: host}), b.Shutdown
}
