// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf/link"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/devicecell"
	"github.com/ipcache-agent/ipcache-agent/endpoint"
)

// Devices come and go: a pod or VM restart deletes its veth and creates
// one of the same name. The start hook attaches the program to the devices
// that exist then (as it always did: pins and links are reused across
// restarts); the attach-devices job then follows the `devices` table and
// attaches it to every selected device when it appears, replacing the
// stale pinned links of its previous incarnation, and removes the pins of
// devices that went, so that the pins (which `version` lists) are the
// attachments that exist. A listed device that is missing or not Ethernet
// is reported in the job's health and the log; it does not keep the others
// from being enforced.

// deviceSelection is --devices read: device names, and name prefixes
// (Cilium's wildcard form, a name ending in '+': "lxc+" selects lxc123).
type deviceSelection struct {
	names    []string
	prefixes []string
}

// wildcard ends a --devices entry that is a prefix.
const wildcard = "+"

func newDeviceSelection(devices []string) deviceSelection {
	var s deviceSelection
	for _, d := range devices {
		if prefix, ok := strings.CutSuffix(d, wildcard); ok {
			s.prefixes = append(s.prefixes, prefix)
		} else {
			s.names = append(s.names, d)
		}
	}
	return s
}

// selects reports whether the device of that name is one of the selection.
func (s deviceSelection) selects(name string) bool {
	if slices.Contains(s.names, name) {
		return true
	}
	for _, p := range s.prefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// validDeviceEntry reports whether a --devices entry is a device name or
// a prefix of one.
func validDeviceEntry(d string) bool {
	name := strings.TrimSuffix(d, wildcard)
	return name != "" && len(name) <= 15
}

// deviceAttachments are the devices the program is attached to, and why a
// device that should have it has not.
type deviceAttachments struct {
	mu sync.Mutex
	// attached is the ifindex each device had when the program was
	// attached to it, by name.
	attached map[string]int
	// problems are the selected devices without the program, by name.
	problems map[string]error
	// endpoints is set when the hive has the `endpoints` table: the
	// program is then loaded without --devices, for endpoints' devices.
	endpoints bool
}

func (a *deviceAttachments) set(name string, ifindex int, problem error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.attached == nil {
		a.attached, a.problems = map[string]int{}, map[string]error{}
	}
	delete(a.attached, name)
	delete(a.problems, name)
	switch {
	case problem != nil:
		a.problems[name] = problem
	case ifindex != 0:
		a.attached[name] = ifindex
	}
}

func (a *deviceAttachments) problem(name string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.problems[name]
}

func (a *deviceAttachments) attachedAt(name string) (int, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	index, ok := a.attached[name]
	return index, ok
}

// known are the devices attached or with a problem.
func (a *deviceAttachments) known() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	names := slices.Collect(maps.Keys(a.attached))
	for name := range a.problems {
		if _, ok := a.attached[name]; !ok {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

func (a *deviceAttachments) loadsWithoutDevices() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.endpoints
}

// report says in health which devices have the program and which
// selected ones have not.
func (a *deviceAttachments) report(health cell.Health) {
	a.mu.Lock()
	defer a.mu.Unlock()
	names := slices.Sorted(maps.Keys(a.attached))
	if len(a.problems) > 0 {
		var errs []error
		for _, name := range slices.Sorted(maps.Keys(a.problems)) {
			errs = append(errs, fmt.Errorf("%s: %w", name, a.problems[name]))
		}
		health.Degraded(fmt.Sprintf("Not enforcing on %d selected devices (enforcing on: %s)",
			len(a.problems), orNone(names)), errors.Join(errs...))
		return
	}
	health.OK("Enforcing on: " + orNone(names))
}

func orNone(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// startDevices are the devices the start hook attaches to: the --devices
// names, and the present devices that its prefixes select.
func (d *Datapath) startDevices(sel deviceSelection) []string {
	devices := slices.Clone(sel.names)
	if len(sel.prefixes) > 0 {
		ifaces, err := net.Interfaces()
		if err != nil {
			// The attach-devices job attaches them from the `devices` table.
			d.log.Warn("Cannot list devices for the --devices prefixes", "error", err)
		}
		for _, iface := range ifaces {
			if sel.selects(iface.Name) && !slices.Contains(devices, iface.Name) {
				devices = append(devices, iface.Name)
			}
		}
	}
	return devices
}

// attachAtStart attaches enf to device for the start hook: a device that
// is missing or not Ethernet is reported and skipped, any other failure is
// the start's.
func (d *Datapath) attachAtStart(enf *enforcer, device string) error {
	index, err := enf.attachDevice(device, bpfmaps.LinksDir(d.cfg.BPFRoot))
	if errors.Is(err, ErrNoDevice) || errors.Is(err, ErrNotEthernet) {
		d.log.Warn("Not enforcing policy on a listed device (attached once it appears as an Ethernet device)",
			"device", device, "error", err)
		d.devices.set(device, 0, err)
		return nil
	}
	if err != nil {
		return err
	}
	d.devices.set(device, index, nil)
	d.log.Info("Enforcing policy", "device", device)
	return nil
}

type deviceAttacherParams struct {
	cell.In

	DB       *statedb.DB
	Datapath *Datapath
	// Devices is the devices cell's (devicecell): without it, the program
	// is attached at start only.
	Devices statedb.Table[*devicecell.Device] `optional:"true"`
	// Endpoints is the endpoint cell's: the interface of every local
	// endpoint gets the program, whether --devices names it or not.
	Endpoints statedb.Table[*endpoint.State] `optional:"true"`
	Jobs      job.Group
	Log       *slog.Logger
}

// registerDeviceAttacher registers the attach-devices job.
func registerDeviceAttacher(p deviceAttacherParams) {
	if p.Endpoints != nil {
		p.Datapath.devices.mu.Lock()
		p.Datapath.devices.endpoints = true
		p.Datapath.devices.mu.Unlock()
	}
	if p.Devices == nil {
		return
	}
	a := &deviceAttacher{db: p.DB, d: p.Datapath, devices: p.Devices, endpoints: p.Endpoints, log: p.Log,
		sel: newDeviceSelection(p.Datapath.cfg.Devices)}
	p.Jobs.Add(job.OneShot("attach-devices", a.run))
}

// deviceAttacher is the attach-devices job.
type deviceAttacher struct {
	db        *statedb.DB
	d         *Datapath
	devices   statedb.Table[*devicecell.Device]
	endpoints statedb.Table[*endpoint.State] // nil without the endpoint cell
	sel       deviceSelection
	log       *slog.Logger
}

// The wait before a failed attach is tried again, when no change of the
// tables comes first.
const (
	attachRetryMin = 100 * time.Millisecond
	attachRetryMax = 10 * time.Second
)

// run attaches the program as the tables change, until ctx ends.
func (a *deviceAttacher) run(ctx context.Context, health cell.Health) error {
	retry := attachRetryMin
	for {
		txn := a.db.ReadTxn()
		watches := []<-chan struct{}{}
		initialized, initWatch := a.devices.Initialized(txn)
		var failed bool
		if initialized {
			var watch <-chan struct{}
			failed, watch = a.sync(txn)
			watches = append(watches, watch)
			a.d.devices.report(health)
		} else {
			watches = append(watches, initWatch)
		}
		var timer <-chan time.Time
		if failed {
			timer = time.After(retry)
			retry = min(2*retry, attachRetryMax)
		} else {
			retry = attachRetryMin
		}
		if a.endpoints != nil {
			_, watch := a.endpoints.AllWatch(txn)
			watches = append(watches, watch)
		}
		if !waitAny(ctx, timer, watches...) {
			return nil
		}
	}
}

// waitAny waits until one of watches closes or timer fires (true), or ctx
// ends (false).
func waitAny(ctx context.Context, timer <-chan time.Time, watches ...<-chan struct{}) bool {
	// A change closes a watch channel: the wakeup is one select per
	// channel set, so the channels are merged into one.
	changed := make(chan struct{}, len(watches))
	stop := make(chan struct{})
	defer close(stop)
	for _, w := range watches {
		go func() {
			select {
			case <-w:
				changed <- struct{}{}
			case <-stop:
			}
		}()
	}
	select {
	case <-ctx.Done():
		return false
	case <-changed:
	case <-timer:
	}
	return true
}

// sync attaches the program to every wanted device of the `devices` table
// it is not attached to at the device's current ifindex, and removes the
// pins of wanted devices that are gone. It returns whether an attach
// failed for another reason than the device (to be retried), and the
// watch channel of the devices.
func (a *deviceAttacher) sync(txn statedb.ReadTxn) (failed bool, watch <-chan struct{}) {
	a.d.mu.Lock()
	enf := a.d.enforcer
	a.d.mu.Unlock()
	all, watch := a.devices.AllWatch(txn)
	present := map[string]*devicecell.Device{}
	for dev := range all {
		present[dev.Name] = dev
	}
	if enf == nil {
		return false, watch // no program: no --devices and no endpoints
	}
	// The names asked for even when no such device exists: the
	// --devices names and the local endpoints' interfaces.
	wanted := map[string]bool{}
	for _, name := range a.sel.names {
		wanted[name] = true
	}
	if a.endpoints != nil {
		for ep := range a.endpoints.All(txn) {
			if ep.Local && ep.Interface != "" {
				wanted[ep.Interface] = true
			}
		}
	}
	for name := range present {
		if a.sel.selects(name) {
			wanted[name] = true
		}
	}
	// Devices attached earlier that are no longer wanted keep the
	// program while they exist; their pins go with them. Those no longer
	// wanted are no problem.
	for _, name := range a.d.devices.known() {
		if wanted[name] {
			continue
		}
		index, attached := a.d.devices.attachedAt(name)
		if _, ok := present[name]; ok && attached {
			a.d.devices.set(name, index, nil)
		} else {
			a.gone(name)
		}
	}
	linksDir := bpfmaps.LinksDir(a.d.cfg.BPFRoot)
	for _, name := range slices.Sorted(maps.Keys(wanted)) {
		dev, ok := present[name]
		switch {
		case !ok:
			a.missing(name)
			continue
		case !dev.Ethernet:
			if !errors.Is(a.d.devices.problem(name), ErrNotEthernet) {
				a.log.Warn("Not enforcing policy on a device that is not Ethernet", "device", name, "kind", dev.Kind)
			}
			a.d.devices.set(name, 0, fmt.Errorf("%w (%s)", ErrNotEthernet, dev.Kind))
			continue
		}
		if index, ok := a.d.devices.attachedAt(name); ok && index == dev.Index {
			continue
		}
		index, err := enf.attachDevice(name, linksDir)
		if err != nil {
			if !errors.Is(err, ErrNoDevice) && !errors.Is(err, ErrNotEthernet) {
				failed = true
			}
			a.log.Warn("Cannot attach the enforcement program", "device", name, "error", err)
			a.d.devices.set(name, 0, err)
			continue
		}
		a.d.devices.set(name, index, nil)
		a.log.Info("Enforcing policy", "device", name, "ifindex", index)
	}
	return failed, watch
}

// missing records a wanted device that does not exist.
func (a *deviceAttacher) missing(name string) {
	if _, attached := a.d.devices.attachedAt(name); attached {
		a.log.Warn("Device of --devices or an endpoint is gone (attached again when it appears)", "device", name)
	} else if !errors.Is(a.d.devices.problem(name), ErrNoDevice) {
		a.log.Warn("Device of --devices or an endpoint is missing (attached when it appears)", "device", name)
	}
	a.removeDefunctPins(name)
	a.d.devices.set(name, 0, ErrNoDevice)
}

// gone forgets a device that went and is no longer wanted.
func (a *deviceAttacher) gone(name string) {
	a.log.Info("Device gone", "device", name)
	a.removeDefunctPins(name)
	a.d.devices.set(name, 0, nil)
}

// removeDefunctPins removes the pins of the device's links that no longer
// run anywhere (their device is gone): they hold nothing but the program,
// and `version` lists what is pinned.
func (a *deviceAttacher) removeDefunctPins(name string) {
	dir := bpfmaps.LinksDir(a.d.cfg.BPFRoot)
	for _, suffix := range []string{"ingress", "egress"} {
		pin := filepath.Join(dir, linkPinName(name, suffix))
		if _, err := os.Stat(pin); err != nil {
			continue
		}
		l, err := link.LoadPinnedLink(pin, nil)
		if err == nil {
			info, infoErr := l.Info()
			live := infoErr == nil && info.TCX() != nil && info.TCX().Ifindex != 0
			l.Close()
			if live {
				continue
			}
		}
		if err := os.Remove(pin); err != nil && !errors.Is(err, os.ErrNotExist) {
			a.log.Warn("Cannot remove the pin of a gone device's link", "pin", pin, "error", err)
		}
	}
}
