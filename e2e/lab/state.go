package lab

import (
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
)

// state is what a lab has made, written to the state directory before each
// thing is made, so that Down can remove all of it after a crash.
type state struct {
	// Owner is the pid of the process that runs the lab (the test or
	// `netplane-lab run`); Down stops it first.
	Owner      int              `json:"owner"`
	Namespaces []string         `json:"namespaces"`
	Pids       map[string]int   `json:"pids"`
	Containerd []containerdInfo `json:"containerd"`
	// CgroupRoots are the nodes' cgroups, made in every hierarchy.
	CgroupRoots []string `json:"cgroupRoots,omitempty"`
	// HoldsMachine says the lab is in the machine's record of what its
	// nodes change outside their namespaces (machine.go).
	HoldsMachine bool `json:"holdsMachine,omitempty"`

	// What Attach needs to use a running lab from another process.
	Kubeconfig string     `json:"kubeconfig,omitempty"`
	APIAddress string     `json:"apiAddress,omitempty"`
	External   string     `json:"external,omitempty"`
	Underlay   string     `json:"underlay,omitempty"`
	Subnets    int        `json:"subnets,omitempty"`
	Encryption string     `json:"encryption,omitempty"`
	PodRelay   bool       `json:"podRelay,omitempty"`
	Family     string     `json:"family,omitempty"`
	Stack      string     `json:"stack,omitempty"`
	BinDir     string     `json:"binDir,omitempty"`
	Nodes      []nodeInfo `json:"nodes,omitempty"`
}

type nodeInfo struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	Socket    string `json:"socket"`
	IP        string `json:"ip"`
	IP6       string `json:"ip6"`
}

// containerdInfo is enough to start a node's containerd again for cleanup:
// Holder is the pid whose mount namespace is the node's, Socket and State
// the machine's paths of containerd's socket and state folder.
type containerdInfo struct {
	Namespace string `json:"namespace"`
	Holder    int    `json:"holder"`
	Config    string `json:"config"`
	Socket    string `json:"socket"`
	State     string `json:"state"`
}

type stateFile struct {
	mu   sync.Mutex
	path string
	s    state
}

const stateName = "state.json"

func newStateFile(dir string) *stateFile {
	f := &stateFile{path: filepath.Join(dir, stateName), s: state{Owner: os.Getpid(), Pids: map[string]int{}}}
	f.save()
	return f
}

func readState(dir string) (state, error) {
	var s state
	data, err := os.ReadFile(filepath.Join(dir, stateName))
	if err != nil {
		return s, err
	}
	return s, json.Unmarshal(data, &s)
}

func (f *stateFile) update(fn func(*state)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(&f.s)
	f.saveLocked()
}

func (f *stateFile) addNamespace(name string) {
	f.update(func(s *state) { s.Namespaces = append(s.Namespaces, name) })
}

func (f *stateFile) addPid(name string, pid int) {
	f.update(func(s *state) { s.Pids[name] = pid })
}

func (f *stateFile) addContainerd(c containerdInfo) {
	f.update(func(s *state) { s.Containerd = append(s.Containerd, c) })
}

func (f *stateFile) addCgroupRoot(path string) {
	f.update(func(s *state) {
		for _, p := range s.CgroupRoots {
			if p == path {
				return
			}
		}
		s.CgroupRoots = append(s.CgroupRoots, path)
	})
}

func (f *stateFile) save() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.saveLocked()
}

// saveLocked writes atomically: a crash mid-write leaves the old file.
func (f *stateFile) saveLocked() {
	data, _ := json.MarshalIndent(f.s, "", "  ")
	tmp := f.path + ".tmp"
	if os.WriteFile(tmp, data, 0o644) == nil {
		os.Rename(tmp, f.path)
	}
}
