// SPDX-License-Identifier: Apache-2.0

package agentcmd

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/pflag"

	"github.com/ipcache-agent/ipcache-agent/cells"
)

// envName is the environment variable that sets the flag of that name:
// cells.EnvPrefix and the name in upper case with dashes as underscores,
// e.g. IPCACHE_AGENT_STATE_DIR for --state-dir.
func envName(flag string) string {
	return cells.EnvPrefix + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// setFromEnvironment sets every flag not given on the command line from its
// environment variable (see envName). The value goes through the flag's
// own parsing, so that a bad one is rejected as the flag would reject it,
// and flags that are not the hive's (logging, subcommands) get it too.
//
// Possible errors: a variable's value is not valid for its flag.
func setFromEnvironment(flags *pflag.FlagSet) error {
	var errs []error
	flags.VisitAll(func(f *pflag.Flag) {
		if f.Changed || f.Name == "help" {
			return
		}
		name := envName(f.Name)
		value, ok := os.LookupEnv(name)
		if !ok {
			return
		}
		if err := flags.Set(f.Name, value); err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: invalid value for --%s: %w", name, value, f.Name, err))
		}
	})
	return errors.Join(errs...)
}
