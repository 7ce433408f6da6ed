// SPDX-License-Identifier: Apache-2.0

package policy

import "net/netip"

// WorldPrefixes are the "prefixes" of world: an all-addresses CIDR selects
// it, and an except prefix excludes it only if it is all addresses too. A
// policy's world entity stands for them.
func WorldPrefixes() []netip.Prefix {
	return []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}
}
