// SPDX-License-Identifier: Apache-2.0

package datapathcell

import "errors"

var (
	// ErrPolicyEntriesNotWritten is the error of an ipcache entry that is
	// held back because some policy entry of its identity could not be
	// written to the policy map (a full map): the ipcache map keeps the
	// prefix's old value, which the policy map still allows, until the
	// policy entry is written.
	ErrPolicyEntriesNotWritten = errors.New("policy entries of the identity are not in the policy map")

	// ErrMapsNotOpen is returned by what reads the pinned maps (Counters,
	// ConntrackFull, the maps policy/explain looks up), and by
	// SetDNSProxyPort, before
	// the datapath has opened them at start or after it closed them at
	// stop.
	ErrMapsNotOpen = errors.New("pinned maps are not open")

	// ErrMapDiffers is the error of bpf/ipcache --diff and bpf/policy
	// --diff when the pinned map is not what its desired table says, so
	// that a script reading them has an exit status to test.
	ErrMapDiffers = errors.New("the pinned map differs")

	// ErrTooManySubjects is the error of the policy entries of a subject
	// (a local endpoint's identity) beyond the number of subjects the
	// datapath keeps a policy map for; its endpoints are held back.
	ErrTooManySubjects = errors.New("too many endpoint identities with a policy of their own")

	// ErrDeviceNotFound is the error of an endpoint whose device does not
	// exist: its entries wait for the device.
	ErrDeviceNotFound = errors.New("endpoint device not found")

	// ErrNegativeLimit is the error of a negative --limit.
	ErrNegativeLimit = errors.New("must not be negative")

	// ErrNoDevice is the error of attaching the program to a device that
	// does not exist (yet): the datapath attaches it once it appears.
	ErrNoDevice = errors.New("no such device")

	// ErrNotEthernet is the error of attaching the program to a device
	// whose framing is not Ethernet, which the program cannot read.
	ErrNotEthernet = errors.New("not an Ethernet device")

	// errWordsNotMapped is the error of writing the program's
	// endpoint_words when they are not mapped: the enforcer was closed,
	// or its .bss does not hold them whole and aligned.
	errWordsNotMapped = errors.New("endpoint words not mapped")
)
