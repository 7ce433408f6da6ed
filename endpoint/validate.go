// SPDX-License-Identifier: Apache-2.0

package endpoint

import (
	"fmt"
	"strings"
)

// MaxAddresses is the most addresses one endpoint may have: a pod has
// one per family; a bound keeps one endpoint from filling the maps.
const MaxAddresses = 16

// Validate reports what makes ep impossible to register: a name or
// namespace that is not a Kubernetes name, labels that are not
// Kubernetes labels, no address, more than MaxAddresses, an address that
// is not a unicast address, an interface name that is no device name.
//
// Possible errors: ErrInvalid (wrapped, naming the field).
func (e Endpoint) Validate() error {
	if err := ValidateName(e.Namespace, 63); err != nil {
		return fmt.Errorf("%w: namespace %q: %w", ErrInvalid, e.Namespace, err)
	}
	if err := ValidateName(e.Name, 253); err != nil {
		return fmt.Errorf("%w: name %q: %w", ErrInvalid, e.Name, err)
	}
	for k, v := range e.Labels {
		if err := ValidateLabel(k, v); err != nil {
			return fmt.Errorf("%w: label %s=%s: %w", ErrInvalid, k, v, err)
		}
	}
	switch {
	case len(e.Addresses) == 0:
		return fmt.Errorf("%w: no address", ErrInvalid)
	case len(e.Addresses) > MaxAddresses:
		return fmt.Errorf("%w: %d addresses, at most %d", ErrInvalid, len(e.Addresses), MaxAddresses)
	case len(e.Interface) > 15 || strings.ContainsAny(e.Interface, "/ \t\n:"):
		return fmt.Errorf("%w: interface %q is not a network device name", ErrInvalid, e.Interface)
	}
	seen := make(map[string]bool, len(e.Addresses))
	for _, a := range e.Addresses {
		switch {
		case !a.IsValid() || a.Zone() != "":
			return fmt.Errorf("%w: address %q", ErrInvalid, a)
		case a.Is4In6():
			return fmt.Errorf("%w: address %s: an IPv4-mapped IPv6 address, give the IPv4 address", ErrInvalid, a)
		case a.IsUnspecified() || a.IsMulticast() || a.IsLoopback():
			return fmt.Errorf("%w: address %s is not a unicast address", ErrInvalid, a)
		case seen[a.String()]:
			return fmt.Errorf("%w: address %s given twice", ErrInvalid, a)
		}
		seen[a.String()] = true
	}
	if e.Node != "" {
		if err := ValidateName(e.Node, 253); err != nil {
			return fmt.Errorf("%w: node %q: %w", ErrInvalid, e.Node, err)
		}
	}
	return nil
}

// ValidateName reports whether name is a Kubernetes object name of at
// most max characters: lower-case letters, digits, '-' and '.', starting
// and ending with a letter or digit (RFC 1123).
//
// Possible errors: one saying what is wrong.
func ValidateName(name string, max int) error {
	switch {
	case name == "":
		return fmt.Errorf("empty")
	case len(name) > max:
		return fmt.Errorf("longer than %d characters", max)
	case !alnum(name[0], false) || !alnum(name[len(name)-1], false):
		return fmt.Errorf("must start and end with a lower-case letter or digit")
	}
	for i := range len(name) {
		if c := name[i]; !alnum(c, false) && c != '-' && (c != '.' || max == 63) {
			return fmt.Errorf("character %q: want lower-case letters, digits and '-'", c)
		}
	}
	return nil
}

// ValidateLabel reports whether key=value is a Kubernetes label: the key
// an optional DNS-subdomain prefix and '/', then a name of at most 63
// letters, digits, '-', '_' and '.', starting and ending with a letter
// or digit; the value empty or such a name.
//
// Possible errors: one saying what is wrong.
func ValidateLabel(key, value string) error {
	name := key
	if prefix, rest, ok := strings.Cut(key, "/"); ok {
		if err := ValidateName(prefix, 253); err != nil {
			return fmt.Errorf("key prefix %q: %w", prefix, err)
		}
		name = rest
	}
	if err := labelName(name); err != nil {
		return fmt.Errorf("key %q: %w", key, err)
	}
	if value == "" {
		return nil
	}
	if err := labelName(value); err != nil {
		return fmt.Errorf("value %q: %w", value, err)
	}
	return nil
}

func labelName(s string) error {
	switch {
	case s == "":
		return fmt.Errorf("empty")
	case len(s) > 63:
		return fmt.Errorf("longer than 63 characters")
	case !alnum(s[0], true) || !alnum(s[len(s)-1], true):
		return fmt.Errorf("must start and end with a letter or digit")
	}
	for i := range len(s) {
		if c := s[i]; !alnum(c, true) && c != '-' && c != '_' && c != '.' {
			return fmt.Errorf("character %q: want letters, digits, '-', '_' and '.'", c)
		}
	}
	return nil
}

func alnum(c byte, upper bool) bool {
	return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || upper && c >= 'A' && c <= 'Z'
}
