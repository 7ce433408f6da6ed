// SPDX-License-Identifier: Apache-2.0

package policy

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"iter"
	"math/bits"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"github.com/cilium/statedb/reconciler"

	"github.com/ipcache-agent/ipcache-agent/identity"
)

const (
	TableName            = "policy"
	EnforcementTableName = "policy-enforcement"
)

// Verdict is the value of a policy-map entry.
type Verdict uint32

const (
	// VerdictAllow passes what the entry matches (in an enforced
	// direction).
	VerdictAllow Verdict = 1
	// VerdictDeny drops what the entry matches, in any direction, whatever
	// an allow entry says.
	VerdictDeny Verdict = 2
	// VerdictDNSProxy passes what the entry matches, as VerdictAllow, and
	// steers it to the DNS proxy: the entries of the ports of an egress
	// rule's DNS rules. A deny wins over it as over an allow; it wins
	// over an allow of the same key, so that a DNS rule's traffic is
	// intercepted whatever other rules allow it.
	VerdictDNSProxy Verdict = 3
)

// Allows reports whether the verdict passes what it matches (allow or
// dns-proxy).
func (v Verdict) Allows() bool { return v == VerdictAllow || v == VerdictDNSProxy }

// String returns "allow", "deny", "dns-proxy", else the number.
func (v Verdict) String() string {
	switch v {
	case VerdictAllow:
		return "allow"
	case VerdictDeny:
		return "deny"
	case VerdictDNSProxy:
		return "dns-proxy"
	}
	return strconv.FormatUint(uint64(v), 10)
}

// Key is the key of a policy-map entry (docs/CONTRACT.md, "BPF maps
// and pins"): an LPM key over identity, direction, protocol and port. Port
// is in host order here; the datapath writes it in network order. A rule
// without ports gives Protocol and Port 0 (any protocol, any port); a port
// range is one key per aligned block of ports in it, each matching the
// leading bits of Port (its last PortWildcardBits bits are any: 0 is one
// port, 16 every port of the protocol). ICMP types are in Port's high
// byte (PortWildcardBits 8).
//
// Subject is the local endpoint identity whose policy the entry is in
// (its inner map in the datapath); 0 is the host-wide default's.
type Key struct {
	Subject   identity.Number `json:"subject,omitempty" yaml:"subject,omitempty"`
	Identity  identity.Number `json:"identity" yaml:"identity"`
	Direction Direction       `json:"direction" yaml:"direction"`
	Protocol  Protocol        `json:"protocol" yaml:"protocol"`
	Port      uint16          `json:"port" yaml:"port"`

	PortWildcardBits uint8 `json:"portWildcardBits,omitempty" yaml:"portWildcardBits,omitempty"`
}

// key is the index key: the remote identity, the subject, then the map
// key's other fields, big-endian, so that keys order by identity first
// and one identity's entries (of every subject) are one key prefix: an
// identity's change is a change of that prefix.
func (k Key) indexKey() index.Key {
	key := make(index.Key, 13)
	binary.BigEndian.PutUint32(key, uint32(k.Identity))
	binary.BigEndian.PutUint32(key[4:], uint32(k.Subject))
	key[8], key[9] = byte(k.Direction), byte(k.Protocol)
	binary.BigEndian.PutUint16(key[10:], k.Port)
	key[12] = k.PortWildcardBits
	return key
}

// String returns "[subject:]identity/direction/protocol/ports": the form
// db/get takes for a single port ("16777217/egress/TCP/443", or
// "300:16777217/egress/TCP/443" in the policy of subject 300); a block
// of ports is "first-last", every port of the protocol "any", an ICMP
// type "type=8", any protocol "any/any".
func (k Key) String() string {
	var subject string
	if k.Subject != identity.Unknown {
		subject = k.Subject.String() + ":"
	}
	return fmt.Sprintf("%s%d/%s/%s/%s", subject, k.Identity, k.Direction, k.Protocol, k.PortString())
}

// PortString returns the key's ports as String does: "443", "8000-8063",
// "any", "type=8".
func (k Key) PortString() string {
	switch {
	case k.Protocol == ProtocolAny || k.PortWildcardBits >= 16:
		return "any"
	case k.Protocol == ProtocolICMP || k.Protocol == ProtocolICMPv6:
		return "type=" + strconv.Itoa(int(k.Port>>8))
	case k.PortWildcardBits == 0:
		return strconv.Itoa(int(k.Port))
	}
	last := uint32(k.Port) | (1<<k.PortWildcardBits - 1)
	return fmt.Sprintf("%d-%d", k.Port, last)
}

// Matches reports whether the key's prefix (its identity and direction, then its protocol and the port bits its block fixes)
// covers other: other is of the same identity and direction and lies
// inside the key's protocol and port block.
func (k Key) Matches(other Key) bool {
	switch {
	case k.Subject != other.Subject || k.Identity != other.Identity || k.Direction != other.Direction:
		return false
	case k.Protocol == ProtocolAny:
		return true
	case k.Protocol != other.Protocol || other.PortWildcardBits > k.PortWildcardBits:
		return false
	}
	return uint32(k.Port)>>k.PortWildcardBits == uint32(other.Port)>>k.PortWildcardBits
}

func CompareKeys(a, b Key) int {
	switch {
	case a.Identity != b.Identity:
		return cmp.Compare(a.Identity, b.Identity)
	case a.Subject != b.Subject:
		return cmp.Compare(a.Subject, b.Subject)
	case a.Direction != b.Direction:
		return cmp.Compare(a.Direction, b.Direction)
	case a.Protocol != b.Protocol:
		return cmp.Compare(a.Protocol, b.Protocol)
	case a.Port != b.Port:
		return cmp.Compare(a.Port, b.Port)
	}
	return cmp.Compare(a.PortWildcardBits, b.PortWildcardBits)
}

// policyKeyFromString parses
// "[subject:]identity[/direction[/protocol[/ports]]]", e.g.
// "16777217/egress/UDP/53", ports as PortString writes them ("443",
// "8000-8063", "any", "type=8"). Fewer fields give a key prefix, for
// `db/prefix policy 16777217` (the identity's entries of every subject)
// or `db/prefix policy 300:16777217` (of subject 300 only); with more
// fields and no subject, the subject is the host-wide default.
func keyFromString(s string) (index.Key, error) {
	var k Key
	subjectText, rest, hasSubject := strings.Cut(s, ":")
	if hasSubject {
		subject, err := strconv.ParseUint(subjectText, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("parse policy key %q: subject: %w", s, err)
		}
		k.Subject, s = identity.Number(subject), rest
	}
	fields := strings.Split(s, "/")
	if len(fields) > 4 {
		return nil, fmt.Errorf("parse policy key %q: want identity/direction/protocol/port", s)
	}
	id, err := strconv.ParseUint(fields[0], 10, 32)
	if err != nil {
		return nil, fmt.Errorf("parse policy key %q: identity: %w", s, err)
	}
	k.Identity = identity.Number(id)
	if len(fields) > 1 {
		if k.Direction, err = ParseDirection(fields[1]); err != nil {
			return nil, fmt.Errorf("parse policy key %q: %w", s, err)
		}
	}
	if len(fields) > 2 {
		if k.Protocol, err = ParseProtocol(fields[2]); err != nil {
			return nil, fmt.Errorf("parse policy key %q: %w", s, err)
		}
	}
	if len(fields) > 3 {
		if k.Port, k.PortWildcardBits, err = parsePorts(fields[3], k.Protocol); err != nil {
			return nil, fmt.Errorf("parse policy key %q: %w", s, err)
		}
	}
	if len(fields) == 1 && !hasSubject {
		return k.indexKey()[:4], nil
	}
	return k.indexKey()[:[]int{8, 9, 10, 13}[len(fields)-1]], nil
}

// parsePorts parses ports as PortString writes them for protocol.
func parsePorts(s string, protocol Protocol) (port uint16, wildcard uint8, err error) {
	first, last, isRange := strings.Cut(s, "-")
	switch {
	case s == "any" && protocol == ProtocolAny:
		return 0, 0, nil
	case s == "any":
		return 0, 16, nil
	case strings.HasPrefix(s, "type=") && (protocol == ProtocolICMP || protocol == ProtocolICMPv6):
		t, err := strconv.ParseUint(strings.TrimPrefix(s, "type="), 10, 8)
		if err != nil {
			return 0, 0, fmt.Errorf("ICMP type %q: want 0..255", s)
		}
		return uint16(t) << 8, 8, nil
	}
	start, err := strconv.ParseUint(first, 10, 16)
	if err != nil {
		return 0, 0, fmt.Errorf("port %q: want a port, a block first-last, any or type=N", s)
	}
	if !isRange {
		return uint16(start), 0, nil
	}
	end, err := strconv.ParseUint(last, 10, 16)
	size := end - start + 1
	if err != nil || end < start || size&(size-1) != 0 || start&(size-1) != 0 {
		return 0, 0, fmt.Errorf("ports %q: not an aligned block of ports", s)
	}
	return uint16(start), uint8(bits.TrailingZeros64(size)), nil
}

// Entry is a row of the desired `policy` table: a policy-map entry
// and the policies (and their rules) that give it its verdict.
type Entry struct {
	Key     Key     `json:"key" yaml:"key"`
	Verdict Verdict `json:"verdict" yaml:"verdict"`

	// Policies are the names of the policies in force whose rules give the
	// entry its verdict (for a deny entry, the deny rules' alone), sorted.
	// Immutable.
	Policies []string `json:"policies" yaml:"policies"`
	// Rules name those rules, sorted, each as [RuleRef] spells it:
	// "<policy>:<rule>", e.g. "shop/web:egressDeny[0]". Immutable.
	Rules []string `json:"rules" yaml:"rules"`

	// Status is the datapath's reconciliation status of the entry.
	Status reconciler.Status `json:"status" yaml:"status"`
}

// TableHeader implements statedb.TableWritable.
func (*Entry) TableHeader() []string {
	return []string{"Subject", "Identity", "Direction", "Protocol", "Port", "Verdict", "Policies", "Rules", "Status"}
}

// TableRow implements statedb.TableWritable. Port is as
// [Key.PortString].
func (e *Entry) TableRow() []string {
	return []string{e.Key.Subject.String(), e.Key.Identity.String(), e.Key.Direction.String(), e.Key.Protocol.String(), e.Key.PortString(),
		e.Verdict.String(), strings.Join(e.Policies, ","), strings.Join(e.Rules, ","), e.Status.String()}
}

// RuleRef names a rule of a policy in the `policy` table's Rules:
// "<policy>:<rule>". Policy names never hold ':' (Kubernetes' and the
// native format's name rules), so the first ':' splits it. Rules are
// named by their place in the file ([Rule].Name), as Cilium rules have no
// name of their own; policy/explain adds the file and line.
func RuleRef(policy, rule string) string { return policy + ":" + rule }

// sameEntry reports whether two entries say the same, whatever their
// reconciliation status.
func (e *Entry) Same(other *Entry) bool {
	return e.Key == other.Key && e.Verdict == other.Verdict && slices.Equal(e.Policies, other.Policies) &&
		slices.Equal(e.Rules, other.Rules)
}

// Clone returns a shallow copy, for the reconciler.
func (e *Entry) Clone() *Entry {
	c := *e
	return &c
}

// GetStatus returns the reconciliation status, for the reconciler.
func (e *Entry) GetStatus() reconciler.Status { return e.Status }

// SetStatus sets the reconciliation status, for the reconciler.
func (e *Entry) SetStatus(status reconciler.Status) *Entry {
	e.Status = status
	return e
}

// KeyIndex is the primary index of the `policy` table: the map key.
// Querying with fewer fields (policyKeyFromString) is a prefix search.
var KeyIndex = statedb.Index[*Entry, Key]{
	Name: "key",
	FromObject: func(e *Entry) index.KeySet {
		return index.NewKeySet(e.Key.indexKey())
	},
	FromKey:    Key.indexKey,
	FromString: keyFromString,
	Unique:     true,
}

// IdentityEntries returns the entries of identity id in the `policy`
// table, of every subject, in key order.
func IdentityEntries(txn statedb.ReadTxn, entries statedb.Table[*Entry], id identity.Number) iter.Seq[*Entry] {
	return prefixEntries(txn, entries, Key{Identity: id}.indexKey()[:4])
}

// AppendIdentitiesEntries appends to out the entries in the `policy` table
// of the identities ids (sorted, each once), in key order, and to ends,
// for each of ids, the length of out after its entries: those of ids[i]
// are out[ends[i-1]:ends[i]] (from the length of out as given, for i 0).
//
// It reads the identities' entries in one walk of the table, which holds
// an identity's entries next to each other and in the identities' order,
// where a search per identity, as [IdentityEntries] does, costs an
// iterator each: the thousands of new identities of a large load's chunk
// added up (docs/SCALE.md). The walk passes the entries of identities not in
// ids that lie between them; once it has passed more than a few per
// identity asked for (ids spread over a table whose other identities have
// entries), the rest of ids are searched one by one.
func AppendIdentitiesEntries(txn statedb.ReadTxn, entries statedb.Table[*Entry], ids []identity.Number, out []*Entry, ends []int) ([]*Entry, []int) {
	if len(ids) == 0 {
		return out, ends
	}
	// The entries of other identities the walk may pass.
	passable := 4*len(ids) + 64
	i := 0
	for e := range entries.LowerBound(txn, KeyIndex.QueryFromKey(Key{Identity: ids[0]}.indexKey()[:4])) {
		id := e.Key.Identity
		for i < len(ids) && ids[i] < id {
			ends = append(ends, len(out))
			i++
		}
		if i == len(ids) {
			break
		}
		if id == ids[i] {
			out = append(out, e)
			continue
		}
		if passable--; passable < 0 {
			break
		}
	}
	// ids[i] and after: no entry appended yet.
	for ; i < len(ids); i++ {
		if passable >= 0 {
			// The walk ended at the table's end: no entries.
			ends = append(ends, len(out))
			continue
		}
		for e := range IdentityEntries(txn, entries, ids[i]) {
			out = append(out, e)
		}
		ends = append(ends, len(out))
	}
	return out, ends
}

// DirectionEntries returns the entries of identity id in direction dir
// of subject's policy in the `policy` table, in key order.
func DirectionEntries(txn statedb.ReadTxn, entries statedb.Table[*Entry], subject, id identity.Number, dir Direction) iter.Seq[*Entry] {
	return prefixEntries(txn, entries, Key{Subject: subject, Identity: id, Direction: dir}.indexKey()[:9])
}

// prefixEntries returns the entries whose index key starts with prefix,
// in key order.
func prefixEntries(txn statedb.ReadTxn, entries statedb.Table[*Entry], prefix index.Key) iter.Seq[*Entry] {
	return func(yield func(*Entry) bool) {
		for e := range entries.Prefix(txn, KeyIndex.QueryFromKey(prefix)) {
			if !yield(e) {
				return
			}
		}
	}
}

// NewEntryTable creates and registers the desired `policy` table. Only
// the selector job writes its entries; the datapath reconciler writes
// their status through [ReconcilerTable].
func NewEntryTable(db *statedb.DB) (statedb.RWTable[*Entry], error) {
	return statedb.NewTable(db, TableName, KeyIndex)
}

// ReconcilerTable is the `policy` table for the datapath's
// reconciler, which writes the reconciliation status of entries through
// it. Nothing else writes through it: entries are the selector job's.
type ReconcilerTable struct {
	statedb.RWTable[*Entry]
}

// Enforcement is a row of the `policy-enforcement` table: how a direction
// is enforced (docs/CONTRACT.md, "Policy semantics"). Enforced (default
// deny): only what the `policy` table allows passes, and its deny entries
// drop; a direction is enforced when a policy in force has allow or deny
// rules in it, unless each such rule's policy says enableDefaultDeny false
// for it, or by --enable-policy=always. HasDeny: a policy in force has
// deny rules in the direction. Not Enforced but HasDeny: packets are
// looked up, a deny drops, everything else passes. Neither (or
// --enable-policy=never): everything passes. Once the table is
// initialized it has a row for each direction.
//
// Subject is the local endpoint identity whose enforcement the row is; 0
// is the host-wide default's.
type Enforcement struct {
	Subject   identity.Number `json:"subject,omitempty" yaml:"subject,omitempty"`
	Direction Direction       `json:"direction" yaml:"direction"`
	Enforced  bool            `json:"enforced" yaml:"enforced"`
	HasDeny   bool            `json:"hasDeny,omitempty" yaml:"hasDeny,omitempty"`

	// Status is the datapath's reconciliation status of the row.
	Status reconciler.Status `json:"status" yaml:"status"`
}

// TableHeader implements statedb.TableWritable.
func (*Enforcement) TableHeader() []string {
	return []string{"Subject", "Direction", "Enforced", "HasDeny", "Status"}
}

// TableRow implements statedb.TableWritable.
func (e *Enforcement) TableRow() []string {
	return []string{e.Subject.String(), e.Direction.String(), strconv.FormatBool(e.Enforced), strconv.FormatBool(e.HasDeny), e.Status.String()}
}

// strictness orders what the row lets through: 0 everything (not
// enforced), 1 all but deny entries, 2 only allow entries (default deny).
func (e *Enforcement) Strictness() int {
	switch {
	case e.Enforced:
		return 2
	case e.HasDeny:
		return 1
	}
	return 0
}

// Clone returns a shallow copy, for the reconciler.
func (e *Enforcement) Clone() *Enforcement {
	c := *e
	return &c
}

// GetStatus returns the reconciliation status, for the reconciler.
func (e *Enforcement) GetStatus() reconciler.Status { return e.Status }

// SetStatus sets the reconciliation status, for the reconciler.
func (e *Enforcement) SetStatus(status reconciler.Status) *Enforcement {
	e.Status = status
	return e
}

// EnforcementKey is the key of a `policy-enforcement` row: a subject's
// direction.
type EnforcementKey struct {
	Subject   identity.Number
	Direction Direction
}

// Key returns the row's key.
func (e *Enforcement) Key() EnforcementKey {
	return EnforcementKey{Subject: e.Subject, Direction: e.Direction}
}

func (k EnforcementKey) indexKey() index.Key {
	key := make(index.Key, 5)
	binary.BigEndian.PutUint32(key, uint32(k.Subject))
	key[4] = byte(k.Direction)
	return key
}

// EnforcementIndex is the primary index of `policy-enforcement`: the
// subject, then the direction. From a string: "[subject:]direction"
// ("egress" is the host-wide default's), or a subject alone ("300:")
// for both its directions.
var EnforcementIndex = statedb.Index[*Enforcement, EnforcementKey]{
	Name: "direction",
	FromObject: func(e *Enforcement) index.KeySet {
		return index.NewKeySet(e.Key().indexKey())
	},
	FromKey: EnforcementKey.indexKey,
	FromString: func(s string) (index.Key, error) {
		var k EnforcementKey
		if subject, dir, ok := strings.Cut(s, ":"); ok {
			n, err := strconv.ParseUint(subject, 10, 32)
			if err != nil {
				return nil, fmt.Errorf("parse enforcement key %q: subject: %w", s, err)
			}
			k.Subject, s = identity.Number(n), dir
			if s == "" {
				return k.indexKey()[:4], nil
			}
		}
		d, err := ParseDirection(s)
		if err != nil {
			return nil, err
		}
		k.Direction = d
		return k.indexKey(), nil
	},
	Unique: true,
}

// NewEnforcementTable creates and registers the `policy-enforcement`
// table.
func NewEnforcementTable(db *statedb.DB) (statedb.RWTable[*Enforcement], error) {
	return statedb.NewTable(db, EnforcementTableName, EnforcementIndex)
}

// EnforcementReconcilerTable is the `policy-enforcement` table for the
// datapath's reconciler (see [ReconcilerTable]).
type EnforcementReconcilerTable struct {
	statedb.RWTable[*Enforcement]
}

var (
	_ statedb.TableWritable = &Entry{}
	_ statedb.TableWritable = &Enforcement{}
)

// MapCapacity is how many entries the policy map holds
// (--policy-map-max-entries, the datapath's flag). The datapath cell
// provides it; the policy cell bounds what a file may expand to by it.
type MapCapacity uint32
