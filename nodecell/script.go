// SPDX-License-Identifier: Apache-2.0

package nodecell

import (
	"fmt"
	"net/netip"
	"strings"
	"text/tabwriter"

	"github.com/cilium/hive"
	"github.com/cilium/hive/script"

	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/internal/scriptcmd"
)

// AddressesCommand lists the host and remote-node addresses.
const AddressesCommand = "node/addresses"

// addressJSON is an address in node/addresses -o json.
type addressJSON struct {
	Address netip.Addr      `json:"address"`
	Entity  identity.Entity `json:"entity"`
	Nodes   []string        `json:"nodes"`
}

func scriptCommands(n *Nodes) hive.ScriptCmdsOut {
	return hive.NewScriptCmds(map[string]script.Cmd{
		AddressesCommand: scriptcmd.Show(
			script.CmdUsage{
				Summary: "List the addresses of this node (host) and of other nodes (remote-node)",
				Detail: []string{
					"Each address with its entity and the Node documents that list it",
					"(none for an address only a link of this node has).",
					"-o json: an array of objects with address, entity and nodes.",
				},
			},
			func(s *script.State, asJSON bool) (script.WaitFunc, error) {
				addrs := n.Addresses()
				if asJSON {
					out := make([]addressJSON, 0, len(addrs))
					for _, a := range addrs {
						nodes := a.Nodes
						if nodes == nil {
							nodes = []string{}
						}
						out = append(out, addressJSON{Address: a.Addr, Entity: a.Entity, Nodes: nodes})
					}
					return scriptcmd.JSON(out, nil)
				}
				var b strings.Builder
				w := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
				fmt.Fprintln(w, "ADDRESS\tENTITY\tNODES")
				for _, a := range addrs {
					nodes := strings.Join(a.Nodes, ",")
					if nodes == "" {
						nodes = "-"
					}
					fmt.Fprintf(w, "%s\t%s\t%s\n", a.Addr, a.Entity, nodes)
				}
				w.Flush()
				return scriptcmd.Result(b.String(), nil)
			}),
	})
}
