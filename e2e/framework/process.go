package framework

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// Process is a child process the test started and must stop.
type Process struct {
	Name string
	Cmd  *exec.Cmd
	Log  string // file holding its stdout and stderr
	done chan struct{}
	err  error
}

// StartProcess starts cmd with its output in logPath. The child gets SIGKILL
// if the test binary dies (Pdeathsig), so a crashed test leaves nothing behind.
func StartProcess(name string, cmd *exec.Cmd, logPath string) (*Process, error) {
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	return start(name, cmd, f)
}

// Again starts p's command anew, once p has ended: same arguments,
// environment and folder, its output appended to the same log.
func (p *Process) Again() (*Process, error) {
	<-p.done
	f, err := os.OpenFile(p.Log, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(p.Cmd.Path, p.Cmd.Args[1:]...)
	cmd.Env, cmd.Dir = p.Cmd.Env, p.Cmd.Dir
	return start(p.Name, cmd, f)
}

func start(name string, cmd *exec.Cmd, f *os.File) (*Process, error) {
	logPath := f.Name()
	cmd.Stdout, cmd.Stderr = f, f
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Process{Name: name, Cmd: cmd, Log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// Exited reports whether the process has ended.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Wait waits up to timeout for the process to end by itself and returns its
// exit error; it reports a timeout without killing the process.
func (p *Process) Wait(timeout time.Duration) (error, bool) {
	select {
	case <-p.done:
		return p.err, true
	case <-time.After(timeout):
		return nil, false
	}
}

// Stop sends SIGTERM, then SIGKILL after grace, and waits for the end.
func (p *Process) Stop(grace time.Duration) {
	if p.Exited() {
		return
	}
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	if _, ok := p.Wait(grace); ok {
		return
	}
	_ = p.Cmd.Process.Kill()
	<-p.done
}

// Kill ends the process at once (SIGKILL), as a crash would, and waits.
func (p *Process) Kill() {
	if !p.Exited() {
		_ = p.Cmd.Process.Kill()
	}
	<-p.done
}

// Tail returns the last n lines of the process's log, for failure messages.
func (p *Process) Tail(n int) string {
	data, _ := os.ReadFile(p.Log)
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
