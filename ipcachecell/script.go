package ipcachecell

import (
	"fmt"
	"net/netip"
	"strings"
	"text/tabwriter"

	"github.com/cilium/hive/script"
	"github.com/cilium/statedb"

	"github.com/ipcache-agent/ipcache-agent/internal/scriptcmd"
)

func newScriptCommands(db *statedb.DB, metadata statedb.Table[*PrefixMetadata], entries statedb.Table[*Entry]) map[string]script.Cmd {
	return map[string]script.Cmd{
		"ipcache/lookup": lookupCommand(db, metadata, entries),
	}
}

// lookupCommand shows the entry of the longest prefix that contains an
// address, and every resource that owns metadata for it.
func lookupCommand(db *statedb.DB, metadata statedb.Table[*PrefixMetadata], entries statedb.Table[*Entry]) script.Cmd {
	return script.Command(
		script.CmdUsage{
			Summary: "Look up the ipcache entry of an address (longest prefix match) and its owners",
			Args:    "address",
			Detail: []string{
				"Prints the matching prefix, its identity, labels and source, and each",
				"resource with metadata for the prefix. Fails if no entry matches: the",
				"datapath then sees the address as world (identity 2).",
			},
		},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) != 1 {
				return nil, script.ErrUsage
			}
			addr, err := netip.ParseAddr(args[0])
			if err != nil {
				return scriptcmd.Result("", fmt.Errorf("address %q: %w", args[0], err))
			}
			txn := db.ReadTxn()
			entry, found := LookupAddress(txn, entries, addr)
			if !found {
				return scriptcmd.Result("", fmt.Errorf("no ipcache entry contains %s (identity world)", addr))
			}
			var out strings.Builder
			w := tabwriter.NewWriter(&out, 0, 4, 2, ' ', 0)
			fmt.Fprintf(w, "Prefix:\t%s\nIdentity:\t%s\nSource:\t%s\nLabels:\t%s\nExplicit:\t%t\nOwners:\n",
				entry.Prefix, entry.Identity, entry.Source, entry.Labels, entry.Explicit)
			for row := range metadata.Prefix(txn, MetadataIndex.Query(entry.Prefix)) {
				fmt.Fprintf(w, "  %s\t%s\t%s\t%s\t%s\n", row.Resource, row.Source, row.Labels,
					optionalIdentity(row.RequestedIdentity), optionalIdentity(row.ExplicitIdentity))
			}
			w.Flush()
			return scriptcmd.Result(out.String(), nil)
		},
	)
}
