package overlay

// Forget lets the external tests call Syncer.forget.
func Forget(s *Syncer) { s.forget() }
