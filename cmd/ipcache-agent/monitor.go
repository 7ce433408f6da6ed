// SPDX-License-Identifier: Apache-2.0

package main

import (
	"io"
	"strings"

	"github.com/cilium/hive/shell"
	"github.com/spf13/cobra"

	"github.com/ipcache-agent/ipcache-agent/cells"
	"github.com/ipcache-agent/ipcache-agent/monitorcell"
)

// newMonitorCommand is `monitor`: it runs the shell's monitor command on
// the agent's socket (root only, as the shell) and prints its events until
// interrupted. The filters are checked here first, so that a wrong value
// is an error naming its flag before the agent is asked.
func newMonitorCommand(stdout io.Writer) *cobra.Command {
	var typ, output, sockPath string
	cmd := &cobra.Command{
		Use:   monitorcell.Command,
		Short: "Stream the enforcement program's drop and verdict events and the DNS proxy's (as cilium-dbg monitor)",
		Long: "Streams one line per event until interrupted: --type drop (default), verdict\n" +
			"(allowed packets), dns (the DNS proxy's queries; no program needed) or all\n" +
			"(without a program, DNS events only); -o json prints one JSON object per line\n" +
			"(docs/CONTRACT.md \"Monitor events\"). The text names the policy and rule of\n" +
			"the entry that decided an allow by policy or a policy-deny drop.\n\n" +
			"Filters, as hubble observe's: a flag may be repeated (or take comma-separated\n" +
			"values) and matches any of its values; an event is shown when it matches every\n" +
			"flag given. Addresses take an address or a CIDR (IPv4 or IPv6). Without --type,\n" +
			"--verdict chooses the events (allow or an allow reason: verdict events).\n" +
			"Filters select what is shown only: the program still writes every event, and\n" +
			"lost events (datapath/events-lost, ipcache_agent_events_lost_total) count\n" +
			"them all. On DNS events --from-ip is the client, --to-ip the server, --verdict\n" +
			"drop matches refused and failed queries (refused, failed alone), allow\n" +
			"forwarded ones; a port, protocol or identity filter passes no DNS event.\n\n" +
			"  ipcache-agent monitor --to-ip 10.30.0.0/16 --verdict policy-deny\n" +
			"  ipcache-agent monitor --verdict allow --endpoint shop/web-1 --port 443",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if _, err := monitorcell.EventKinds(typ); err != nil {
				return err
			}
			if _, err := monitorcell.ParseFilter(cmd.Flags()); err != nil {
				return err
			}
			args := []string{monitorcell.Command, "-o", output}
			if cmd.Flags().Changed("type") {
				args = append(args, "--type="+typ)
			}
			args = append(args, monitorcell.FilterArgs(cmd.Flags())...)
			return cells.ShellExchange(sockPath, strings.Join(args, " "), stdout)
		},
	}
	cmd.Flags().StringVar(&typ, "type", "drop", "Events: drop, verdict, dns or all")
	cmd.Flags().StringVarP(&output, "output", "o", "text", "Output format: text or json")
	cmd.Flags().StringVar(&sockPath, shell.ShellSockPathName, cells.DefaultShellSockPath, "Path to the agent's shell socket")
	monitorcell.AddFilterFlags(cmd.Flags())
	return cmd
}
