// SPDX-License-Identifier: Apache-2.0

package devicecell

import (
	"context"
	"fmt"
	"log/slog"
	"net"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/ipcache-agent/ipcache-agent/internal/resubscribe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// updateBatch bounds how many link updates one write transaction applies:
// updates that are already queued go in together, so a burst of devices
// costs one commit per batch, and a reader is woken once.
const updateBatch = 256

// controller writes the `devices` table from netlink.
type controller struct {
	db    *statedb.DB
	table statedb.RWTable[*Device]
	log   *slog.Logger
	// initDone marks the table initialized; called in the transaction of
	// the first listing.
	initDone    func(statedb.WriteTxn)
	initialized bool
}

// run follows the links until ctx ends, subscribing and listing again
// after each failure of the subscription.
func (c *controller) run(ctx context.Context, health cell.Health) error {
	return resubscribe.Run(ctx, health, c.log, "network devices", c.follow)
}

// follow subscribes to link updates, lists the links into the table, and
// applies the updates until the subscription fails or ctx ends. It
// subscribes before it lists, so that no change between the two is missed:
// updates older than the listing are applied after it, in order, and leave
// the table as the last of them says.
//
// Possible errors: the subscription or the listing fails (wrapped), or the
// subscription ends (its receive failed, e.g. ENOBUFS on an overrun).
func (c *controller) follow(ctx context.Context, health cell.Health) (listed bool, err error) {
	updates := make(chan netlink.LinkUpdate, updateBatch)
	done := make(chan struct{})
	failed := make(chan error, 1)
	err = netlink.LinkSubscribeWithOptions(updates, done, netlink.LinkSubscribeOptions{
		ErrorCallback: func(err error) {
			select {
			case failed <- err:
			default:
			}
		},
	})
	if err != nil {
		close(done)
		return false, fmt.Errorf("subscribe to link updates: %w", err)
	}
	defer func() {
		close(done)
		// The subscription's goroutine closes updates once its socket
		// is closed; it must not stay blocked on a send.
		for range updates {
		}
	}()

	links, err := netlink.LinkList()
	if err != nil {
		return false, fmt.Errorf("list links: %w", err)
	}
	c.replaceAll(links)
	health.OK(fmt.Sprintf("Following %d network devices", len(links)))

	for {
		select {
		case <-ctx.Done():
			return true, nil
		case err := <-failed:
			return true, fmt.Errorf("link updates: %w", err)
		case u, ok := <-updates:
			if !ok {
				return true, fmt.Errorf("link updates: subscription ended")
			}
			c.apply(u, updates)
		}
	}
}

// replaceAll makes the table hold exactly links.
func (c *controller) replaceAll(links []netlink.Link) {
	txn := c.db.WriteTxn(c.table)
	defer txn.Commit()
	listed := make(map[int]bool, len(links))
	for _, l := range links {
		listed[l.Attrs().Index] = true
	}
	for d := range c.table.All(txn) {
		if !listed[d.Index] {
			c.table.Delete(txn, d)
		}
	}
	for _, l := range links {
		c.upsert(txn, deviceOf(l))
	}
	if !c.initialized {
		c.initDone(txn)
		c.initialized = true
	}
}

// apply applies first and the updates already queued behind it, up to
// updateBatch, in one transaction.
func (c *controller) apply(first netlink.LinkUpdate, queued <-chan netlink.LinkUpdate) {
	txn := c.db.WriteTxn(c.table)
	defer txn.Commit()
	c.applyOne(txn, first)
	for range updateBatch - 1 {
		select {
		case u, ok := <-queued:
			if !ok {
				return
			}
			c.applyOne(txn, u)
		default:
			return
		}
	}
}

func (c *controller) applyOne(txn statedb.WriteTxn, u netlink.LinkUpdate) {
	// Bridge port updates (AF_BRIDGE) come on the same group; their
	// RTM_DELLINK removes a port from a bridge, not the device.
	if u.Link == nil || u.IfInfomsg.Family == unix.AF_BRIDGE {
		return
	}
	d := deviceOf(u.Link)
	switch u.Header.Type {
	case unix.RTM_NEWLINK:
		c.upsert(txn, d)
	case unix.RTM_DELLINK:
		if old, _, found := c.table.Get(txn, IndexIndex.Query(d.Index)); found {
			c.table.Delete(txn, old)
		}
	}
}

// upsert writes d, first removing the row of another device under its
// name: the kernel allows one device of a name at a time, so that row is
// of a device whose deletion is not applied yet.
func (c *controller) upsert(txn statedb.WriteTxn, d *Device) {
	if old, _, found := c.table.Get(txn, NameIndex.Query(d.Name)); found && old.Index != d.Index {
		c.table.Delete(txn, old)
	}
	c.table.Insert(txn, d)
}

// deviceOf is the row of a link.
func deviceOf(l netlink.Link) *Device {
	a := l.Attrs()
	return &Device{
		Index:        a.Index,
		Name:         a.Name,
		Kind:         l.Type(),
		Ethernet:     a.EncapType == "ether",
		Up:           a.Flags&net.FlagUp != 0,
		HardwareAddr: a.HardwareAddr,
	}
}
