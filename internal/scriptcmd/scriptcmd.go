// SPDX-License-Identifier: Apache-2.0

// Package scriptcmd holds what the project's script (shell) commands share.
package scriptcmd

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/cilium/hive/script"
	"github.com/spf13/pflag"
)

// Result returns a command's output and error the way the shell and script
// tests see them: out on stdout, and err both as the command's error and
// on stderr. (An error returned directly from a command does not reach
// stderr, so neither a shell user nor a script's `stderr` could read it.)
//
// Possible errors: none; err is returned by the WaitFunc.
func Result(out string, err error) (script.WaitFunc, error) {
	return func(*script.State) (string, string, error) {
		if err != nil {
			return out, err.Error() + "\n", err
		}
		return out, "", nil
	}, nil
}

// OutputFlag adds -o/--output (text or json, text by default) to a
// command's flags.
func OutputFlag(fs *pflag.FlagSet) {
	fs.StringP("output", "o", "text", "Output format: text or json")
}

// JSONOutput returns whether the command was asked for -o json.
//
// Possible errors: ErrOutputFormat when -o is neither text nor json.
func JSONOutput(s *script.State) (bool, error) {
	format, err := s.Flags.GetString("output")
	if err != nil {
		return false, err
	}
	switch format {
	case "text":
		return false, nil
	case "json":
		return true, nil
	}
	return false, fmt.Errorf("-o %s: %w", format, ErrOutputFormat)
}

// ErrOutputFormat is returned for an -o that is neither text nor json.
var ErrOutputFormat = errors.New("want text or json")

// JSON returns v as one indented JSON document on stdout, and err as
// [Result] does.
//
// Possible errors: none; a value that cannot be marshalled is a bug and
// is returned by the WaitFunc.
func JSON(v any, err error) (script.WaitFunc, error) {
	out, merr := json.MarshalIndent(v, "", "  ")
	if merr != nil {
		return Result("", merr)
	}
	return Result(string(out)+"\n", err)
}

// Show returns a command that takes no arguments, only -o (added to
// usage's flags), and runs show with whether -o json was asked for.
// Usage errors (an argument, an -o that is neither text nor json) are
// the command's, as [Result] returns them.
func Show(usage script.CmdUsage, show func(s *script.State, asJSON bool) (script.WaitFunc, error)) script.Cmd {
	usage.Flags = OutputFlag
	return script.Command(usage, func(s *script.State, args ...string) (script.WaitFunc, error) {
		if len(args) != 0 {
			return nil, script.ErrUsage
		}
		asJSON, err := JSONOutput(s)
		if err != nil {
			return Result("", err)
		}
		return show(s, asJSON)
	})
}
