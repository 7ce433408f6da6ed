// SPDX-License-Identifier: Apache-2.0

package agentcmd

import (
	"errors"
	"fmt"
	"os"
	"slices"
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

// envFlags are the flags set from the environment: the variable and its
// value, by flag name.
type envFlags map[string]string

// name returns err with the variables of the flags it names ("--name",
// as the cells' configuration errors begin) in front, as a bad value of
// the flag's own parsing is named (setFromEnvironment): a value that
// parses but that the cell's validation refuses, e.g.
// IPCACHE_AGENT_ENABLE_POLICY="sometimes": --enable-policy "sometimes":
// want default, always or never. An error that names none is returned
// as it is.
func (e envFlags) name(err error) error {
	var named []string
	for flag, setting := range e {
		if mentionsFlag(err.Error(), flag) {
			named = append(named, setting)
		}
	}
	if len(named) == 0 {
		return err
	}
	slices.Sort(named)
	return fmt.Errorf("%s: %w", strings.Join(named, ", "), err)
}

// mentionsFlag reports whether msg names --flag, and not only a longer
// flag that begins with its name (--policy-dir is not --policy-dir-x).
func mentionsFlag(msg, flag string) bool {
	word := "--" + flag
	for i := strings.Index(msg, word); i >= 0; {
		end := i + len(word)
		if end == len(msg) || !isFlagNameByte(msg[end]) {
			return true
		}
		next := strings.Index(msg[end:], word)
		if next < 0 {
			return false
		}
		i = end + next
	}
	return false
}

func isFlagNameByte(c byte) bool {
	return c == '-' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
}

// setFromEnvironment sets every flag not given on the command line from its
// environment variable (see envName) and returns those it set. The value
// goes through the flag's own parsing, so that a bad one is rejected as the
// flag would reject it, and flags that are not the hive's (logging,
// subcommands) get it too.
//
// Possible errors: a variable's value is not valid for its flag.
func setFromEnvironment(flags *pflag.FlagSet) (envFlags, error) {
	set := envFlags{}
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
			return
		}
		set[f.Name] = fmt.Sprintf("%s=%q", name, value)
	})
	return set, errors.Join(errs...)
}
