package lab

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// kubeletSysctls are the kernel-wide settings the kubelet rewrites when it
// starts (its kernel tunables); no network namespace isolates them.
var kubeletSysctls = []string{
	"kernel/panic", "kernel/panic_on_oops", "vm/overcommit_memory", "vm/panic_on_oom",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
}

// machineRecord holds what the labs change outside their namespaces: the
// machine's values of the kernel-wide settings from before the first lab's
// kubelet, the folders made as mount points of the nodes' own paths
// (nodePaths) where the machine had none, and one file per lab that runs
// nodes. It is one record for the machine, since labs can run side by
// side: the second lab must not take the first one's kubelet values for
// the machine's, nor remove a mount point another lab's nodes use. It
// lives under /run, which a reboot empties, as it resets the settings.
var machineRecord = "/run/netplane-lab-machine"

// holdMachine adds the lab in stateDir to the record, writing the current
// values first when it is the only lab, and makes the nodes' mount points.
func holdMachine(stateDir string) error {
	return withMachineLock(func() error {
		if err := os.MkdirAll(filepath.Join(machineRecord, "holders"), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(holderFile(stateDir), []byte(stateDir), 0o644); err != nil {
			return err
		}
		if err := makeMountPoints(); err != nil {
			return err
		}
		values := filepath.Join(machineRecord, "values.json")
		if _, err := os.Stat(values); errors.Is(err, os.ErrNotExist) {
			saved := map[string]string{}
			for _, k := range kubeletSysctls {
				v, err := os.ReadFile(filepath.Join("/proc/sys", k))
				if err != nil {
					return fmt.Errorf("record %s: %w", k, err)
				}
				saved[k] = strings.TrimSpace(string(v))
			}
			data, _ := json.Marshal(saved)
			return writeAtomic(values, data)
		}
		return nil
	})
}

// makeMountPoints makes the folders of nodePaths the machine lacks, each
// recorded before it is made.
func makeMountPoints() error {
	made := readMadeDirs()
	for _, p := range nodePaths {
		var missing []string
		for d := p; d != "/"; d = filepath.Dir(d) {
			if _, err := os.Stat(d); err == nil {
				break
			}
			missing = append(missing, d)
		}
		for i := len(missing) - 1; i >= 0; i-- {
			made = append(made, missing[i])
			data, _ := json.Marshal(made)
			if err := writeAtomic(filepath.Join(machineRecord, "dirs.json"), data); err != nil {
				return err
			}
			if err := os.Mkdir(missing[i], 0o755); err != nil && !os.IsExist(err) {
				return fmt.Errorf("mount point %s: %w", missing[i], err)
			}
		}
	}
	return nil
}

func readMadeDirs() []string {
	var made []string
	data, err := os.ReadFile(filepath.Join(machineRecord, "dirs.json"))
	if err == nil {
		json.Unmarshal(data, &made)
	}
	return made
}

// removeMountPoints removes the recorded folders, deepest first; one that
// is not empty any more holds what someone else put there and stays.
func removeMountPoints() error {
	made := readMadeDirs()
	var errs []error
	for i := len(made) - 1; i >= 0; i-- {
		err := os.Remove(made[i])
		if err != nil && !os.IsNotExist(err) && !errors.Is(err, unix.ENOTEMPTY) && !errors.Is(err, unix.EEXIST) {
			errs = append(errs, fmt.Errorf("remove mount point %s: %w", made[i], err))
		}
	}
	return errors.Join(errs...)
}

// releaseMachine removes the lab in stateDir from the record. The last lab
// to go (labs whose state directory is gone no longer count) restores the
// recorded values, removes the mount points it made and removes the record.
func releaseMachine(stateDir string) error {
	return withMachineLock(func() error {
		os.Remove(holderFile(stateDir))
		holders, _ := filepath.Glob(filepath.Join(machineRecord, "holders", "*"))
		for _, h := range holders {
			dir, err := os.ReadFile(h)
			if err == nil {
				if _, err := os.Stat(filepath.Join(string(dir), stateName)); err == nil {
					return nil // another lab still runs kubelets
				}
			}
			os.Remove(h)
		}
		if err := removeMountPoints(); err != nil {
			return err // the record stays for the next try
		}
		data, err := os.ReadFile(filepath.Join(machineRecord, "values.json"))
		if errors.Is(err, os.ErrNotExist) {
			return os.RemoveAll(machineRecord)
		}
		if err != nil {
			return err
		}
		var saved map[string]string
		if err := json.Unmarshal(data, &saved); err != nil {
			return fmt.Errorf("%s: %w", machineRecord, err)
		}
		var errs []error
		for k, v := range saved {
			if err := os.WriteFile(filepath.Join("/proc/sys", k), []byte(v), 0o644); err != nil {
				errs = append(errs, fmt.Errorf("restore %s=%s: %w", k, v, err))
			}
		}
		if len(errs) > 0 {
			return errors.Join(errs...) // the record stays for the next try
		}
		return os.RemoveAll(machineRecord)
	})
}

func holderFile(stateDir string) string {
	sum := sha256.Sum256([]byte(stateDir))
	return filepath.Join(machineRecord, "holders", hex.EncodeToString(sum[:8]))
}

// withMachineLock runs fn under an exclusive lock on /run/lock, the
// machine's directory for locks, taken on the directory itself so that no
// lock file is left behind.
func withMachineLock(fn func() error) error {
	dir := "/run/lock"
	if _, err := os.Stat(dir); err != nil {
		dir = "/run"
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Flock(fd, unix.LOCK_EX); err != nil {
		return err
	}
	defer unix.Flock(fd, unix.LOCK_UN)
	return fn()
}

func writeAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
