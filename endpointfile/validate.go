// SPDX-License-Identifier: Apache-2.0

package endpointfile

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// The lengths Kubernetes allows: an object name that is a DNS subdomain,
// one that is a DNS label (a namespace), a label key's name part and a
// label value.
const (
	maxSubdomainLength = 253
	maxLabelLength     = 63
	maxLabelNameLength = 63
	maxLabelValue      = 63

	// maxInterfaceLength is Linux's limit on a device name (IFNAMSIZ
	// without the terminating NUL).
	maxInterfaceLength = 15
)

func isLowerAlnum(c byte) bool { return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' }

func isAlnum(c byte) bool { return isLowerAlnum(c) || c >= 'A' && c <= 'Z' }

// validateDNSName accepts a Kubernetes object name: a DNS subdomain (DNS
// labels joined by '.') when subdomain, else one DNS label; a DNS label is
// lower-case letters, digits and '-', starting and ending with a letter or
// digit.
func validateDNSName(name string, maxLength int, subdomain bool) error {
	if name == "" {
		return errors.New("must not be empty")
	}
	if len(name) > maxLength {
		return fmt.Errorf("%q is longer than %d characters", name, maxLength)
	}
	for i := range len(name) {
		if c := name[i]; !isLowerAlnum(c) && c != '-' && (c != '.' || !subdomain) {
			want := "lower-case letters, digits, '-' or '.'"
			if !subdomain {
				want = "lower-case letters, digits or '-'"
			}
			return fmt.Errorf("%q: character %q not allowed, want %s", name, c, want)
		}
	}
	for label := range strings.SplitSeq(name, ".") {
		if label == "" || !isLowerAlnum(label[0]) || !isLowerAlnum(label[len(label)-1]) {
			return fmt.Errorf("%q: each part between dots must start and end with a letter or digit", name)
		}
	}
	return nil
}

// validateLabelName accepts the name part of a label key, or a label
// value when it is not empty: letters, digits, '-', '_' and '.', starting
// and ending with a letter or digit.
func validateLabelName(s string, maxLength int) error {
	if len(s) > maxLength {
		return fmt.Errorf("%q is longer than %d characters", s, maxLength)
	}
	for i := range len(s) {
		if c := s[i]; !isAlnum(c) && c != '-' && c != '_' && c != '.' {
			return fmt.Errorf("%q: character %q not allowed, want letters, digits, '-', '_' or '.'", s, c)
		}
	}
	if !isAlnum(s[0]) || !isAlnum(s[len(s)-1]) {
		return fmt.Errorf("%q must start and end with a letter or digit", s)
	}
	return nil
}

// validateLabelKey accepts a Kubernetes label key: a name, optionally
// prefixed by a DNS subdomain and '/' ("app", "app.kubernetes.io/name").
func validateLabelKey(key string) error {
	if strings.Count(key, "/") > 1 {
		return fmt.Errorf("%q: at most one '/' (between a prefix and the name)", key)
	}
	prefix, name, hasPrefix := strings.Cut(key, "/")
	if !hasPrefix {
		name, prefix = prefix, ""
	}
	if hasPrefix {
		if prefix == "" {
			return fmt.Errorf("%q: the prefix before '/' must not be empty", key)
		}
		if err := validateDNSName(prefix, maxSubdomainLength, true); err != nil {
			return fmt.Errorf("prefix: %w", err)
		}
	}
	if name == "" {
		return fmt.Errorf("%q: the name must not be empty", key)
	}
	return validateLabelName(name, maxLabelNameLength)
}

// validateLabelValue accepts a Kubernetes label value: empty, or a label
// name of at most 63 characters.
func validateLabelValue(value string) error {
	if value == "" {
		return nil
	}
	return validateLabelName(value, maxLabelValue)
}

// validateInterface accepts a Linux device name.
func validateInterface(name string) error {
	if name == "" || name == "." || name == ".." {
		return fmt.Errorf("%q is not a device name", name)
	}
	if len(name) > maxInterfaceLength {
		return fmt.Errorf("%q is longer than %d characters", name, maxInterfaceLength)
	}
	for i := range len(name) {
		if c := name[i]; c == '/' || c == ':' || c <= ' ' || c == 0x7f {
			return fmt.Errorf("%q: character %q not allowed in a device name", name, c)
		}
	}
	return nil
}

// parseAddress parses an endpoint's or a node's address: an IPv4 or IPv6
// address (an IPv4-mapped IPv6 address is its IPv4 address), not
// unspecified or multicast, without a zone.
func parseAddress(s string) (netip.Addr, error) {
	addr, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%q is not an IP address", s)
	}
	switch {
	case addr.Zone() != "":
		return netip.Addr{}, fmt.Errorf("%q: an address with a zone is not an endpoint's", s)
	case addr.IsUnspecified(), addr.IsMulticast():
		return netip.Addr{}, fmt.Errorf("%q: an unspecified or multicast address is not an endpoint's", s)
	}
	return addr.Unmap(), nil
}
