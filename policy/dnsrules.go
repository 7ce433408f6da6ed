// SPDX-License-Identifier: Apache-2.0

package policy

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"

	"github.com/ipcache-agent/ipcache-agent/fqdn"
	"github.com/ipcache-agent/ipcache-agent/identity"
)

// DNSRulesTableName is the table of the names each subject's DNS rules
// allow.
const DNSRulesTableName = "dns-rules"

// DNSRules is a row of the `dns-rules` table: the DNS names a subject's
// DNS rules allow, for the DNS proxy, which forwards a query of one of
// the subject's endpoints when one of Names matches its name and refuses
// it otherwise. Names come from the DNS rules (FQDNRule.DNS) of every
// egress rule of the policies in force that apply to the subject; a
// subject without DNS rules has no row. The selector job writes the rows
// in the transactions that write the `policy` table, so a row and the
// dns-proxy entries that steer the subject's DNS to the proxy come from
// the same policies.
//
// Subject is the local endpoint identity, 0 the host-wide default's, as
// in the `policy` table.
type DNSRules struct {
	Subject identity.Number `json:"subject,omitempty" yaml:"subject,omitempty"`
	// Names are the distinct selectors, in canonical form (the name or
	// pattern as fqdn.Selector.String has it), sorted by that form, a
	// matchName before a matchPattern of the same text. Immutable.
	Names []fqdn.Selector `json:"names" yaml:"names"`
	// Policies are the names of the policies the names come from, sorted.
	// Immutable.
	Policies []string `json:"policies" yaml:"policies"`
}

// TableHeader implements statedb.TableWritable.
func (*DNSRules) TableHeader() []string {
	return []string{"Subject", "Names", "Policies"}
}

// TableRow implements statedb.TableWritable. A pattern is its text, as a
// name is: the matcher treats a pattern without "*" as that name.
func (r *DNSRules) TableRow() []string {
	names := make([]string, len(r.Names))
	for i, n := range r.Names {
		names[i] = n.String()
	}
	return []string{r.Subject.String(), strings.Join(names, ","), strings.Join(r.Policies, ",")}
}

// Same reports whether two rows say the same.
func (r *DNSRules) Same(other *DNSRules) bool {
	return r.Subject == other.Subject && slices.Equal(r.Names, other.Names) && slices.Equal(r.Policies, other.Policies)
}

// CanonicalDNSNames returns the distinct selectors of names in canonical
// form, sorted as [DNSRules] has them.
func CanonicalDNSNames(names []fqdn.Selector) []fqdn.Selector {
	out := make([]fqdn.Selector, len(names))
	for i, n := range names {
		if n.MatchName != "" {
			out[i] = fqdn.Selector{MatchName: n.String()}
		} else {
			out[i] = fqdn.Selector{MatchPattern: n.String()}
		}
	}
	slices.SortFunc(out, func(a, b fqdn.Selector) int {
		if c := strings.Compare(a.String(), b.String()); c != 0 {
			return c
		}
		return -cmp.Compare(a.MatchName, b.MatchName) // the name first
	})
	return slices.Compact(out)
}

func dnsRulesKey(subject identity.Number) index.Key {
	return binary.BigEndian.AppendUint32(nil, uint32(subject))
}

// DNSRulesIndex is the primary index of `dns-rules`: the subject. From a
// string: the subject's number ("0" is the host-wide default's).
var DNSRulesIndex = statedb.Index[*DNSRules, identity.Number]{
	Name: "subject",
	FromObject: func(r *DNSRules) index.KeySet {
		return index.NewKeySet(dnsRulesKey(r.Subject))
	},
	FromKey: dnsRulesKey,
	FromString: func(s string) (index.Key, error) {
		n, err := strconv.ParseUint(s, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("parse dns-rules key %q: want a subject identity: %w", s, err)
		}
		return dnsRulesKey(identity.Number(n)), nil
	},
	Unique: true,
}

// NewDNSRulesTable creates and registers the `dns-rules` table. Only the
// selector job writes it.
func NewDNSRulesTable(db *statedb.DB) (statedb.RWTable[*DNSRules], error) {
	return statedb.NewTable(db, DNSRulesTableName, DNSRulesIndex)
}

var _ statedb.TableWritable = &DNSRules{}

// FQDNEnforcer is provided (as *FQDNEnforcer) by the cell that enforces
// toFQDNs and DNS rules: the DNS proxy, which learns the addresses of the
// names (and gives them identities labelled fqdn.Selector.Label) and
// applies the DNS rules (the `dns-rules` table and the dns-proxy
// entries). In a hive without it, the policy cell rejects policy files
// with toFQDNs or DNS rules, which would allow nothing or filter nothing
// there.
type FQDNEnforcer struct {
	// Name names the enforcer, for the log.
	Name string
}
