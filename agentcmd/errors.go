// SPDX-License-Identifier: Apache-2.0

package agentcmd

// UsageError is a bad flag, argument, environment variable or
// configuration: [Execute] returns [ExitUsage] for it. The root command of
// [NewRootCommand] returns it for bad flags (their parsing, a variable's
// value, an invalid configuration of the hive) and [UsageArgs] for bad
// arguments; an embedder's own commands return it for theirs. Match it
// with errors.As.
type UsageError struct{ Err error }

// Error returns the underlying error's message.
func (e UsageError) Error() string { return e.Err.Error() }

// Unwrap returns the underlying error.
func (e UsageError) Unwrap() error { return e.Err }
