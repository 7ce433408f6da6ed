// SPDX-License-Identifier: Apache-2.0

package ipcachecell

import (
	"fmt"
	"iter"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/cilium/hive/script"
	"github.com/cilium/statedb"

	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/internal/scriptcmd"
	"github.com/ipcache-agent/ipcache-agent/labels"
)

// identityJSON is identity/show -o json.
type identityJSON struct {
	Identity   identity.Number `json:"identity"`
	Kind       string          `json:"kind"`
	Labels     []string        `json:"labels"`
	References uint64          `json:"references"`
	// Prefixes are the ipcache prefixes that resolved to the identity.
	Prefixes []identityPrefixJSON `json:"prefixes"`
	// Owners are the resources with metadata for those prefixes.
	Owners []string `json:"owners"`
}

type identityPrefixJSON struct {
	Prefix string      `json:"prefix"`
	Source string      `json:"source"`
	Owners []ownerJSON `json:"owners"`
}

// ownerJSON is a resource's metadata for a prefix.
type ownerJSON struct {
	Resource string   `json:"resource"`
	Source   string   `json:"source"`
	Labels   []string `json:"labels"`
	// RequestedIdentity and ExplicitIdentity are 0 when unset.
	RequestedIdentity identity.Number `json:"requestedIdentity"`
	ExplicitIdentity  identity.Number `json:"explicitIdentity"`
}

// lookupJSON is ipcache/lookup -o json.
type lookupJSON struct {
	Prefix   string          `json:"prefix"`
	Identity identity.Number `json:"identity"`
	Source   string          `json:"source"`
	// Labels are the identity's; empty for an explicit identity, which is
	// not in the identities table.
	Labels   []string    `json:"labels"`
	Explicit bool        `json:"explicit"`
	Owners   []ownerJSON `json:"owners"`
}

func labelList(l labels.Labels) []string {
	out := []string{}
	for label := range l.All() {
		out = append(out, label)
	}
	return out
}

func ownersJSON(txn statedb.ReadTxn, metadata statedb.Table[*PrefixMetadata], prefix netip.Prefix) []ownerJSON {
	out := []ownerJSON{}
	for _, row := range appendPrefixRows(nil, txn, metadata, prefix) {
		out = append(out, ownerJSON{
			Resource: row.Resource(), Source: row.Source().String(), Labels: labelList(row.rowLabels()),
			RequestedIdentity: row.requested, ExplicitIdentity: row.explicit,
		})
	}
	return out
}

// appendPrefixRows appends the rows of a prefix to rows, in resource name
// order. The table keeps them in the order of the resources' ids (see
// metadataKey), which is the order in which the resources got their first
// handle: the shell shows a prefix's owners in one order whatever that
// was.
func appendPrefixRows(rows []*PrefixMetadata, txn statedb.ReadTxn, metadata statedb.Table[*PrefixMetadata],
	prefix netip.Prefix) []*PrefixMetadata {
	start := len(rows)
	for row := range metadata.Prefix(txn, MetadataIndex.Query(prefix)) {
		rows = append(rows, row)
	}
	slices.SortFunc(rows[start:], func(a, b *PrefixMetadata) int { return strings.Compare(a.Resource(), b.Resource()) })
	return rows
}

// identityJSON returns what -o json shows of an identity.
func (o identityOwners) identityJSON(txn statedb.ReadTxn, ident *identitycell.Identity) identityJSON {
	out := identityJSON{
		Identity: ident.ID, Kind: identitycell.Kind(ident.ID), Labels: labelList(ident.Labels), References: uint64(ident.References()),
		Prefixes: []identityPrefixJSON{}, Owners: []string{},
	}
	seen := map[string]bool{}
	for entry := range o.entriesOf(txn, ident) {
		owners := ownersJSON(txn, o.metadata, entry.Prefix())
		out.Prefixes = append(out.Prefixes, identityPrefixJSON{Prefix: entry.Prefix().String(), Source: entry.Source.String(), Owners: owners})
		for _, owner := range owners {
			if !seen[owner.Resource] {
				seen[owner.Resource] = true
				out.Owners = append(out.Owners, owner.Resource)
			}
		}
	}
	return out
}

func newScriptCommands(db *statedb.DB, metadata statedb.Table[*PrefixMetadata], entries statedb.Table[*Entry],
	identities statedb.Table[*identitycell.Identity]) map[string]script.Cmd {
	owners := identityOwners{db, metadata, entries, identities}
	return map[string]script.Cmd{
		"ipcache/lookup": lookupCommand(db, metadata, entries, identities),
		"identity/show":  owners.showCommand(),
	}
}

// identityOwners joins the identities with the ipcache: which prefixes map
// to an identity, and which resources own those prefixes.
type identityOwners struct {
	db         *statedb.DB
	metadata   statedb.Table[*PrefixMetadata]
	entries    statedb.Table[*Entry]
	identities statedb.Table[*identitycell.Identity]
}

// entriesOf returns the entries that map to a local identity. Every entry
// holding a local identity has its own prefix's cidr label in the
// identity's labels, so looking up those prefixes finds them all: no index
// by identity (which would cost a million index entries) is needed.
func (o identityOwners) entriesOf(txn statedb.ReadTxn, ident *identitycell.Identity) iter.Seq[*Entry] {
	return func(yield func(*Entry) bool) {
		for prefix := range ident.Labels.Prefixes() {
			entry, _, found := o.entries.Get(txn, EntryIndex.Query(prefix))
			if found && !entry.Explicit && entry.Identity == ident.ID && !yield(entry) {
				return
			}
		}
	}
}

func (o identityOwners) showCommand() script.Cmd {
	return script.Command(
		script.CmdUsage{
			Summary: "Show an identity: kind, labels, references, prefixes and their owners",
			Args:    "identity",
			Detail: []string{
				"A reserved identity (1 to 8) shows with its",
				"reserved:<entity> label, kind reserved and no prefixes.",
				"-o json: one object (identity, kind, labels, references,",
				"prefixes with their source and owners, owners). Fails if",
				"the identity is neither reserved nor allocated; 0 is no",
				"identity.",
			},
			Flags: scriptcmd.OutputFlag,
		},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) != 1 {
				return nil, script.ErrUsage
			}
			asJSON, err := scriptcmd.JSONOutput(s)
			if err != nil {
				return scriptcmd.Result("", err)
			}
			n, err := strconv.ParseUint(args[0], 10, 32)
			if err != nil {
				return scriptcmd.Result("", fmt.Errorf("parse identity %q: %w", args[0], err))
			}
			id := identity.Number(n)
			if id == identity.Unknown {
				return scriptcmd.Result("", identitycell.ErrNoIdentity)
			}
			txn := o.db.ReadTxn()
			ident, _, found := o.identities.Get(txn, identitycell.IdentityIndex.Query(id))
			if reserved, ok := identitycell.ReservedIdentity(id); ok {
				ident, found = reserved, true
			}
			if !found || !ident.Allocated() && !ident.Reserved() {
				return scriptcmd.Result("", fmt.Errorf("identity %d is not allocated", id))
			}
			if asJSON {
				return scriptcmd.JSON(o.identityJSON(txn, ident), nil)
			}
			var out strings.Builder
			w := tabwriter.NewWriter(&out, 0, 4, 2, ' ', 0)
			references := strconv.FormatUint(uint64(ident.References()), 10)
			if ident.Reserved() {
				references = "-"
			}
			fmt.Fprintf(w, "Identity:\t%s\nKind:\t%s\nLabels:\t%s\nReferences:\t%s\nPrefixes:\n",
				ident.ID, identitycell.Kind(ident.ID), ident.Labels, references)
			for entry := range o.entriesOf(txn, ident) {
				fmt.Fprintf(w, "  %s\t%s\n", entry.Prefix(), entry.Source)
				for _, row := range appendPrefixRows(nil, txn, o.metadata, entry.Prefix()) {
					fmt.Fprintf(w, "    owner %s\t%s\n", row.Resource(), row.Source())
				}
			}
			w.Flush()
			return scriptcmd.Result(out.String(), nil)
		})
}

// lookupCommand shows the entry of the longest prefix that contains an
// address, and every resource that owns metadata for it.
func lookupCommand(db *statedb.DB, metadata statedb.Table[*PrefixMetadata], entries statedb.Table[*Entry],
	identities statedb.Table[*identitycell.Identity]) script.Cmd {
	return script.Command(
		script.CmdUsage{
			Summary: "Look up the ipcache entry of an address (longest prefix match) and its owners",
			Args:    "address",
			Detail: []string{
				"Prints the matching prefix, its identity, labels and source, and each",
				"resource with metadata for the prefix. Fails if no entry matches: the",
				"datapath then sees the address as world (identity 2).",
				"-o json: one object (prefix, identity, source, labels, explicit,",
				"owners with resource, source, labels, requestedIdentity and",
				"explicitIdentity, 0 when unset).",
			},
			Flags: scriptcmd.OutputFlag,
		},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) != 1 {
				return nil, script.ErrUsage
			}
			asJSON, err := scriptcmd.JSONOutput(s)
			if err != nil {
				return scriptcmd.Result("", err)
			}
			addr, err := netip.ParseAddr(args[0])
			if err != nil {
				return scriptcmd.Result("", fmt.Errorf("parse address %q: %w", args[0], err))
			}
			txn := db.ReadTxn()
			entry, found := LookupAddress(txn, entries, addr)
			if !found {
				return scriptcmd.Result("", fmt.Errorf("no ipcache entry contains %s (identity world)", addr))
			}
			// An explicit identity is not in the table: no labels shown.
			var lbls string
			if ident, _, found := identities.Get(txn, identitycell.IdentityIndex.Query(entry.Identity)); found && !entry.Explicit {
				lbls = ident.Labels.String()
			}
			if asJSON {
				out := lookupJSON{Prefix: entry.Prefix().String(), Identity: entry.Identity, Source: entry.Source.String(),
					Labels: []string{}, Explicit: entry.Explicit, Owners: ownersJSON(txn, metadata, entry.Prefix())}
				if ident, _, found := identities.Get(txn, identitycell.IdentityIndex.Query(entry.Identity)); found && !entry.Explicit {
					out.Labels = labelList(ident.Labels)
				}
				return scriptcmd.JSON(out, nil)
			}
			var out strings.Builder
			w := tabwriter.NewWriter(&out, 0, 4, 2, ' ', 0)
			fmt.Fprintf(w, "Prefix:\t%s\nIdentity:\t%s\nSource:\t%s\nLabels:\t%s\nExplicit:\t%t\nOwners:\n",
				entry.Prefix(), entry.Identity, entry.Source, lbls, entry.Explicit)
			for _, row := range appendPrefixRows(nil, txn, metadata, entry.Prefix()) {
				fmt.Fprintf(w, "  %s\t%s\t%s\t%s\t%s\n", row.Resource(), row.Source(), row.rowLabels(),
					optionalIdentity(row.requested), optionalIdentity(row.explicit))
			}
			w.Flush()
			return scriptcmd.Result(out.String(), nil)
		},
	)
}
