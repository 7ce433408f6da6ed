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
					"is not enforced counts everything as allowed.",
				},
			},
			func(s *script.State, args ...string) (script.WaitFunc, error) {
				c, err := d.Counters()
				if err != nil {
					return scriptcmd.Result("", err)
				}
				out := fmt.Sprintf("Direction  Allowed  Dropped\ningress    %d  %d\negress     %d  %d\n",
					c.IngressAllowed, c.IngressDropped, c.EgressAllowed, c.EgressDropped)
				return scriptcmd.Result(out, nil)
			}),
	})
}
