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

// sysctlRecord holds the machine's values from before the first lab's
// kubelet, and one file per lab that runs kubelets. It is one record for
// the machine, since labs can run side by side: the second lab must not
// take the first one's kubelet values for the machine's. It lives under
// /run, which a reboot empties, as it resets the settings.
var sysctlRecord = "/run/netplane-lab-sysctls"

// holdSysctls adds the lab in stateDir to the record, writing the current
// values first when it is the only lab.
func holdSysctls(stateDir string) error {
	return withSysctlLock(func() error {
		values := filepath.Join(sysctlRecord, "values.json")
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
			if err := os.MkdirAll(filepath.Join(sysctlRecord, "holders"), 0o755); err != nil {
				return err
			}
			if err := writeAtomic(values, data); err != nil {
				return err
			}
		}
		return os.WriteFile(holderFile(stateDir), []byte(stateDir), 0o644)
	})
}

// releaseSysctls removes the lab in stateDir from the record. The last lab
// to go (labs whose state directory is gone no longer count) restores the
// recorded values and removes the record.
func releaseSysctls(stateDir string) error {
	return withSysctlLock(func() error {
		os.Remove(holderFile(stateDir))
		holders, _ := filepath.Glob(filepath.Join(sysctlRecord, "holders", "*"))
		for _, h := range holders {
			dir, err := os.ReadFile(h)
			if err == nil {
				if _, err := os.Stat(filepath.Join(string(dir), stateName)); err == nil {
					return nil // another lab still runs kubelets
				}
			}
			os.Remove(h)
		}
		data, err := os.ReadFile(filepath.Join(sysctlRecord, "values.json"))
		if errors.Is(err, os.ErrNotExist) {
			return os.RemoveAll(sysctlRecord)
		}
		if err != nil {
			return err
		}
		var saved map[string]string
		if err := json.Unmarshal(data, &saved); err != nil {
			return fmt.Errorf("%s: %w", sysctlRecord, err)
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
		return os.RemoveAll(sysctlRecord)
	})
}

func holderFile(stateDir string) string {
	sum := sha256.Sum256([]byte(stateDir))
	return filepath.Join(sysctlRecord, "holders", hex.EncodeToString(sum[:8]))
}

// withSysctlLock runs fn under an exclusive lock on /run/lock, the
// machine's directory for locks, taken on the directory itself so that no
// lock file is left behind.
func withSysctlLock(fn func() error) error {
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
