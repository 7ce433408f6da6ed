// SPDX-License-Identifier: Apache-2.0

// Package events is the vocabulary of the enforcement program's monitor
// events that the datapath, the monitor and the metrics share: what a
// subscriber asks for ([Kinds], the program's events_mask), why the
// program decided ([Reason], and [DropReasons], the slots of its counters),
// one decoded event ([Event], [Decode]) and what the datapath hands the
// monitor to read them ([Source]); and the DNS proxy's events, published
// from user space ([DNS], through a [DNSPublisher] the monitor provides).
//
// It is a leaf: it imports no cell. The layout of a ring-buffer record is
// the program's struct event (datapathcell/bpf/enforce.c, docs/CONTRACT.md
// "Monitor events"); the datapath loads the program and provides its
// [Source]; the monitor cell reads it.
package events
