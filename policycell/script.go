// SPDX-License-Identifier: Apache-2.0

package policycell

import (
	"fmt"
	"iter"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/cilium/hive/script"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/spf13/pflag"

	"github.com/ipcache-agent/ipcache-agent/endpoint"
	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/identitycell"
	"github.com/ipcache-agent/ipcache-agent/internal/scriptcmd"
	"github.com/ipcache-agent/ipcache-agent/ipcachecell"
	"github.com/ipcache-agent/ipcache-agent/labels"
	"github.com/ipcache-agent/ipcache-agent/policy"
)

func newScriptCommands(db *statedb.DB, l *loader, policies statedb.Table[*policy.Policy], entries statedb.Table[*policy.Entry],
	enforcement statedb.Table[*policy.Enforcement], ipcache statedb.Table[*ipcachecell.Entry],
	identities statedb.Table[*identitycell.Identity], endpoints statedb.Table[*endpoint.State], datapath policy.Datapath,
	enablePolicy string) map[string]script.Cmd {
	return map[string]script.Cmd{
		"policy/list": listCommand(db, l, policies, entries),
		"policy/explain": explainCommand(db, explainSources{entries: entries, enforcement: enforcement, policies: policies,
			ipcache: ipcache, identities: identities, endpoints: endpoints, datapath: datapath, enablePolicy: enablePolicy}),
	}
}

// listCommand shows each policy file: its policies in force, how many of
// their entries the datapath could not write and why, and, if its current
// content is rejected, why.
func listCommand(db *statedb.DB, l *loader, policies statedb.Table[*policy.Policy], entries statedb.Table[*policy.Entry]) script.Cmd {
	return scriptcmd.Show(
		script.CmdUsage{
			Summary: "List the policy files, their policies in force and their errors",
			Detail: []string{
				"Each policy in force is named with where it is (file:line).",
				"A rejected file keeps the policies it had in force before;",
				"its error follows on an indented line.",
				"Then each rule of its policies in force, on an indented line,",
				"named policy:rule (line), with its allow and deny entries in the",
				"policy table.",
				"A file whose policies have entries the datapath could not write",
				"to the policy map (a full map) says how many in its status, and",
				"why on an indented line: the traffic those entries allow is",
				"dropped until they are written (they are retried).",
				"Fails if the policy directory cannot be read.",
				"-o json: an array of objects, one per file (file, status: in force",
				"or rejected, policies with name, line and rules (name, line, allow",
				"and deny: entries), notWritten: entries not",
				"in the policy map, notWrittenErrors, error); empty without a",
				"policy directory.",
			},
		},
		func(s *script.State, asJSON bool) (script.WaitFunc, error) {
			if l.dir == "" {
				if asJSON {
					return scriptcmd.JSON([]fileJSON{}, nil)
				}
				return scriptcmd.Result("No policy directory (--policy-dir is empty)\n", nil)
			}
			status, err := l.Status()
			txn := db.ReadTxn()
			notWritten := notWrittenByFile(status, entries.All(txn))
			counts := entriesByRule(entries.All(txn))
			if asJSON {
				return scriptcmd.JSON(filesJSON(txn, policies, status, notWritten, counts), err)
			}
			var out strings.Builder
			w := tabwriter.NewWriter(&out, 0, 4, 2, ' ', 0)
			// A policy's line is shown as file:line, as explain's rules are:
			// "name:3" read like a count.
			fmt.Fprintf(w, "File\tStatus\tPolicies (file:line)\n")
			for i, f := range status {
				state := "in force"
				if f.Error != nil {
					state = "rejected"
				}
				n := notWritten[i]
				if n.entries > 0 {
					state += ", " + n.count()
				}
				var names []string
				for _, name := range f.Policies {
					if p, _, found := policies.Get(txn, PolicyNameIndex.Query(name)); found {
						name = fmt.Sprintf("%s (%s:%d)", name, f.File, p.Line)
					}
					names = append(names, name)
				}
				fmt.Fprintf(w, "%s\t%s\t%s\n", f.File, state, strings.Join(names, " "))
				if n.entries > 0 {
					fmt.Fprintf(w, "  %s\n", n)
				}
				if f.Error != nil {
					fmt.Fprintf(w, "  %s\n", f.Error)
				}
				for _, name := range f.Policies {
					for _, r := range policyRules(txn, policies, name, counts) {
						fmt.Fprintf(w, "  %s (line %d): %d allow, %d deny entries\n", r.Name, r.Line, r.Allow, r.Deny)
					}
				}
			}
			w.Flush()
			return scriptcmd.Result(out.String(), err)
		},
	)
}

// fileJSON is a file of policy/list -o json.
type fileJSON struct {
	File string `json:"file"`
	// Status is "in force" or "rejected" (its policies in force are
	// those of an earlier content).
	Status   string           `json:"status"`
	Policies []policyLineJSON `json:"policies"`
	// NotWritten counts the entries of its policies that the datapath
	// could not write to the policy map; NotWrittenErrors say why.
	NotWritten       int      `json:"notWritten"`
	NotWrittenErrors []string `json:"notWrittenErrors"`
	Error            string   `json:"error"`
}

type policyLineJSON struct {
	Name string `json:"name"`
	// Line is the line of its name in the file; 0 if not known.
	Line  int        `json:"line"`
	Rules []ruleJSON `json:"rules"`
}

// ruleJSON is a rule of a policy in force: its RuleRef, its line, and
// its entries in the `policy` table by verdict.
type ruleJSON struct {
	Name  string `json:"name"`
	Line  int    `json:"line"`
	Allow int    `json:"allow"`
	Deny  int    `json:"deny"`
}

// entriesByRule counts the `policy` rows of each rule (RuleRef), by
// verdict.
func entriesByRule(rows iter.Seq2[*policy.Entry, statedb.Revision]) map[string][2]int {
	counts := map[string][2]int{}
	for e := range rows {
		for _, ref := range e.Rules {
			c := counts[ref]
			if e.Verdict == policy.VerdictDeny {
				c[1]++
			} else {
				c[0]++
			}
			counts[ref] = c
		}
	}
	return counts
}

// policyRules returns the rules of a policy in force with their entries.
func policyRules(txn statedb.ReadTxn, policies statedb.Table[*policy.Policy], name string, counts map[string][2]int) []ruleJSON {
	p, _, found := policies.Get(txn, PolicyNameIndex.Query(name))
	if !found {
		return []ruleJSON{}
	}
	out := []ruleJSON{}
	for _, dir := range policy.Directions() {
		for _, r := range p.Rules(dir) {
			ref := policy.RuleRef(p.Name, r.Name)
			c := counts[ref]
			out = append(out, ruleJSON{Name: ref, Line: r.Line, Allow: c[0], Deny: c[1]})
		}
	}
	return out
}

func filesJSON(txn statedb.ReadTxn, policies statedb.Table[*policy.Policy], status []fileStatus, notWritten []unwrittenEntries,
	counts map[string][2]int) []fileJSON {
	out := make([]fileJSON, 0, len(status))
	for i, f := range status {
		row := fileJSON{File: f.File, Status: "in force", Policies: []policyLineJSON{},
			NotWritten: notWritten[i].entries, NotWrittenErrors: []string{}}
		if f.Error != nil {
			row.Status, row.Error = "rejected", f.Error.Error()
		}
		if notWritten[i].errors != nil {
			row.NotWrittenErrors = notWritten[i].errors
		}
		for _, name := range f.Policies {
			p := policyLineJSON{Name: name, Rules: policyRules(txn, policies, name, counts)}
			if pol, _, found := policies.Get(txn, PolicyNameIndex.Query(name)); found {
				p.Line = pol.Line
			}
			row.Policies = append(row.Policies, p)
		}
		out = append(out, row)
	}
	return out
}

// unwrittenEntries are the entries of a file's policies that the datapath
// could not write to the policy map, with the distinct errors why.
type unwrittenEntries struct {
	entries int
	errors  []string // sorted
}

// maxListedErrors is how many distinct errors policy/list shows per file:
// a full map gives every entry the same one, other failures may differ.
const maxListedErrors = 3

// count is what the file's status column says.
func (u unwrittenEntries) count() string {
	if u.entries == 1 {
		return "1 policy entry not in the policy map"
	}
	return fmt.Sprintf("%d policy entries not in the policy map", u.entries)
}

// String is the line below the file's: the count and why.
func (u unwrittenEntries) String() string {
	errs := u.errors
	more := ""
	if len(errs) > maxListedErrors {
		more = fmt.Sprintf("; %d more errors", len(errs)-maxListedErrors)
		errs = errs[:maxListedErrors]
	}
	return fmt.Sprintf("%s (%s%s)", u.count(), strings.Join(errs, "; "), more)
}

// notWrittenByFile counts, for each file (by its index in status), the
// `policy` rows of its policies in force whose reconciliation status is
// Error: the datapath's writer failed to put them into the policy map
// (statedb's reconciler sets Error only on a failed write, and the policy
// writer never holds a key back). A row that several of a file's policies
// share counts once for the file.
func notWrittenByFile(status []fileStatus, rows iter.Seq2[*policy.Entry, statedb.Revision]) []unwrittenEntries {
	fileOf := map[string]int{}
	for i, f := range status {
		for _, name := range f.Policies {
			fileOf[name] = i
		}
	}
	out := make([]unwrittenEntries, len(status))
	errs := make([]map[string]struct{}, len(status))
	seen := map[int]struct{}{}
	for e := range rows {
		if e.Status.Kind != reconciler.StatusKindError {
			continue
		}
		clear(seen)
		for _, name := range e.Policies {
			i, ok := fileOf[name]
			if _, dup := seen[i]; !ok || dup {
				continue
			}
			seen[i] = struct{}{}
			out[i].entries++
			if errs[i] == nil {
				errs[i] = map[string]struct{}{}
			}
			errs[i][e.Status.GetError()] = struct{}{}
		}
	}
	for i := range out {
		if errs[i] != nil {
			out[i].errors = slices.Sorted(maps.Keys(errs[i]))
		}
	}
	return out
}

// explainSources are what policy/explain reads.
type explainSources struct {
	entries     statedb.Table[*policy.Entry]
	enforcement statedb.Table[*policy.Enforcement]
	policies    statedb.Table[*policy.Policy]
	ipcache     statedb.Table[*ipcachecell.Entry]
	identities  statedb.Table[*identitycell.Identity]
	// endpoints is nil in a hive without an endpoint cell.
	endpoints    statedb.Table[*endpoint.State]
	datapath     policy.Datapath
	enablePolicy string
}

// explainCommand says whether the policies allow traffic of an address in
// a direction, and why.
func explainCommand(db *statedb.DB, src explainSources) script.Cmd {
	return script.Command(
		script.CmdUsage{
			Summary: "Explain the verdict for traffic with an address",
			Args:    "[--endpoint namespace/name] address|cidr ingress|egress [TCP/port|UDP/port|SCTP/port|ICMP/type|ICMPv6/type]",
			Detail: []string{
				"The traffic is the host-wide default's, or with --endpoint that",
				"local endpoint's: the policy of its identity (the policies whose",
				"selectors pick it), and its own enforcement.",
				"The address is the peer: the source for ingress, the destination",
				"for egress. Its identity is that of the longest ipcache prefix",
				"containing it, or world. A CIDR is explained for the identity of",
				"the longest ipcache prefix containing all of it, and the narrower",
				"prefixes inside it with identities of their own are listed (their",
				"addresses are explained one by one); the Maps line is for its",
				"first address. The datapath looks up the remote",
				"identity's key and identity 0's (rules for every peer), each the",
				"longest matching prefix: the port's block, the whole protocol,",
				"any protocol. A deny from either wins, else a dns-proxy from either",
				"(an allow, through the DNS proxy), else an allow from either",
				"allows, else the direction's default: drop when enforced (default",
				"deny), pass with deny rules only. Without a port, the verdict is",
				"for other protocols: only entries for any protocol match.",
				"Rules are named policy:rule (file:line).",
				"This is the desired state; the maps follow it once reconciled. An",
				"entry the datapath could not write (a full policy map) is said,",
				"with the verdict without it. With the datapath, a last line",
				"(Maps:) says what the program decides from the maps as they are;",
				"for an endpoint, from the subject the endpoints map gives its",
				"address of the peer's family, that subject's enforcement and map.",
				"-o json: one object (address, direction, port as TCP/443 or \"\",",
				"identity, prefix: the ipcache prefix or \"\" for world, enforced,",
				"hasDeny, allowed: the desired verdict, decision: allow or deny,",
				"reason: notEnforced, policyDisabled, allowedByRule, deniedByRule,",
				"defaultDeny or noDenyMatches, rules: the deciding entry's rules",
				"(name, policy, rule, file, line, direction, verdict, peerIdentity:",
				"the entry's, 0 for any peer, peers: the rule's peers), explanation:",
				"the lines; with --endpoint, endpoint and subject: its identity).",
			},
			Flags: func(fs *pflag.FlagSet) {
				scriptcmd.OutputFlag(fs)
				fs.String("endpoint", "", "Explain for this local endpoint (namespace/name) instead of the host-wide default")
			},
		},
		func(s *script.State, args ...string) (script.WaitFunc, error) {
			if len(args) < 2 || len(args) > 3 {
				return nil, script.ErrUsage
			}
			asJSON, err := scriptcmd.JSONOutput(s)
			if err != nil {
				return scriptcmd.Result("", err)
			}
			peer, err := parsePeer(args[0])
			if err != nil {
				return scriptcmd.Result("", err)
			}
			addr := peer.Addr()
			dir, err := policy.ParseDirection(args[1])
			if err != nil {
				return scriptcmd.Result("", err)
			}
			pkt := policy.Lookup{Direction: dir}
			if len(args) == 3 {
				if pkt, err = parsePacket(args[2], dir); err != nil {
					return scriptcmd.Result("", err)
				}
			}
			txn := db.ReadTxn()
			var text strings.Builder
			name, err := s.Flags.GetString("endpoint")
			if err != nil {
				return scriptcmd.Result("", err)
			}
			var ep *endpoint.State
			if name != "" {
				if ep, err = src.localEndpoint(&text, txn, name); err != nil {
					return scriptcmd.Result("", err)
				}
				pkt.Subject = ep.Identity
			}
			decided := src.explainDecision(&text, txn, peer, pkt)
			allowed := decided.allowed
			if src.datapath != nil {
				explainMaps(&text, src.datapath, addr, pkt, allowed, ep)
			}
			if !asJSON {
				return scriptcmd.Result(text.String(), nil)
			}
			out := explainJSON{Address: args[0], Direction: dir.String(), Identity: identity.World,
				Endpoint: name, Subject: pkt.Subject,
				Allowed: allowed, Decision: decided.name(), Reason: decided.reason, Rules: src.decidingRules(txn, decided),
				Explanation: strings.Split(strings.TrimSuffix(text.String(), "\n"), "\n")}
			if len(args) == 3 {
				out.Port = args[2]
			}
			if entry, found := ipcachecell.LookupPrefix(txn, src.ipcache, peer); found {
				out.Identity, out.Prefix = entry.Identity, entry.Prefix().String()
			}
			if row, _, found := src.enforcement.Get(txn, policy.EnforcementIndex.Query(policy.EnforcementKey{Subject: pkt.Subject, Direction: dir})); found {
				out.Enforced, out.HasDeny = row.Enforced, row.HasDeny
			}
			return scriptcmd.JSON(out, nil)
		},
	)
}

// explainJSON is policy/explain -o json.
type explainJSON struct {
	// Endpoint and Subject are the local endpoint explained for and its
	// identity; absent for the host-wide default.
	Endpoint  string          `json:"endpoint,omitempty"`
	Subject   identity.Number `json:"subject,omitempty"`
	Address   string          `json:"address"`
	Direction string          `json:"direction"`
	Port      string          `json:"port"`
	Identity  identity.Number `json:"identity"`
	Prefix    string          `json:"prefix"`
	Enforced  bool            `json:"enforced"`
	HasDeny   bool            `json:"hasDeny"`
	// Allowed is the desired verdict: whether the policies allow it;
	// Decision says it as "allow" or "deny", Reason why, and Rules are
	// the rules of the entry that decides (none for a direction's
	// default).
	Allowed     bool               `json:"allowed"`
	Decision    string             `json:"decision"`
	Reason      explainReason      `json:"reason"`
	Rules       []decidingRuleJSON `json:"rules"`
	Explanation []string           `json:"explanation"`
}

// parsePeer parses an address, or a CIDR without host bits, as a prefix
// (an address is its /32 or /128).
func parsePeer(s string) (netip.Prefix, error) {
	if addr, err := netip.ParseAddr(s); err == nil {
		return netip.PrefixFrom(addr.WithZone(""), addr.BitLen()), nil
	}
	prefix, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q: want an address (10.0.0.1, fd00::1) or a CIDR (10.0.0.0/24)", s)
	}
	if prefix != prefix.Masked() {
		return netip.Prefix{}, fmt.Errorf("%q: host bits set: did you mean %s?", s, prefix.Masked())
	}
	return prefix, nil
}

// parsePacket parses "TCP/443" (or UDP, SCTP; port 1..65535) or
// "ICMP/8" (or ICMPv6; the type, code 0) into a packet of direction dir.
func parsePacket(s string, dir policy.Direction) (policy.Lookup, error) {
	name, number, ok := strings.Cut(s, "/")
	protocol, err := policy.ParseProtocol(name)
	if !ok || err != nil {
		return policy.Lookup{}, fmt.Errorf("%q: want TCP/port, UDP/port, SCTP/port, ICMP/type or ICMPv6/type", s)
	}
	pkt := policy.Lookup{Direction: dir, Protocol: protocol, HasPort: true}
	switch protocol {
	case policy.ProtocolTCP, policy.ProtocolUDP, policy.ProtocolSCTP:
		port, err := strconv.ParseUint(number, 10, 16)
		if err != nil || port == 0 {
			return policy.Lookup{}, fmt.Errorf("%q: port must be in 1..65535", s)
		}
		pkt.Port = uint16(port)
	case policy.ProtocolICMP, policy.ProtocolICMPv6:
		t, err := strconv.ParseUint(number, 10, 8)
		if err != nil {
			return policy.Lookup{}, fmt.Errorf("%q: ICMP type must be in 0..255", s)
		}
		pkt.Port = uint16(t) << 8
	default:
		return policy.Lookup{}, fmt.Errorf("%q: want TCP/port, UDP/port, SCTP/port, ICMP/type or ICMPv6/type", s)
	}
	return pkt, nil
}

// ruleNames names an entry's rules with their place: "shop/web:egress[0]
// (a.yaml:12)".
func (src explainSources) ruleNames(txn statedb.ReadTxn, e *policy.Entry) string {
	names := make([]string, 0, len(e.Rules))
	for _, ref := range e.Rules {
		pol, rule, _ := strings.Cut(ref, ":")
		name := ref
		if p, _, found := src.policies.Get(txn, PolicyNameIndex.Query(pol)); found {
			line := p.Line
			for _, dir := range policy.Directions() {
				for _, r := range p.Rules(dir) {
					if r.Name == rule && r.Line != 0 {
						line = r.Line
					}
				}
			}
			name = fmt.Sprintf("%s (%s:%d)", ref, p.File, line)
		}
		names = append(names, name)
	}
	return strings.Join(names, ", ")
}

// explainDesired writes what the tables say of the traffic (the identity,
// the direction's enforcement, the entries, the lookups, the verdict) and
// returns whether the policies allow it. An entry the datapath could not
// write (its status is Error) is said, with the verdict the program gives
// without it (unless the address's ipcache entry is held too, and the
// program still finds the prefix's previous identity).
func (src explainSources) explainDesired(out *strings.Builder, txn statedb.ReadTxn, peer netip.Prefix, pkt policy.Lookup) bool {
	return src.explainDecision(out, txn, peer, pkt).allowed
}

// explainDecision is explainDesired, returning also why the policies
// decide so and the entry that decides (if one does).
func (src explainSources) explainDecision(out *strings.Builder, txn statedb.ReadTxn, peer netip.Prefix, pkt policy.Lookup) decision {
	id := identity.World
	held := false
	dir := pkt.Direction
	addr := peer.Addr()
	if entry, found := ipcachecell.LookupPrefix(txn, src.ipcache, peer); found {
		id = entry.Identity
		var lbls labels.Labels
		if ident, _, found := src.identities.Get(txn, identitycell.IdentityIndex.Query(id)); found {
			// An explicit identity (an endpoint's) is the allocator's
			// too: its labels are what peer selectors match.
			lbls = ident.Labels
		}
		peer := ""
		if src.endpoints != nil {
			if ep, _, found := src.endpoints.Get(txn, endpoint.AddressIndex.Query(addr)); found {
				where := "local"
				if !ep.Local {
					where = "on node " + ep.Node
				}
				peer = fmt.Sprintf("endpoint %s (%s), ", ep.ID(), where)
			}
		}
		fmt.Fprintf(out, "Identity: %s (%sipcache prefix %s, labels %s)\n", id, peer, entry.Prefix(), lbls)
		var kind reconciler.StatusKind
		var writeErr error
		if src.datapath != nil {
			// The entry's status is the datapath writer's, by revision.
			_, rev, _ := src.ipcache.Get(txn, ipcachecell.EntryIndex.Query(entry.Prefix()))
			kind, writeErr = src.datapath.IPCacheStatus(rev)
		}
		if kind == reconciler.StatusKindError {
			// Held or failed: the datapath still has what the map had.
			held = true
			fmt.Fprintf(out, "Datapath: the ipcache map does not have this entry yet, it keeps the prefix's previous value (Error: %v)", writeErr)
			if inMap, found, err := src.datapath.LookupIdentity(addr); err == nil && found {
				fmt.Fprintf(out, "; the datapath uses identity %s for %s", inMap, addr)
			} else if err == nil {
				fmt.Fprintf(out, "; the datapath uses world (%s) for %s: no ipcache map entry covers it", identity.World, addr)
			}
			out.WriteString("\n")
		}
	} else {
		fmt.Fprintf(out, "Identity: %s (world: no ipcache prefix contains %s)\n", id, peerString(peer))
	}
	if peer.Bits() < addr.BitLen() {
		src.narrower(out, txn, peer)
	}
	pkt.Identity = id
	row, _, found := src.enforcement.Get(txn, policy.EnforcementIndex.Query(policy.EnforcementKey{Subject: pkt.Subject, Direction: dir}))
	if !found || !row.Enforced && !row.HasDeny {
		why := fmt.Sprintf("no policy has %s rules with default deny, nor %s deny rules", dir, dir)
		if src.enablePolicy == EnablePolicyNever {
			why = "--enable-policy=never"
		}
		fmt.Fprintf(out, "Verdict: allow (%s is not enforced: %s)\n", dir, why)
		if src.enablePolicy == EnablePolicyNever {
			return decision{allowed: true, reason: reasonPolicyDisabled}
		}
		return decision{allowed: true, reason: reasonNotEnforced}
	}
	mode := "enforced, default deny"
	if !row.Enforced {
		mode = "deny rules only"
	}
	fmt.Fprintf(out, "Entries (%s %s):\n", dir, mode)
	for _, of := range []identity.Number{id, 0} {
		for e := range policy.DirectionEntries(txn, src.entries, pkt.Subject, of, dir) {
			notWritten := ""
			if e.Status.Kind == reconciler.StatusKindError {
				notWritten = " (not in the policy map: " + e.Status.GetError() + ")"
			}
			fmt.Fprintf(out, "  %s %s/%s %s: %s%s\n", of, e.Key.Protocol, e.Key.PortString(), e.Verdict,
				src.ruleNames(txn, e), notWritten)
		}
	}
	r, _ := policy.Resolve(pkt, policy.DesiredLookup(txn, src.entries, false))
	allowed := src.writeVerdict(out, txn, "Verdict", r, row.Enforced)
	decided := decisionOf(r, row.Enforced, allowed)
	written, _ := policy.Resolve(pkt, policy.DesiredLookup(txn, src.entries, true))
	if written.Decided != r.Decided {
		e, _, _ := src.entries.Get(txn, policy.KeyIndex.Query(r.Decided.Matched))
		what := "an entry"
		if e != nil {
			what = fmt.Sprintf("entry %s of %s", e.Key, src.ruleNames(txn, e))
			if e.Status.Kind == reconciler.StatusKindError {
				what += " (" + e.Status.GetError() + ")"
			}
		}
		if held {
			fmt.Fprintf(out, "Not written: %s could not be written to the policy map; the datapath still uses the prefix's previous value (Datapath above)\n", what)
		} else {
			fmt.Fprintf(out, "Not written: %s could not be written to the policy map\n", what)
			src.writeVerdict(out, txn, "Verdict without it", written, row.Enforced)
		}
	}
	return decided
}

// narrowerShown bounds the narrower prefixes explain lists for a CIDR.
const narrowerShown = 8

// narrower writes the ipcache prefixes strictly inside cidr, whose
// addresses have identities of their own.
func (src explainSources) narrower(out *strings.Builder, txn statedb.ReadTxn, cidr netip.Prefix) {
	var inside []string
	n := 0
	for entry := range ipcachecell.EntriesWithin(txn, src.ipcache, cidr) {
		if entry.Prefix() == cidr {
			continue
		}
		if n++; len(inside) < narrowerShown {
			inside = append(inside, fmt.Sprintf("%s (identity %s)", entry.Prefix(), entry.Identity))
		}
	}
	if n == 0 {
		fmt.Fprintf(out, "Inside: no narrower ipcache prefix: every address of %s has this identity\n", cidr)
		return
	}
	more := ""
	if n > len(inside) {
		more = fmt.Sprintf(" and %d more", n-len(inside))
	}
	fmt.Fprintf(out, "Inside: %d narrower ipcache prefixes have identities of their own (explain their addresses one by one): %s%s\n",
		n, strings.Join(inside, ", "), more)
}

// peerString writes a peer as an address when it is one.
func peerString(peer netip.Prefix) string {
	if peer.IsSingleIP() {
		return peer.Addr().String()
	}
	return peer.String()
}

// localEndpoint writes the line of a local endpoint and returns it; its
// identity is the subject whose policy applies to its traffic.
//
// Possible errors: ErrNoEndpoint (wrapped) for a name that is no local
// endpoint with an identity.
func (src explainSources) localEndpoint(out *strings.Builder, txn statedb.ReadTxn, name string) (*endpoint.State, error) {
	if src.endpoints == nil {
		return nil, fmt.Errorf("%w %s: this agent has no endpoints", ErrNoEndpoint, name)
	}
	ep, _, found := src.endpoints.Get(txn, endpoint.NameIndex.Query(name))
	switch {
	case !found:
		return nil, fmt.Errorf("%w %s", ErrNoEndpoint, name)
	case !ep.Local:
		return nil, fmt.Errorf("%w %s on this node: it runs on %s", ErrNoEndpoint, name, ep.Node)
	case ep.Identity == identity.Unknown:
		return nil, fmt.Errorf("%w %s with an identity yet", ErrNoEndpoint, name)
	}
	fmt.Fprintf(out, "Endpoint: %s (identity %s, labels %s)\n", name, ep.Identity, ep.IdentityLabels)
	return ep, nil
}

// writeVerdict writes the line of a resolution and returns whether it
// allows the packet.
func (src explainSources) writeVerdict(out *strings.Builder, txn statedb.ReadTxn, label string, r policy.Resolution, enforced bool) bool {
	d := r.Decided
	if !d.Found {
		if enforced {
			fmt.Fprintf(out, "%s: drop (no entry allows it)\n", label)
			return false
		}
		fmt.Fprintf(out, "%s: allow (no deny entry matches, and %s has deny rules only)\n", label, d.Key.Direction)
		return true
	}
	rules := d.Matched.String()
	if e, _, found := src.entries.Get(txn, policy.KeyIndex.Query(d.Matched)); found {
		rules = fmt.Sprintf("%s of %s", d.Matched, src.ruleNames(txn, e))
	}
	if d.Verdict == policy.VerdictDeny {
		fmt.Fprintf(out, "%s: drop (deny entry %s)\n", label, rules)
		return false
	}
	if d.Verdict == policy.VerdictDNSProxy {
		fmt.Fprintf(out, "%s: allow through the DNS proxy (dns-proxy entry %s)\n", label, rules)
		return true
	}
	fmt.Fprintf(out, "%s: allow (entry %s)\n", label, rules)
	return true
}

// explainMaps writes what the enforcement program decides from the maps
// as they are now, resolving as it does (policy.Resolve), and says so
// when that is not the desired verdict. With ep, the traffic is that local
// endpoint's: the program takes the subject from the endpoints map entry
// of the packet's local address (here the endpoint's first address of the
// peer's family), not from the tables, which it may not follow yet.
func explainMaps(out *strings.Builder, datapath policy.Datapath, addr netip.Addr, pkt policy.Lookup, desired bool, ep *endpoint.State) {
	verdict := func(allowed bool) string {
		v := "drop"
		if allowed {
			v = "allow"
		}
		if allowed != desired {
			v += ", not what the policies want"
		}
		return v
	}
	dir := pkt.Direction
	// subject is what the lines say of the subject: nothing for the
	// host-wide default's traffic, as before endpoints.
	subject := ""
	pkt.Subject = identity.Unknown
	if ep != nil {
		local, ok := addressLike(ep.Addresses, addr)
		if !ok {
			fmt.Fprintf(out, "Maps: not read: %s has no address of %s's family\n", ep.ID(), addr)
			return
		}
		id, _, found, err := datapath.LookupEndpoint(local)
		switch {
		case err != nil:
			fmt.Fprintf(out, "Maps: cannot be read: %s\n", err)
			return
		case !found:
			subject = fmt.Sprintf("%s not in the endpoints map (the host-wide default's policy), ", local)
		case id != ep.Identity:
			subject = fmt.Sprintf("%s subject %s (not the endpoint's identity yet), ", local, id)
		default:
			subject = fmt.Sprintf("%s subject %s, ", local, id)
		}
		pkt.Subject = id
	}
	id, found, err := datapath.LookupIdentity(addr)
	if err != nil {
		fmt.Fprintf(out, "Maps: %scannot be read: %s\n", subject, err)
		return
	}
	if !found {
		id = identity.World
	}
	pkt.Identity = id
	enforcement, err := datapath.Enforcement(pkt.Subject, dir)
	if err != nil {
		fmt.Fprintf(out, "Maps: %sidentity %s; cannot read the enforcement map: %s\n", subject, id, err)
		return
	}
	enforced := enforcement == policy.DefaultDeny
	switch enforcement {
	case policy.NotEnforced:
		fmt.Fprintf(out, "Maps: %sidentity %s, %s not enforced: %s\n", subject, id, dir, verdict(true))
		return
	case policy.DropAll:
		fmt.Fprintf(out, "Maps: %sidentity %s, %s drops everything (a deny has no room in the policy map): %s\n", subject, id, dir, verdict(false))
		return
	}
	mode := "enforced"
	if !enforced {
		mode = "deny rules only"
	}
	r, err := policy.Resolve(pkt, policy.LookupFunc(datapath.LookupPolicy))
	if err != nil {
		fmt.Fprintf(out, "Maps: %sidentity %s, %s %s; cannot read the policy map: %s\n", subject, id, dir, mode, err)
		return
	}
	switch d := r.Decided; {
	case d.Found && d.Verdict == policy.VerdictDeny:
		fmt.Fprintf(out, "Maps: %sidentity %s, %s %s, policy map deny entry %s: %s\n", subject, id, dir, mode, d.Matched, verdict(false))
	case d.Found && d.Verdict == policy.VerdictDNSProxy:
		fmt.Fprintf(out, "Maps: %sidentity %s, %s %s, policy map dns-proxy entry %s: %s through the DNS proxy\n", subject, id, dir, mode, d.Matched, verdict(true))
	case d.Found:
		fmt.Fprintf(out, "Maps: %sidentity %s, %s %s, policy map entry %s: %s\n", subject, id, dir, mode, d.Matched, verdict(true))
	case enforced:
		fmt.Fprintf(out, "Maps: %sidentity %s, %s %s, no policy map entry allows it: %s\n", subject, id, dir, mode, verdict(false))
	default:
		fmt.Fprintf(out, "Maps: %sidentity %s, %s %s, no policy map entry denies it: %s\n", subject, id, dir, mode, verdict(true))
	}
}

// addressLike returns the first of addrs of peer's family: the packets
// between an endpoint and peer carry it.
func addressLike(addrs []netip.Addr, peer netip.Addr) (netip.Addr, bool) {
	for _, a := range addrs {
		if a.Unmap().Is4() == peer.Unmap().Is4() {
			return a.Unmap(), true
		}
	}
	return netip.Addr{}, false
}
