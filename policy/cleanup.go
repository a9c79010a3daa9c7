package policy

import "github.com/netplane/netplane/sweep"

// Cleanup removes policy's table, inet netplane-policy, for
// `netplane --role=node --cleanup`.
func Cleanup(s *sweep.Sweep) { s.Table(TableID) }
