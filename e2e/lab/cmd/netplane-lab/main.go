// Command netplane-lab runs the lab (package lab) for people: `make demo`
// uses it. It is test infrastructure, not part of netplane.
//
//	netplane-lab up    [--state-dir=D] [--nodes=N] [--subnets=1|2] [--api=127.0.0.1:PORT]
//	                   start the lab in the background and wait until it is ready
//	netplane-lab down  [--state-dir=D]   remove everything, also after a crash
//	netplane-lab exec  [--state-dir=D] [-n NAMESPACE] POD -- CMD...
//	                   run a command in a pod (every lab image has /testimage)
//	netplane-lab check [--state-dir=D] [--only=N,M]
//	                   deploy examples/ and check the scenarios (or only those numbered)
//	netplane-lab run   (what up starts in the background)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/netplane/netplane/e2e/lab"
	"github.com/netplane/netplane/e2e/lab/scenario"
)

const readyFile = "ready"

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: netplane-lab up|down|exec|check [flags]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	stateDir := fs.String("state-dir", "/var/lib/netplane-lab", "where the lab keeps everything it makes")
	nodes := fs.Int("nodes", 2, "number of nodes (up)")
	subnets := fs.Int("subnets", 0, "underlay subnets the nodes are spread over, 1 or 2 (up; default $NETPLANE_LAB_SUBNETS, else 2)")
	api := fs.String("api", "127.0.0.1:0", "root-namespace address of the relay to the API server (up)")
	namespace := fs.String("n", "default", "namespace of the pod (exec)")
	only := fs.String("only", "", "comma-separated numbers of the scenarios to check (check; default all)")
	fs.Parse(os.Args[2:])
	var err error
	switch os.Args[1] {
	case "up":
		err = up(*stateDir, *nodes, *subnets, *api)
	case "run":
		err = runLab(*stateDir, *nodes, *subnets, *api)
	case "down":
		err = lab.Down(*stateDir, logf)
		if err == nil {
			fmt.Println("lab removed")
		}
	case "exec":
		err = execInPod(*stateDir, *namespace, fs.Args())
	case "check":
		err = check(*stateDir, *only)
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "netplane-lab:", err)
		os.Exit(1)
	}
}

func logf(format string, args ...any) {
	fmt.Printf("%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

// up starts `netplane-lab run` in its own session, so the lab outlives
// this command (and the make that ran it), and waits for it to be ready.
func up(stateDir string, nodes, subnets int, api string) error {
	stateDir, _ = filepath.Abs(stateDir)
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		return err
	}
	logPath := filepath.Join(stateDir, "lab.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return err
	}
	self, _ := os.Executable()
	cmd := exec.Command(self, "run", "--state-dir="+stateDir, fmt.Sprintf("--nodes=%d", nodes), fmt.Sprintf("--subnets=%d", subnets), "--api="+api)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	// Kept open: a lab that fails removes its state directory, log and all,
	// and the log is still read through this descriptor.
	defer logFile.Close()
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	fmt.Printf("lab starting (pid %d, log %s)\n", cmd.Process.Pid, logPath)
	deadline := time.After(10 * time.Minute)
	for {
		if data, err := os.ReadFile(filepath.Join(stateDir, readyFile)); err == nil {
			fmt.Print(string(data))
			return nil
		}
		select {
		case err := <-exited:
			data, _ := io.ReadAll(io.NewSectionReader(logFile, 0, 1<<30))
			return fmt.Errorf("the lab stopped while starting (%v):\n%s", err, data)
		case <-deadline:
			return fmt.Errorf("the lab was not ready after 10 minutes; see %s", logPath)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// runLab is the lab's own process: it builds the lab, reports readiness,
// and tears everything down on SIGTERM (from `down`) or SIGINT.
func runLab(stateDir string, nodes, subnets int, api string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	l, err := lab.Start(ctx, lab.Config{Nodes: nodes, Subnets: subnets, StateDir: stateDir, APIListen: api, Log: logf})
	if err != nil {
		return err
	}
	readyErr := l.WaitReady(ctx, 3*time.Minute)
	msg := fmt.Sprintf("lab is up: %d nodes on %d subnets\n  export KUBECONFIG=%s\n  API server relay: %s\n", nodes, l.Subnets, l.Kubeconfig, l.APIAddress)
	table := "ip " + l.ServiceTable()
	if l.Config.IPv6() {
		table = "ip6 " + l.ServiceTable()
	}
	for _, n := range l.Nodes {
		msg += fmt.Sprintf("  %s (%s): nsenter --net=%s nft list table %s\n", n.Name, l.Config.PrimaryIP(n), n.NS.Path, table)
	}
	msg += fmt.Sprintf("  external client: nsenter --net=%s %s get http://%s/\n", l.External.Path, filepath.Join(stateDir, "bin", "testimage"),
		net.JoinHostPort(l.Config.PrimaryIP(l.Nodes[0]), "30080"))
	if readyErr != nil {
		msg += fmt.Sprintf("  NOT READY: %v\n", readyErr)
	}
	logf("%s", msg)
	if err := os.WriteFile(filepath.Join(stateDir, readyFile), []byte(msg), 0o644); err != nil {
		l.Close()
		return err
	}
	<-ctx.Done()
	logf("lab: stopping")
	return l.Close()
}

func execInPod(stateDir, namespace string, args []string) error {
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) < 2 {
		return errors.New("usage: netplane-lab exec [-n NAMESPACE] POD -- CMD [ARG]")
	}
	pod, argv := args[0], args[1:]
	if len(argv) > 0 && argv[0] == "--" {
		argv = argv[1:]
	}
	l, err := lab.Attach(stateDir)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := l.Exec(ctx, namespace, pod, argv...)
	fmt.Print(out)
	return err
}

// check deploys examples/ and runs every scenario, or those numbered in
// only, one line per check.
func check(stateDir, only string) error {
	l, err := lab.Attach(stateDir)
	if err != nil {
		return err
	}
	failed, ran := 0, 0
	for _, s := range scenario.All {
		if only != "" && !slices.Contains(strings.Split(only, ","), strings.Fields(s.Name)[0]) {
			continue
		}
		ran++
		if reason := scenario.Blocked[strings.Fields(s.Name)[0]]; reason != "" {
			fmt.Printf("skip  %-60s\n      blocked: %s\n", s.Name, reason)
			continue
		}
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		err := s.Run(ctx, l, func(format string, args ...any) { fmt.Printf("    "+format+"\n", args...) })
		cancel()
		var skipped scenario.Skipped
		if errors.As(err, &skipped) {
			fmt.Printf("skip  %-60s %6.1fs\n      skipped: %s\n", s.Name, time.Since(start).Seconds(), skipped.Why)
			continue
		}
		if err != nil {
			failed++
			fmt.Printf("FAIL  %-60s %6.1fs\n      %v\n", s.Name, time.Since(start).Seconds(), err)
			continue
		}
		fmt.Printf("ok    %-60s %6.1fs\n", s.Name, time.Since(start).Seconds())
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d scenarios failed", failed, ran)
	}
	return nil
}
