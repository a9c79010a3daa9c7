package proxy

import (
	"sync"

	"github.com/go-logr/logr"

	"github.com/netplane/netplane/apis/config/v1alpha1"
	"github.com/netplane/netplane/internal/memory"
)

// startup is the proxier's one-time work around its first sync. The
// garbage collector's headroom for the initial lists (memory.StartupHeadroom,
// set by the role) ends when the first sync ends, well or not. After the
// first sync that worked, the conntrack timeouts are set (the table's ct
// expressions have loaded nf_conntrack, so its sysctls exist). The node
// role gives the start's garbage back once every feature has synced
// (role.Started).
type startup struct {
	log  logr.Logger
	cfg  v1alpha1.Node
	once sync.Once
}

// syncEnded is called after every sync.
func (s *startup) syncEnded() { memory.EndStartupHeadroom() }

// synced is called after every sync that worked.
func (s *startup) synced() {
	s.once.Do(func() {
		if err := setConntrackTimeouts(s.cfg.ProcSysDir, s.cfg.Conntrack); err != nil {
			s.log.Error(err, "setting conntrack timeouts")
		}
	})
}
