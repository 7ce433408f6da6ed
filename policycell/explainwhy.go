// SPDX-License-Identifier: Apache-2.0

package policycell

import (
	"strings"

	"github.com/cilium/statedb"

	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

// explainReason is why policy/explain's desired verdict is what it is, in
// its JSON, for scripts that would otherwise parse the text. Each is one
// of the ways the program decides (docs/CONTRACT.md, "Policy semantics").
type explainReason string

const (
	// reasonNotEnforced: no policy has rules with default deny, nor deny
	// rules, in the direction: everything passes.
	reasonNotEnforced explainReason = "notEnforced"
	// reasonPolicyDisabled: --enable-policy=never: nothing is enforced.
	reasonPolicyDisabled explainReason = "policyDisabled"
	// reasonAllowedByRule: an allow entry matches and no deny does.
	reasonAllowedByRule explainReason = "allowedByRule"
	// reasonDeniedByRule: a deny entry matches (the program's "Policy
	// denied by denylist"), whatever allows it.
	reasonDeniedByRule explainReason = "deniedByRule"
	// reasonDefaultDeny: the direction is enforced with default deny and
	// no entry matches.
	reasonDefaultDeny explainReason = "defaultDeny"
	// reasonNoDenyMatches: the direction has deny rules only, and none
	// matches: it passes.
	reasonNoDenyMatches explainReason = "noDenyMatches"
)

// decision is explain's desired verdict, why, and the entry that decides
// it (Found in matched: an entry matched).
type decision struct {
	allowed bool
	reason  explainReason
	matched policy.Match
}

// decisionOf names how r, the resolution in a direction enforced (default
// deny) or with deny rules only, decided allowed.
func decisionOf(r policy.Resolution, enforced, allowed bool) decision {
	d := decision{allowed: allowed, matched: r.Decided}
	switch {
	case r.Decided.Found && r.Decided.Verdict == policy.VerdictDeny:
		d.reason = reasonDeniedByRule
	case r.Decided.Found:
		d.reason = reasonAllowedByRule
	case enforced:
		d.reason = reasonDefaultDeny
	default:
		d.reason = reasonNoDenyMatches
	}
	return d
}

// name is the decision as the program's verdict: "allow" or "deny".
func (d decision) name() string {
	if d.allowed {
		return policy.VerdictAllow.String()
	}
	return policy.VerdictDeny.String()
}

// decidingRuleJSON is a rule behind the deciding entry, in policy/explain
// -o json: as `cilium policy trace` names the rule that decides.
type decidingRuleJSON struct {
	// Name is the rule's RuleRef ("web:egress[0]"), Policy and Rule its
	// parts.
	Name   string `json:"name"`
	Policy string `json:"policy"`
	Rule   string `json:"rule"`
	// File and Line are where the rule is (the policy's line if the
	// rule's is not known); "" and 0 for a policy no longer in force.
	File      string `json:"file"`
	Line      int    `json:"line"`
	Direction string `json:"direction"`
	// Verdict is the entry's: allow, deny or dns-proxy (an allow through
	// the DNS proxy).
	Verdict string `json:"verdict"`
	// PeerIdentity is the remote identity of the entry (0: any peer);
	// Peers are the rule's peers as its policy selects them.
	PeerIdentity identity.Number `json:"peerIdentity"`
	Peers        []string        `json:"peers"`
}

// decidingRules returns the rules of the entry that decided d, [] when
// none did.
func (src explainSources) decidingRules(txn statedb.ReadTxn, d decision) []decidingRuleJSON {
	out := []decidingRuleJSON{}
	if !d.matched.Found {
		return out
	}
	e, _, found := src.entries.Get(txn, policy.KeyIndex.Query(d.matched.Matched))
	if !found {
		return out
	}
	for _, ref := range e.Rules {
		pol, name, _ := strings.Cut(ref, ":")
		row := decidingRuleJSON{Name: ref, Policy: pol, Rule: name, Direction: e.Key.Direction.String(),
			Verdict: e.Verdict.String(), PeerIdentity: e.Key.Identity, Peers: []string{}}
		if p, _, found := src.policies.Get(txn, PolicyNameIndex.Query(pol)); found {
			row.File, row.Line = p.File, p.Line
			for _, r := range p.Rules(e.Key.Direction) {
				if r.Name == name {
					if r.Line != 0 {
						row.Line = r.Line
					}
					row.Peers = peerNames(r)
				}
			}
		}
		out = append(out, row)
	}
	return out
}

// peerNames names a rule's peers: CIDRs (with their excepts), endpoint
// selectors, entities, toFQDNs selectors (as the label of the identities
// they select, "fqdn:*.example.com"), or "any" for a rule for every peer.
func peerNames(r policy.Rule) []string {
	peers := []string{}
	if r.AnyPeer {
		peers = append(peers, "any")
	}
	for _, c := range r.Peers {
		p := c.CIDR.String()
		if len(c.Except) > 0 {
			except := make([]string, len(c.Except))
			for i, e := range c.Except {
				except[i] = e.String()
			}
			p += " except " + strings.Join(except, ", ")
		}
		peers = append(peers, p)
	}
	for _, s := range r.Endpoints {
		peers = append(peers, "endpoints "+s.String())
	}
	for _, e := range r.Entities {
		peers = append(peers, "entity "+string(e))
	}
	if r.FQDN != nil {
		for _, s := range r.FQDN.Selectors {
			peers = append(peers, s.Label())
		}
	}
	return peers
}
