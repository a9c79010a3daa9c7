package memory

// The executable's pages come back one at a time from the start: this
// package imports only the standard library and golang.org/x/sys, so its
// init runs before the initialisation of the API types and the other
// large packages linked in, whose reads would otherwise map 64 kB around
// each (PagesOneByOne).
func init() { _ = PagesOneByOne() }
