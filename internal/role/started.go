package role

import "sync"

// Started runs done once, when every part that began its start has ended
// it: the node role gives back what start-up used and serving does not
// (memory.ReleaseStartup) when the last of its features' first syncs has
// converged. Each feature's first lists come at their own time (the
// NetworkPolicy feature's 150,000 pods well after the proxy's first sync),
// and the collector's goal set while the last of them was decoded would
// otherwise let the heap grow that far again before its next collection.
type Started struct {
	mu      sync.Mutex
	pending int
	done    func()
}

// NewStarted makes a Started that runs done.
func NewStarted(done func()) *Started { return &Started{done: done} }

// Begin counts one part in; call the func it returns when the part's start
// is done (later calls do nothing). Begin every part before any ends its
// start. A nil Started counts nothing.
func (s *Started) Begin() func() {
	if s == nil {
		return func() {}
	}
	s.mu.Lock()
	s.pending++
	s.mu.Unlock()
	var once sync.Once
	return func() { once.Do(s.end) }
}

func (s *Started) end() {
	s.mu.Lock()
	s.pending--
	last := s.pending == 0
	s.mu.Unlock()
	if last {
		s.done()
	}
}
