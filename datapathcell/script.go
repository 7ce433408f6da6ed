// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"fmt"

	"github.com/cilium/hive"
	"github.com/cilium/hive/script"

	"github.com/ipcache-agent/ipcache-agent/internal/scriptcmd"
)

func scriptCommands(d *Datapath) hive.ScriptCmdsOut {
	return hive.NewScriptCmds(map[string]script.Cmd{
		"datapath/counters": script.Command(
			script.CmdUsage{
				Summary: "Show the enforcement program's allowed and dropped packets per direction",
				Detail: []string{
					"Counts IP packets on every --devices interface since the counters map",
					"was created (it is pinned: counts survive restarts). A direction that",
					"is not enforced counts everything as allowed. The program counts",
					"packets, not bytes.",
					"-o json: one object, {\"ingress\": {\"allowed\": n, \"dropped\": n},",
					"\"egress\": {...}}.",
				},
				Flags: scriptcmd.OutputFlag,
			},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				if len(args) != 0 {
					return nil, script.ErrUsage
				}
				asJSON, err := scriptcmd.JSONOutput(s)
				if err != nil {
					return scriptcmd.Result("", err)
				}
				c, err := d.Counters()
				if err != nil {
					return scriptcmd.Result("", err)
				}
				if asJSON {
					return scriptcmd.JSON(map[string]verdictCountsJSON{
						"ingress": {Allowed: c.IngressAllowed, Dropped: c.IngressDropped},
						"egress":  {Allowed: c.EgressAllowed, Dropped: c.EgressDropped},
					}, nil)
				}
				out := fmt.Sprintf("Direction  Allowed  Dropped\ningress    %d  %d\negress     %d  %d\n",
					c.IngressAllowed, c.IngressDropped, c.EgressAllowed, c.EgressDropped)
				return scriptcmd.Result(out, nil)
			}),
	})
}

// verdictCountsJSON is a direction's packets in datapath/counters -o json.
type verdictCountsJSON struct {
	Allowed uint64 `json:"allowed"`
	Dropped uint64 `json:"dropped"`
}
