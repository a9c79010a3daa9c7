package lab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/netplane/netplane/e2e/framework"
)

// Down removes everything a lab recorded in stateDir: it asks a live owner
// process to tear its lab down, then removes what is left by its own record
// (pods through each node's containerd, restarted for the purpose if it
// died; recorded processes, among them the holders of the nodes' mount
// namespaces, whose mounts go with them; shims; cgroups; the machine's
// record; network namespaces) and finally stateDir itself. It is safe to run twice and after a crash.
func Down(stateDir string, logf func(string, ...any)) error {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	st, err := readState(stateDir)
	if errors.Is(err, os.ErrNotExist) {
		if _, err := os.Stat(stateDir); errors.Is(err, os.ErrNotExist) {
			return nil
		}
	} else if err != nil {
		return fmt.Errorf("read lab state in %s: %w", stateDir, err)
	}
	if st.Owner != 0 && st.Owner != os.Getpid() && ownedBy(st.Owner, stateDir) {
		logf("lab: asking the lab process (pid %d) to stop", st.Owner)
		syscall.Kill(st.Owner, syscall.SIGTERM)
		if waitGone(st.Owner, 90*time.Second) {
			if _, err := os.Stat(stateDir); errors.Is(err, os.ErrNotExist) {
				return nil
			}
		} else {
			syscall.Kill(st.Owner, syscall.SIGKILL)
		}
	}
	var errs []error
	for _, c := range st.Containerd {
		if err := removePods(c, stateDir); err != nil {
			errs = append(errs, err)
		}
	}
	for name, pid := range st.Pids {
		if ownedBy(pid, stateDir) {
			logf("lab: killing leftover %s (pid %d)", name, pid)
			syscall.Kill(pid, syscall.SIGKILL)
			waitGone(pid, 5*time.Second)
		}
	}
	for _, c := range st.Containerd {
		killShims(c)
	}
	for _, cg := range st.CgroupRoots {
		if err := removeCgroup(cg); err != nil {
			errs = append(errs, err)
		}
	}
	if st.HoldsMachine {
		if err := releaseMachine(stateDir); err != nil {
			errs = append(errs, err)
		}
	}
	for _, name := range st.Namespaces {
		out, err := exec.Command("ip", "netns", "delete", name).CombinedOutput()
		if err != nil && !strings.Contains(string(out), "No such file") {
			errs = append(errs, fmt.Errorf("ip netns delete %s: %s", name, out))
		}
	}
	if err := os.RemoveAll(stateDir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// removePods removes a node's pods through its containerd, starting that
// containerd again if it is gone, so containerd itself undoes what it made
// (CNI DEL, mounts, network namespaces, shims).
func removePods(c containerdInfo, stateDir string) error {
	if _, err := os.Stat(filepath.Join("/run/netns", c.Namespace)); err != nil {
		return nil // the node is gone; killShims and unmountUnder finish
	}
	client, err := DialCRI(c.Socket)
	if err != nil {
		return err
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if client.WaitReady(ctx, time.Second) != nil {
		if !ownedBy(c.Holder, stateDir) {
			// The node's mount namespace is gone, and with it every mount
			// of its pods; what still runs is killed below.
			return nil
		}
		cmd := exec.Command("nsenter", "--target="+strconv.Itoa(c.Holder), "--net", "--mount", "--", "containerd", "--config", c.Config)
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("restart containerd for cleanup: %w", err)
		}
		defer func() {
			cmd.Process.Signal(syscall.SIGTERM)
			done := make(chan struct{})
			go func() { cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				cmd.Process.Kill()
				<-done
			}
		}()
		if err := client.WaitReady(ctx, 20*time.Second); err != nil {
			return err
		}
	}
	return client.RemoveAllSandboxes(ctx)
}

// killShims ends containerd shims and container processes of one node that
// outlived its containerd; their pid files are in the node's containerd
// state folder, and each is checked to still be a shim or a lab program.
func killShims(c containerdInfo) {
	files, _ := filepath.Glob(filepath.Join(c.State, "io.containerd.runtime.v2.task", "*", "*", "*.pid"))
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
		if err != nil || pid <= 1 {
			continue
		}
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if strings.Contains(string(cmdline), "containerd-shim") || strings.HasPrefix(string(cmdline), "/testimage") || strings.HasPrefix(string(cmdline), "/usr/local/bin/netplane") {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// ownedBy reports whether pid is alive and its command line names stateDir,
// which every process a lab starts has (a flag pointing into it); a pid the
// kernel has since given to another program does not.
func ownedBy(pid int, stateDir string) bool {
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && strings.Contains(string(cmdline), stateDir)
}

func waitGone(pid int, timeout time.Duration) bool {
	return framework.Poll(context.Background(), 50*time.Millisecond, timeout, "process gone", func(context.Context) error {
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			return nil
		}
		// A child of ours that exited is a zombie until reaped.
		if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil && strings.Contains(string(st), ") Z ") {
			return nil
		}
		return fmt.Errorf("pid %d runs", pid)
	}) == nil
}
