// SPDX-License-Identifier: Apache-2.0

package policycell

// PolicyFiles tells how the policy directory's files stand, for metrics.
type PolicyFiles struct{ l *loader }

func newPolicyFiles(l *loader) *PolicyFiles { return &PolicyFiles{l} }

// Counts returns how many of the directory's files are in force and how
// many rejected (their current content; their earlier policies may still
// be in force), as policy/list shows them. Both are 0 without a policy
// directory or before the first read.
func (f *PolicyFiles) Counts() (inForce, rejected int) {
	status, _ := f.l.Status()
	for _, s := range status {
		if s.Error != nil {
			rejected++
		} else {
			inForce++
		}
	}
	return inForce, rejected
}
