package config

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
)

// The flags of `netplane --role=node --cleanup`. They ask for an action of
// one run, not a setting, so no key of the configuration file holds them;
// NETPLANE_CLEANUP and NETPLANE_CLEANUP_KEEP_IPAM set them as every other
// flag's variable does.
const (
	CleanupFlag         = "cleanup"
	CleanupKeepIPAMFlag = "cleanup-keep-ipam"
)

// Cleanup is what the cleanup flags ask.
type Cleanup struct {
	Run      bool // remove what the node role made, and exit
	KeepIPAM bool // but keep the CNI plugin's IPAM store
}

// CleanupOf reads the cleanup flags of the parsed fs (registered with
// AddFlags), each from the command line, else from its variable.
func CleanupOf(fs *pflag.FlagSet) (Cleanup, error) {
	var c Cleanup
	var err error
	if c.Run, err = boolOf(fs, CleanupFlag); err != nil {
		return c, err
	}
	if c.KeepIPAM, err = boolOf(fs, CleanupKeepIPAMFlag); err != nil {
		return c, err
	}
	if c.KeepIPAM && !c.Run {
		return c, errors.New("--cleanup-keep-ipam applies only with --cleanup")
	}
	return c, nil
}

func boolOf(fs *pflag.FlagSet, name string) (bool, error) {
	if env, ok := os.LookupEnv(EnvName(name)); ok && !fs.Changed(name) {
		b, err := strconv.ParseBool(strings.TrimSpace(env))
		if err != nil {
			return false, fmt.Errorf("%s=%q is neither true nor false", EnvName(name), env)
		}
		return b, nil
	}
	return fs.GetBool(name)
}
