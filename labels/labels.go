// SPDX-License-Identifier: Apache-2.0

package labels

import (
	"fmt"
	"iter"
	"net/netip"
	"slices"
	"strings"

	"github.com/ipcache-agent/ipcache-agent/internal/prefixkey"
)

const (
	// SourceCIDR is the source of labels that name an IP prefix, for example
	// "cidr:10.0.0.0/8". The value is a prefix in canonical form.
	SourceCIDR = "cidr"

	// SourceReserved is the source of labels of reserved identities, for
	// example "reserved:world".
	SourceReserved = "reserved"

	separator = ","
)

// Labels is an immutable set of labels. The zero value is the empty set.
//
// Labels is comparable: two sets with the same members are ==.
type Labels struct {
	// canonical is the sorted, de-duplicated labels joined by separator;
	// or, for a set that is one prefix's cidr label alone, the prefix's
	// key (package prefixkey), which starts with a byte no label text can
	// (validate refuses control characters). There is such a set per CIDR
	// identity, one per prefix in the ipcache: its text cost an allocation
	// three times the key's per prefix, and the identities' labels index
	// keys the set by these very bytes (PrefixKey). Every constructor packs
	// such a set, so that == still compares members.
	canonical string
}

// fromSorted returns the set of sorted, de-duplicated labels, packed when
// it is one cidr label.
func fromSorted(labels []string) Labels {
	if len(labels) == 1 {
		if packed, ok := packCIDR(labels[0]); ok {
			return packed
		}
	}
	return Labels{canonical: strings.Join(labels, separator)}
}

// packCIDR returns the packed set of a valid cidr label, or false for any
// other label.
func packCIDR(label string) (Labels, bool) {
	value, ok := strings.CutPrefix(label, SourceCIDR+":")
	if !ok {
		return Labels{}, false
	}
	prefix, err := netip.ParsePrefix(value)
	if err != nil {
		return Labels{}, false
	}
	return ForPrefix(prefix), true
}

// packed returns the prefix of a packed set.
func (l Labels) packed() (netip.Prefix, bool) {
	if l.canonical == "" || l.canonical[0] >= ' ' {
		return netip.Prefix{}, false
	}
	return prefixkey.Parse(l.canonical)
}

// New returns the set of the given labels.
//
// Possible errors: ErrInvalidLabel (wrapped, naming the label).
func New(labels ...string) (Labels, error) {
	for _, l := range labels {
		if err := validate(l); err != nil {
			return Labels{}, err
		}
	}
	sorted := slices.Clone(labels)
	slices.Sort(sorted)
	return fromSorted(slices.Compact(sorted)), nil
}

// Parse parses the comma-separated form produced by [Labels.String]. The
// empty string is the empty set.
//
// Possible errors: ErrInvalidLabel (wrapped, naming the label).
func Parse(s string) (Labels, error) {
	if s == "" {
		return Labels{}, nil
	}
	if !strings.Contains(s, separator) {
		// One label (a CIDR identity's, nearly every identity at scale):
		// it is its own canonical form, no list to split, sort and join.
		if err := validate(s); err != nil {
			return Labels{}, err
		}
		return fromSorted([]string{s}), nil
	}
	return New(strings.Split(s, separator)...)
}

// ForPrefix returns the set holding the cidr label of the given prefix, in
// canonical form (host bits cleared).
func ForPrefix(prefix netip.Prefix) Labels {
	prefix = prefix.Masked()
	if !prefix.IsValid() {
		return Labels{canonical: CIDRLabel(prefix)} // as it always read
	}
	var buf [maxPrefixKeyLen]byte
	return Labels{canonical: string(prefixkey.Append(buf[:0], prefix))}
}

// ForPrefixKey returns the set holding the cidr label of the prefix whose
// key (package prefixkey) is key, as ForPrefix does, but holding key
// itself rather than a copy: the caller must never change key's bytes. A
// table row that is keyed by a prefix's key can so give its prefix's
// identity its label without an allocation of its own (ipcachecell).
// False when key is not the key of a masked prefix.
func ForPrefixKey(key string) (Labels, bool) {
	prefix, ok := prefixkey.Parse(key)
	if !ok || prefix != prefix.Masked() {
		return Labels{}, false
	}
	return Labels{canonical: key}, true
}

// maxPrefixKeyLen is the longest prefix key, an IPv6 prefix's.
const maxPrefixKeyLen = 1 + 16 + 1

// PrefixKey returns, for a set that is one prefix's cidr label alone, the
// prefix's key (package prefixkey), and "" for any other set. The set
// holds these bytes instead of the label's text: the identities' labels
// index keys such a set by its prefix key, and shares them.
func (l Labels) PrefixKey() string {
	if _, ok := l.packed(); ok {
		return l.canonical
	}
	return ""
}

// OnlyPrefix returns the prefix of a set that is one cidr label alone, and
// false for any other set.
func (l Labels) OnlyPrefix() (netip.Prefix, bool) { return l.packed() }

// CIDRLabel returns the cidr label of the prefix, with host bits cleared.
func CIDRLabel(prefix netip.Prefix) string {
	// Built on the stack and copied once: there is one per prefix in the
	// ipcache, and the prefix's String and the concatenation were two
	// allocations.
	prefix = prefix.Masked()
	if !prefix.IsValid() {
		return SourceCIDR + ":" + prefix.String() // as it always read
	}
	var buf [maxCIDRLabelLen]byte
	return string(prefix.AppendTo(append(buf[:0], SourceCIDR+":"...)))
}

// IsForPrefix reports whether the set is exactly ForPrefix(prefix), without
// building its label.
func (l Labels) IsForPrefix(prefix netip.Prefix) bool {
	prefix = prefix.Masked()
	if !prefix.IsValid() {
		return l.canonical == CIDRLabel(prefix)
	}
	var buf [maxPrefixKeyLen]byte
	return l.canonical == string(prefixkey.Append(buf[:0], prefix)) // compared without a copy
}

// maxCIDRLabelLen is the longest cidr label, IPv6 text being longer than
// IPv4's.
const maxCIDRLabelLen = len(SourceCIDR + ":ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128")

func validate(label string) error {
	source, value, ok := strings.Cut(label, ":")
	switch {
	case !ok || source == "" || value == "":
		return fmt.Errorf("%w %q: want source:value", ErrInvalidLabel, label)
	case strings.ContainsAny(label, separator+" \t\n"):
		return fmt.Errorf("%w %q: contains a comma or white space", ErrInvalidLabel, label)
	case strings.ContainsFunc(label, func(r rune) bool { return r < ' ' || r == 0x7f }):
		// A set's packed form starts with a control character (Labels).
		return fmt.Errorf("%w %q: contains a control character", ErrInvalidLabel, label)
	case source == SourceCIDR:
		prefix, err := netip.ParsePrefix(value)
		if err != nil {
			return fmt.Errorf("%w %q: %w", ErrInvalidLabel, label, err)
		}
		if prefix != prefix.Masked() {
			return fmt.Errorf("%w %q: host bits set, want %s", ErrInvalidLabel, label, CIDRLabel(prefix))
		}
		// One prefix, one label: "2001:DB8::/32" or "2001:db8:0::/32"
		// would be a label set other than ForPrefix's, so another identity.
		var buf [maxCIDRLabelLen]byte
		if value != string(prefix.AppendTo(buf[:0])) { // compared without a copy
			return fmt.Errorf("%w %q: not in canonical form, want %s", ErrInvalidLabel, label, CIDRLabel(prefix))
		}
	}
	return nil
}

// String returns the canonical form: the sorted labels joined by commas.
func (l Labels) String() string {
	if prefix, ok := l.packed(); ok {
		return CIDRLabel(prefix)
	}
	return l.canonical
}

// AppendText implements encoding.TextAppender: it appends String's form
// to b, without building it first.
//
// Possible errors: none (the error is the interface's).
func (l Labels) AppendText(b []byte) ([]byte, error) {
	if prefix, ok := l.packed(); ok {
		return prefix.AppendTo(append(b, SourceCIDR+":"...)), nil
	}
	return append(b, l.canonical...), nil
}

// IsEmpty reports whether the set has no labels.
func (l Labels) IsEmpty() bool { return l.canonical == "" }

// IsZero reports whether the set has no labels. YAML's omitempty asks
// it: without it, a set is a struct of no exported field, always "empty",
// and a field of labels was never written.
func (l Labels) IsZero() bool { return l.IsEmpty() }

// Len returns the number of labels in the set.
func (l Labels) Len() int {
	if l.canonical == "" {
		return 0
	}
	if _, ok := l.packed(); ok {
		return 1
	}
	return strings.Count(l.canonical, separator) + 1
}

// All returns the labels in sorted order.
func (l Labels) All() iter.Seq[string] {
	return func(yield func(string) bool) {
		if l.canonical == "" {
			return
		}
		if prefix, ok := l.packed(); ok {
			yield(CIDRLabel(prefix))
			return
		}
		for label := range strings.SplitSeq(l.canonical, separator) {
			if !yield(label) {
				return
			}
		}
	}
}

// Has reports whether the set holds the label.
func (l Labels) Has(label string) bool {
	for have := range l.All() {
		if have == label {
			return true
		}
	}
	return false
}

// Union returns the set of the labels in l or in other.
func (l Labels) Union(other Labels) Labels {
	switch {
	case other.canonical == "" || other == l:
		return l
	case l.canonical == "":
		return other
	}
	merged := slices.AppendSeq(slices.Collect(l.All()), other.All())
	slices.Sort(merged)
	return fromSorted(slices.Compact(merged))
}

// Prefixes returns the prefixes named by the set's cidr labels.
func (l Labels) Prefixes() iter.Seq[netip.Prefix] {
	return func(yield func(netip.Prefix) bool) {
		if prefix, ok := l.packed(); ok {
			yield(prefix)
			return
		}
		for label := range l.All() {
			value, ok := strings.CutPrefix(label, SourceCIDR+":")
			if !ok {
				continue
			}
			// Labels are validated on construction, so this cannot fail.
			if prefix, err := netip.ParsePrefix(value); err == nil && !yield(prefix) {
				return
			}
		}
	}
}

// AppendPrefixes appends the prefixes named by the set's cidr labels to
// dst. A prefix's own set (most identities' are) appends its prefix
// without an iterator: with room for one in dst, nothing is allocated.
func (l Labels) AppendPrefixes(dst []netip.Prefix) []netip.Prefix {
	if prefix, ok := l.packed(); ok {
		return append(dst, prefix)
	}
	return slices.AppendSeq(dst, l.Prefixes())
}

// MarshalText implements encoding.TextMarshaler (JSON, YAML and the statedb
// script commands use it).
//
// Possible errors: none (the error is the interface's).
func (l Labels) MarshalText() ([]byte, error) { return l.AppendText(nil) }

// UnmarshalText implements encoding.TextUnmarshaler, as Parse.
//
// Possible errors: ErrInvalidLabel (wrapped, naming the label).
func (l *Labels) UnmarshalText(text []byte) error {
	parsed, err := Parse(string(text))
	if err != nil {
		return err
	}
	*l = parsed
	return nil
}
