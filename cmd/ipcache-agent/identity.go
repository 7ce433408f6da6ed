// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"io"
	"strconv"

	"github.com/ipcache-agent/ipcache-agent/agentcmd"
	"github.com/spf13/cobra"
)

// newIdentityCommand is `identity list|get N`: the shell's identity/list
// and identity/get, run on the agent's socket (root only, as the shell).
func newIdentityCommand(stdout io.Writer) *cobra.Command {
	return newListGetCommand(stdout, listGet{
		noun:      "identity",
		short:     "Show the running agent's identities, their labels and users",
		listShort: "List the reserved identities and the allocated ones (local and label) with their references and users",
		listCmd:   "identity/list",
		getUse:    "get N",
		getShort:  "Show identity N: labels, references, whether withheld, its users",
		getCmd:    "identity/get",
		validate: func(arg string) error {
			if _, err := strconv.ParseUint(arg, 10, 32); err != nil {
				return agentcmd.UsageError{Err: fmt.Errorf("identity %q: want a number", arg)}
			}
			return nil
		},
	})
}
