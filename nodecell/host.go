// SPDX-License-Identifier: Apache-2.0

package nodecell

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/ipcache-agent/ipcache-agent/internal/resubscribe"
	"github.com/vishvananda/netlink"
)

// hostDebounce is how long the follower gathers address updates before it
// writes them: a link coming up brings several addresses (IPv4, its IPv6
// link-local, then a global one after duplicate address detection), which
// then go into the ipcache together.
const hostDebounce = 50 * time.Millisecond

// listAttempts bounds the listings tried in a row when the kernel
// interrupts the dump (addresses changed while it was read).
const listAttempts = 5

// linkAddress is an address on one link: an address on two links stays a
// host address until it is on none.
type linkAddress struct {
	addr  netip.Addr
	index int
}

// hostFollower keeps the host addresses of Nodes from netlink.
type hostFollower struct {
	nodes    *Nodes
	log      *slog.Logger
	debounce time.Duration
	// initDone is the ipcache producer's done, called once the first
	// listing is written.
	initDone func()
}

// run follows the addresses until ctx ends, subscribing and listing again
// after each failure of the subscription.
func (f *hostFollower) run(ctx context.Context, health cell.Health) error {
	return resubscribe.Run(ctx, health, f.log, "this node's addresses", f.follow)
}

// follow subscribes to address updates, lists the addresses, and applies
// the updates until the subscription fails or ctx ends. It subscribes
// before it lists, so that no change between the two is missed: updates
// older than the listing are applied after it, in order, and leave the
// set as the last of them says.
//
// Possible errors: the subscription, the listing or a write to the
// ipcache fails (wrapped), or the subscription ends (its receive failed,
// e.g. ENOBUFS on an overrun).
func (f *hostFollower) follow(ctx context.Context, health cell.Health) (listed bool, err error) {
	updates := make(chan netlink.AddrUpdate, 256)
	done := make(chan struct{})
	failed := make(chan error, 1)
	err = netlink.AddrSubscribeWithOptions(updates, done, netlink.AddrSubscribeOptions{
		ErrorCallback: func(err error) {
			select {
			case failed <- err:
			default:
			}
		},
	})
	if err != nil {
		close(done)
		return false, fmt.Errorf("subscribe to address updates: %w", err)
	}
	defer func() {
		close(done)
		// The subscription's goroutine closes updates once its socket
		// is closed; it must not stay blocked on a send.
		for range updates {
		}
	}()

	held, err := listAddresses()
	if err != nil {
		return false, err
	}
	if err := f.write(held); err != nil {
		return false, err
	}
	f.initDone()
	health.OK(fmt.Sprintf("Following %d addresses of this node", len(held)))

	var flush <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return true, nil
		case err := <-failed:
			return true, fmt.Errorf("address updates: %w", err)
		case u, ok := <-updates:
			if !ok {
				return true, errors.New("address updates: subscription ended")
			}
			addr, ok := netip.AddrFromSlice(u.LinkAddress.IP)
			if !ok {
				continue
			}
			la := linkAddress{addr.Unmap(), u.LinkIndex}
			if u.NewAddr {
				held[la] = struct{}{}
			} else {
				delete(held, la)
			}
			if flush == nil {
				flush = time.After(f.debounce)
			}
		case <-flush:
			flush = nil
			if err := f.write(held); err != nil {
				return true, err
			}
			health.OK(fmt.Sprintf("Following %d addresses of this node", len(held)))
		}
	}
}

// write gives Nodes the addresses of held.
func (f *hostFollower) write(held map[linkAddress]struct{}) error {
	addrs := make(map[netip.Addr]struct{}, len(held))
	for la := range held {
		addrs[la.addr] = struct{}{}
	}
	if err := f.nodes.setLinkAddresses(addrs); err != nil {
		return fmt.Errorf("write this node's addresses: %w", err)
	}
	return nil
}

// listAddresses lists every address of every link, IPv4 and IPv6.
//
// Possible errors: the listing fails, or the kernel interrupted it
// listAttempts times in a row (wrapped).
func listAddresses() (map[linkAddress]struct{}, error) {
	var (
		addrs []netlink.Addr
		err   error
	)
	for range listAttempts {
		addrs, err = netlink.AddrList(nil, netlink.FAMILY_ALL)
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("list addresses: %w", err)
	}
	held := make(map[linkAddress]struct{}, len(addrs))
	for _, a := range addrs {
		if a.IPNet == nil {
			continue
		}
		if addr, ok := netip.AddrFromSlice(a.IP); ok {
			held[linkAddress{addr.Unmap(), a.LinkIndex}] = struct{}{}
		}
	}
	return held, nil
}
