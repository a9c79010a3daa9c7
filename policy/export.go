package policy

// ElementID is the id the driver gives e in a set like s: what a reader
// comparing the model with a kernel's table looks for (netplane explain).
func ElementID(s *Set, e Element) string { return elementID(s.Kind, e) }
