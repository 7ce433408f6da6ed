// SPDX-License-Identifier: Apache-2.0

// Package monitorcell streams the enforcement program's events: the drop
// and verdict events the program writes to its ring buffer, read only
// while a monitor client is subscribed ([Hub.Subscribe]), the DNS proxy's
// events, published through the events.DNSPublisher it provides
// ([Hub.PublishDNS], [Hub.SubscribeDNS]), and the shell's `monitor`
// ([Command]) and `datapath/events-lost` commands that show them
// (README.md).
//
// Reads: the loaded program's ring buffer, events_mask and event_state
// through the events.Source the datapath provides; the `identities` table
// (identitycell) for an event's labels, the `endpoints` table for the
// name of its local endpoint and the `policy` table for the policies
// and rules behind a verdict, all optional, also for the filters
// (filter.go). Writes: the program's
// events_mask, only while a client is subscribed. It owns no table.
package monitorcell
