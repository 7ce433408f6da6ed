// SPDX-License-Identifier: Apache-2.0

package policy

import (
	"encoding"
	"fmt"
	"strconv"
)

// The enums of the table rows (`policy`, `policy-enforcement`,
// `policies`) marshal as their names, so that `db/show --format=json` and
// `--format=yaml` say "egress", "TCP" and "deny" rather than the map's
// numbers. Unmarshalling takes the names and, as rows written before
// (db/insert files) have them, the numbers.
var (
	_ encoding.TextMarshaler   = Direction(0)
	_ encoding.TextUnmarshaler = (*Direction)(nil)
	_ encoding.TextMarshaler   = Protocol(0)
	_ encoding.TextUnmarshaler = (*Protocol)(nil)
	_ encoding.TextMarshaler   = Verdict(0)
	_ encoding.TextUnmarshaler = (*Verdict)(nil)
)

// MarshalText returns String's "ingress" or "egress".
//
// Possible errors: none.
func (d Direction) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalText parses "ingress", "egress" or the direction's number.
//
// Possible errors: an unknown direction.
func (d *Direction) UnmarshalText(text []byte) error {
	if n, err := strconv.ParseUint(string(text), 10, 8); err == nil {
		*d = Direction(n)
		return nil
	}
	parsed, err := ParseDirection(string(text))
	if err != nil {
		return err
	}
	*d = parsed
	return nil
}

// MarshalText returns String's name ("any", "TCP", ...), or the number
// of a protocol without one.
//
// Possible errors: none.
func (p Protocol) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

// UnmarshalText parses what ParseProtocol does: a name or a number.
//
// Possible errors: an unknown protocol name or a number out of range.
func (p *Protocol) UnmarshalText(text []byte) error {
	parsed, err := ParseProtocol(string(text))
	if err != nil {
		return err
	}
	*p = parsed
	return nil
}

// MarshalText returns String's "allow", "deny" or "dns-proxy", or the
// number of another value.
//
// Possible errors: none.
func (v Verdict) MarshalText() ([]byte, error) { return []byte(v.String()), nil }

// UnmarshalText parses "allow", "deny", "dns-proxy" or a number.
//
// Possible errors: neither a verdict's name nor a number.
func (v *Verdict) UnmarshalText(text []byte) error {
	switch s := string(text); s {
	case VerdictAllow.String():
		*v = VerdictAllow
	case VerdictDeny.String():
		*v = VerdictDeny
	case VerdictDNSProxy.String():
		*v = VerdictDNSProxy
	default:
		n, err := strconv.ParseUint(s, 10, 32)
		if err != nil {
			return fmt.Errorf("verdict %q: want allow, deny, dns-proxy or a number", s)
		}
		*v = Verdict(n)
	}
	return nil
}
