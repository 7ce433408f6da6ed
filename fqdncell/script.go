// SPDX-License-Identifier: Apache-2.0

package fqdncell

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/script"

	"github.com/ipcache-agent/ipcache-agent/internal/scriptcmd"
)

func scriptCommands(n *Names) hive.ScriptCmdsOut {
	return hive.NewScriptCmds(map[string]script.Cmd{
		"fqdn/cache-list": cacheListCommand(n),
	})
}

func cacheListCommand(n *Names) script.Cmd {
	return scriptcmd.Show(
		script.CmdUsage{
			Summary: "List the names learned from DNS and their addresses",
			Detail: []string{
				"One line per name and address: when it expires (deferred: expired and kept while a connection uses it), the identity the address maps to in the ipcache (0 when no toFQDNs selector selects the name), and the endpoint that last resolved the name.",
			},
		},
		func(s *script.State, asJSON bool) (script.WaitFunc, error) {
			entries := n.Entries()
			if asJSON {
				return scriptcmd.JSON(entries, nil)
			}
			if len(entries) == 0 {
				return scriptcmd.Result("No names learned\n", nil)
			}
			var out strings.Builder
			w := tabwriter.NewWriter(&out, 0, 4, 2, ' ', 0)
			fmt.Fprintf(w, "Name\tAddress\tExpires\tIdentity\tEndpoint\n")
			for _, e := range entries {
				expires := e.Expires.Format(time.RFC3339)
				if e.Deferred {
					expires += " (deferred)"
				}
				ep := e.Endpoint
				if ep == "" {
					ep = "-"
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\n", e.Name, e.Address, expires, e.Identity, ep)
			}
			w.Flush()
			return scriptcmd.Result(out.String(), nil)
		},
	)
}
