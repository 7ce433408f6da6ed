// SPDX-License-Identifier: Apache-2.0

package policycell

import "fmt"

// unsupportedByEnforcement returns the error for the first rule of p (in
// direction and rule order) that the selectors and the policy map of this
// version cannot enforce as Cilium would, nil if there is none. The
// parsers read these constructs into the model in full; this one function
// keeps them out of force until the datapath honours them, so that a file
// that is accepted is enforced exactly as written:
//
//   - deny rules (the policy map holds allow verdicts only, and lookups
//     stop at the first allow);
//   - enableDefaultDeny false (every rule makes its direction enforced);
//   - rules for every peer (toEntities/fromEntities all, toPorts or icmps
//     without CIDRs, a NetworkPolicy rule without from/to): the program
//     looks up the remote identity only, never identity 0;
//   - port ranges (the policy map is a hash of single ports);
//   - ICMP types (the program looks ICMP up without a type).
//
// Possible errors: *FileError wrapping ErrInvalidPolicy and ErrNotEnforced.
func unsupportedByEnforcement(p *Policy) error {
	for _, dir := range Directions() {
		for _, rule := range p.Rules(dir) {
			if what := notEnforced(dir, rule); what != "" {
				name, line := rule.Name, rule.Line
				if name == "" {
					name = dir.String()
				}
				if line == 0 {
					line = p.Line
				}
				return &FileError{File: p.File, Line: line, Err: fmt.Errorf("%w: policy %q: %s: %s are %w",
					ErrInvalidPolicy, p.Name, name, what, ErrNotEnforced)}
			}
		}
	}
	return nil
}

// notEnforced names what of rule this version cannot enforce, "" if
// nothing.
func notEnforced(dir Direction, rule Rule) string {
	switch {
	case rule.Deny:
		return fmt.Sprintf("deny rules (%sDeny)", dir)
	case rule.NoDefaultDeny:
		return fmt.Sprintf("rules without default deny (enableDefaultDeny: {%s: false})", dir)
	case rule.AnyPeer:
		return "rules for every peer (entity all, or ports without CIDRs)"
	}
	for _, port := range rule.Ports {
		switch {
		case port.Protocol == ProtocolICMP || port.Protocol == ProtocolICMPv6:
			return "ICMP type rules (icmps)"
		case port.EndPort != 0:
			return "port ranges (endPort)"
		}
	}
	return ""
}
