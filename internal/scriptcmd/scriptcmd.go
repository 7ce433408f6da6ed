// SPDX-License-Identifier: Apache-2.0

// Package scriptcmd holds what the project's script (shell) commands share.
package scriptcmd

import "github.com/cilium/hive/script"

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
