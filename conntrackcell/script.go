// SPDX-License-Identifier: Apache-2.0

package conntrackcell

import (
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/script"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/internal/scriptcmd"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

func scriptCommands(t *Tracker) hive.ScriptCmdsOut {
	return hive.NewScriptCmds(map[string]script.Cmd{
		"conntrack/list":  listCommand(t),
		"conntrack/flush": flushCommand(t),
	})
}

// conntrackJSON is an entry of conntrack/list -o json.
type conntrackJSON struct {
	Protocol string `json:"protocol"`
	Endpoint string `json:"endpoint"`
	Remote   string `json:"remote"`
	// Origin is the direction that opened the connection, from the
	// endpoint's side: egress (it connected out) or ingress.
	Origin string `json:"origin"`
	// State is TCP's (opening, established, closing); "" for others.
	State     string `json:"state,omitempty"`
	ReplySeen bool   `json:"replySeen"`
	// Map is where the entry is: conntrack (established) or ct_opening.
	Map string `json:"map"`
	// Device is the ifindex of the device the connection is on.
	Device uint32 `json:"device"`
	// Revoked: policy dropped its forward packet since it last allowed
	// one; its packets the other way are no replies.
	Revoked bool `json:"revoked,omitempty"`
	// ExpiresIn is the time left in seconds, negative when expired and
	// not yet collected.
	ExpiresIn float64 `json:"expiresIn"`
}

// tcpState names an entry's TCP state as the program decides its timeout.
func tcpState(flags uint8) string {
	switch {
	case flags&bpfmaps.ConntrackRST != 0, flags&(bpfmaps.ConntrackFINOrigin|bpfmaps.ConntrackFINReply) == bpfmaps.ConntrackFINOrigin|bpfmaps.ConntrackFINReply:
		return "closing"
	case flags&bpfmaps.ConntrackEstablished != 0:
		return "established"
	}
	return "opening"
}

func listCommand(t *Tracker) script.Cmd {
	return scriptcmd.Show(
		script.CmdUsage{
			Summary: "List the tracked connections of the enforcement program",
			Detail: []string{
				"One line per conntrack map entry: protocol, endpoint and remote",
				"address (port, or echo identifier for ICMP), the direction that",
				"opened it, TCP state, whether a reply passed, and time left.",
				"Expired entries show a negative time left until collected.",
			},
		},
		func(s *script.State, asJSON bool) (script.WaitFunc, error) {
			entries, now, err := t.List()
			if err != nil {
				return scriptcmd.Result("", err)
			}
			rows := make([]conntrackJSON, 0, len(entries))
			for _, e := range entries {
				row := conntrackJSON{
					Protocol: policy.Protocol(e.Protocol).PacketString(), Endpoint: e.Endpoint.String(), Remote: e.Remote.String(),
					Origin: policy.Direction(e.Origin).String(), ReplySeen: e.Flags&bpfmaps.ConntrackReplySeen != 0,
					ExpiresIn: (e.Expires - now).Round(time.Millisecond).Seconds(),
					Map:       bpfmaps.ConntrackName, Device: e.Ifindex, Revoked: e.Flags&bpfmaps.ConntrackRevoked != 0,
				}
				if e.Opening {
					row.Map = bpfmaps.ConntrackOpeningName
				}
				if e.Protocol == 1 || e.Protocol == 58 {
					row.Endpoint = fmt.Sprintf("%s id %d", e.Endpoint.Addr(), e.Endpoint.Port())
					row.Remote = e.Remote.Addr().String()
				}
				if e.Protocol == 6 {
					row.State = tcpState(e.Flags)
				}
				rows = append(rows, row)
			}
			slices.SortFunc(rows, func(a, b conntrackJSON) int {
				return strings.Compare(a.Protocol+a.Endpoint+a.Remote, b.Protocol+b.Endpoint+b.Remote)
			})
			if asJSON {
				return scriptcmd.JSON(rows, nil)
			}
			var out strings.Builder
			w := tabwriter.NewWriter(&out, 0, 4, 2, ' ', 0)
			fmt.Fprintf(w, "Protocol\tEndpoint\tRemote\tOrigin\tState\tReply\tExpires in\tMap\tDevice\n")
			for _, r := range rows {
				state := r.State
				if state == "" {
					state = "-"
				}
				if r.Revoked {
					state += " (revoked)"
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%t\t%.0fs\t%s\t%d\n",
					r.Protocol, r.Endpoint, r.Remote, r.Origin, state, r.ReplySeen, r.ExpiresIn, r.Map, r.Device)
			}
			w.Flush()
			return scriptcmd.Result(out.String(), nil)
		},
	)
}

func flushCommand(t *Tracker) script.Cmd {
	return script.Command(
		script.CmdUsage{
			Summary: "Delete every tracked connection",
			Detail: []string{
				"Replies of the flushed connections are then decided by their",
				"direction's policy until the connection's next forward packet",
				"that policy allows tracks it again.",
			},
		},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) != 0 {
				return nil, script.ErrUsage
			}
			n, err := t.Flush()
			return scriptcmd.Result(fmt.Sprintf("Flushed %d entries\n", n), err)
		},
	)
}
