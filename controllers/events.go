package controllers

import (
	"sync/atomic"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"
)

// switchRecorder is the event recorder a controller keeps for its whole
// life, while the broadcaster behind it lives for one run of the elected
// part: use points it at the running broadcaster's recorder, or at none
// (events are dropped) between runs.
type switchRecorder struct {
	current atomic.Pointer[record.EventRecorder]
}

func (s *switchRecorder) use(r record.EventRecorder) {
	if r == nil {
		s.current.Store(nil)
		return
	}
	s.current.Store(&r)
}

func (s *switchRecorder) get() record.EventRecorder {
	if p := s.current.Load(); p != nil {
		return *p
	}
	return nil
}

func (s *switchRecorder) Event(obj runtime.Object, eventtype, reason, message string) {
	if r := s.get(); r != nil {
		r.Event(obj, eventtype, reason, message)
	}
}

func (s *switchRecorder) Eventf(obj runtime.Object, eventtype, reason, messageFmt string, args ...any) {
	if r := s.get(); r != nil {
		r.Eventf(obj, eventtype, reason, messageFmt, args...)
	}
}

func (s *switchRecorder) AnnotatedEventf(obj runtime.Object, annotations map[string]string, eventtype, reason, messageFmt string, args ...any) {
	if r := s.get(); r != nil {
		r.AnnotatedEventf(obj, annotations, eventtype, reason, messageFmt, args...)
	}
}
