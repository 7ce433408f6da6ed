// SPDX-License-Identifier: Apache-2.0

// Package labels implements the label sets that determine a local security
// identity.
//
// A label is "source:value", for example "cidr:10.0.0.0/8" or
// "reserved:world". A [Labels] value is an immutable, sorted set of labels with
// a canonical string form ("cidr:10.0.0.0/8,reserved:world"), so that two sets
// with the same members compare equal and can be used as a map or index key.
//
// The package belongs to no cell: the identity allocator keys identities by
// label set, the ipcache merges the label sets of a prefix's owners, and the
// policy selectors read the cidr labels back.
package labels
