// SPDX-License-Identifier: Apache-2.0

package datapathcell

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/ipcache-agent/ipcache-agent/bpfmaps"
	"github.com/ipcache-agent/ipcache-agent/datapathcell/bpf"
)

// The enforcement program (bpf/enforce.c) runs on both TCX hooks of every
// --devices interface, the host side of an endpoint's link:
//
//	TCX ingress  packets the endpoint sends      its egress direction, by destination
//	TCX egress   packets the endpoint receives   its ingress direction, by source
//
// Its links are pinned at <links dir>/<device>-ingress and -egress (see
// linkPinName for devices with '.' in their names), so
// enforcement continues while the agent is stopped. A restarted agent swaps
// the program inside the pinned link (BPF_LINK_UPDATE), which is atomic for
// packets: each packet sees the old or the new program, never none.

// enforcerMaps are the maps the enforcement program uses in place of the
// ones it declares: the agent's pinned maps, of the layouts in bpfmaps/mapspecs.go.
type enforcerMaps struct {
	IPCache, Enforcement, Counters, Conntrack, ConntrackOpening, Revision, Endpoints *ebpf.Map
	// DNSProxy holds the DNS proxy's port (bpfmaps.DNSProxySpec).
	DNSProxy *ebpf.Map
	// DNSAnswers is the ring of DNS answers that bypassed the proxy
	// (bpfmaps.DNSAnswersSpec), DNSAnswersLost its lost records.
	DNSAnswers, DNSAnswersLost *ebpf.Map
	// Policies is the outer policy map (bpfmaps.PoliciesSpec); Policy the
	// default's map in it, which the program reaches through Policies.
	Policies, Policy *ebpf.Map
	// ConntrackTimeouts are set in the program; zero keeps its defaults.
	ConntrackTimeouts bpfmaps.ConntrackTimeouts
}

// enforcer is the enforcement program loaded into the kernel, not yet
// attached. Closing it does not detach it from devices it was attached to.
type enforcer struct {
	// fromEndpoint runs at TCX ingress: the endpoint's egress.
	fromEndpoint *ebpf.Program
	// toEndpoint runs at TCX egress: the endpoint's ingress.
	toEndpoint *ebpf.Program
	// events is the program's ring buffer, eventState its per-CPU rate
	// limit and lost counters, eventsMask what it writes (eventsource.go).
	events, eventState *ebpf.Map
	eventsMask         *ebpf.Variable
	// ctStats counts, per CPU, the connections that could not move to a
	// full conntrack map (bpfmaps.ConntrackMaps.ConntrackFull).
	ctStats *ebpf.Map
	// policyFlags is the program's policy_flags (policyNoAnyIdentity).
	policyFlags *ebpf.Variable
	// endpointAbsent is the program's endpoint_absent (endpointFilter).
	endpointAbsent *ebpf.Variable
	// endpointWords is the program's endpoint_words mapped, wordsSet
	// what it holds (setEndpointWords).
	endpointWords *mappedWords
	wordsSet      endpointWords
}

// policyNoAnyIdentity is POLICY_NO_ANY_IDENTITY of policy_flags: the
// policy map holds no identity-0 entry, so the program skips that lookup.
const policyNoAnyIdentity = 1

// loadEnforcer loads the enforcement program with its maps replaced by
// maps. The ipcache and policy maps may have any max entries; everything
// else about them must match bpfmaps/mapspecs.go.
//
// Possible errors: a map is missing or has another layout
// (ebpf.ErrMapIncompatible), the kernel rejects the program (the error
// carries the verifier log), or no permission to load BPF.
func loadEnforcer(maps enforcerMaps) (*enforcer, error) {
	return loadEnforcerWith(maps, ebpf.ProgramOptions{})
}

// loadEnforcerWith is loadEnforcer with the programs' load options (tests
// ask for the verifier's statistics).
func loadEnforcerWith(maps enforcerMaps, programs ebpf.ProgramOptions) (*enforcer, error) {
	spec, err := parseEnforcer()
	if err != nil {
		return nil, err
	}
	return loadEnforcerSpec(spec, maps, programs)
}

// parseEnforcer parses the embedded enforcement program; the agent does
// it while its maps are opened.
//
// Possible errors: the object cannot be parsed (a build defect).
func parseEnforcer() (*ebpf.CollectionSpec, error) {
	spec, err := bpf.LoadEnforce()
	if err != nil {
		return nil, fmt.Errorf("load enforcement program spec: %w", err)
	}
	return spec, nil
}

// parseEnforcerAhead starts parseEnforcer and returns what waits for its
// result.
func parseEnforcerAhead() func() (*ebpf.CollectionSpec, error) {
	done := make(chan struct{})
	var (
		spec *ebpf.CollectionSpec
		err  error
	)
	go func() {
		defer close(done)
		spec, err = parseEnforcer()
	}()
	return func() (*ebpf.CollectionSpec, error) {
		<-done
		return spec, err
	}
}

// loadEnforcerSpec is loadEnforcerWith with the program parsed
// (parseEnforcer); it changes spec.
func loadEnforcerSpec(spec *ebpf.CollectionSpec, maps enforcerMaps, programs ebpf.ProgramOptions) (*enforcer, error) {
	replacements := map[string]*ebpf.Map{
		bpf.EnforceMapIpcache:        maps.IPCache,
		bpf.EnforceMapPolicy:         maps.Policies,
		bpf.EnforceMapEndpoints:      maps.Endpoints,
		bpf.EnforceMapEnforcement:    maps.Enforcement,
		bpf.EnforceMapCounters:       maps.Counters,
		bpf.EnforceMapConntrack:      maps.Conntrack,
		bpf.EnforceMapCtOpening:      maps.ConntrackOpening,
		bpf.EnforceMapRevision:       maps.Revision,
		bpf.EnforceMapDnsProxy:       maps.DNSProxy,
		bpf.EnforceMapDnsAnswers:     maps.DNSAnswers,
		bpf.EnforceMapDnsAnswersLost: maps.DNSAnswersLost,
	}
	for name, m := range replacements {
		if m == nil {
			return nil, fmt.Errorf("load enforcement program: no %s map given", name)
		}
	}
	// Sizes of ipcache and policy are configuration: the C declarations carry
	// the defaults only. The other two are indexed by the program, so their
	// sizes stay as declared and a different map is rejected. The outer
	// policy map has room for every subject; the kernel does not compare
	// the size of the maps in it with the declaration's.
	spec.Maps[bpf.EnforceMapIpcache].MaxEntries = maps.IPCache.MaxEntries()
	spec.Maps[bpf.EnforceMapConntrack].MaxEntries = maps.Conntrack.MaxEntries()
	spec.Maps[bpf.EnforceMapCtOpening].MaxEntries = maps.ConntrackOpening.MaxEntries()
	if err := setConntrackTimeouts(spec, maps.ConntrackTimeouts); err != nil {
		return nil, err
	}
	wordsOffset, err := variableOffset(spec, ".bss", bpf.EnforceVarEndpointWords)
	if err != nil {
		return nil, fmt.Errorf("load enforcement program: %w", err)
	}

	// The maps first, the program's own ones (its .bss, ring buffer,
	// scratch maps) created once: both programs must share them.
	mapsOnly := spec.Copy()
	mapsOnly.Programs = nil
	coll, err := ebpf.NewCollectionWithOptions(mapsOnly, ebpf.CollectionOptions{MapReplacements: replacements})
	if err != nil {
		return nil, fmt.Errorf("load enforcement program: %w", err)
	}
	defer coll.Close() // what is not assigned below
	// Then the two programs at once, over the collection's maps: the
	// verifier's work is most of the load, and each runs on a core.
	from, to, err := loadPrograms(spec, coll.Maps, programs)
	if err != nil {
		return nil, fmt.Errorf("load enforcement program: %w", err)
	}
	enf := &enforcer{fromEndpoint: from, toEndpoint: to, wordsSet: endpointWords{}}
	var objs struct {
		Events         *ebpf.Map      `ebpf:"events"`
		EventState     *ebpf.Map      `ebpf:"event_state"`
		CtStats        *ebpf.Map      `ebpf:"ct_stats"`
		EventsMask     *ebpf.Variable `ebpf:"events_mask"`
		PolicyFlags    *ebpf.Variable `ebpf:"policy_flags"`
		EndpointAbsent *ebpf.Variable `ebpf:"endpoint_absent"`
	}
	err = coll.Assign(&objs)
	if err == nil {
		enf.events, enf.eventState, enf.ctStats = objs.Events, objs.EventState, objs.CtStats
		enf.eventsMask, enf.policyFlags, enf.endpointAbsent = objs.EventsMask, objs.PolicyFlags, objs.EndpointAbsent
		// The variables and the words' mapping keep the .bss mapped;
		// the map itself is closed with the collection.
		enf.endpointWords, err = mapWords(coll.Maps[".bss"], wordsOffset)
	}
	if err != nil {
		enf.Close()
		return nil, fmt.Errorf("load enforcement program: %w", err)
	}
	return enf, nil
}

// loadPrograms loads the two enforcement programs of spec in parallel, each
// with the maps of loaded in place of those it declares.
//
// Possible errors: the kernel rejects a program (the error carries the
// verifier log); none is returned then.
func loadPrograms(spec *ebpf.CollectionSpec, loaded map[string]*ebpf.Map, opts ebpf.ProgramOptions) (from, to *ebpf.Program, err error) {
	names := [2]string{bpf.EnforceProgEnforceFromEndpoint, bpf.EnforceProgEnforceToEndpoint}
	var (
		progs [2]*ebpf.Program
		errs  [2]error
		wg    sync.WaitGroup
	)
	for i, name := range names {
		// A copy each: cilium/ebpf does not say that loads from one
		// spec may run at once, and a copy costs little beside the
		// verifier.
		own := spec.Copy()
		wg.Go(func() {
			coll, err := ebpf.NewCollectionWithOptions(&ebpf.CollectionSpec{
				Maps: own.Maps, Programs: map[string]*ebpf.ProgramSpec{name: own.Programs[name]},
				Variables: own.Variables, Types: own.Types, ByteOrder: own.ByteOrder,
			}, ebpf.CollectionOptions{MapReplacements: loaded, Programs: opts})
			if err != nil {
				errs[i] = err
				return
			}
			progs[i] = coll.DetachProgram(name)
			coll.Close()
		})
	}
	wg.Wait()
	if err := errors.Join(errs[:]...); err != nil {
		for _, p := range progs {
			if p != nil {
				p.Close()
			}
		}
		return nil, nil, err
	}
	return progs[0], progs[1], nil
}

// variableOffset is where the global variable name starts in the data
// section of the map section.
//
// Possible errors: no such section or variable in the spec.
func variableOffset(spec *ebpf.CollectionSpec, section, name string) (uint32, error) {
	m := spec.Maps[section]
	if m == nil {
		return 0, fmt.Errorf("no section %s", section)
	}
	if ds, ok := m.Value.(*btf.Datasec); ok {
		for _, v := range ds.Vars {
			if v.Type.TypeName() == name {
				return v.Offset, nil
			}
		}
	}
	return 0, fmt.Errorf("no variable %s in section %s", name, section)
}

// setEndpointWords makes the program's endpoint_words hold words, each
// word that changes written with one atomic 8-byte store (mappedWords;
// the program reads each with one load): those that go first, then those
// that come. A word never goes from one value to another but through 0,
// so that no packet reads the entry of another address, nor half of one
// value and half of another.
//
// Possible errors: the program's memory is no longer mapped (the
// enforcer was closed).
func (e *enforcer) setEndpointWords(words endpointWords) error {
	if e.endpointWords == nil {
		return fmt.Errorf("write the program's %s: %w", bpf.EnforceVarEndpointWords, errWordsNotMapped)
	}
	for slot, old := range e.wordsSet {
		if words[slot] != old {
			e.endpointWords.store(slot, 0)
			delete(e.wordsSet, slot)
		}
	}
	for slot, word := range words {
		if word == 0 || e.wordsSet[slot] == word {
			continue
		}
		e.endpointWords.store(slot, word)
		e.wordsSet[slot] = word
	}
	return nil
}

// endpointSlots is the number of words in the program's endpoint_words
// (ENDPOINT_SLOT_BITS in bpf/enforce.c).
const endpointSlots = 1 << endpointSlotBits

// mappedWords is a program's endpoint_words mapped into the agent, so
// that each word is written with one atomic 64-bit store: the program
// reads a word with one load, and a copy of bytes (ebpf.Memory.WriteAt)
// promises nothing of the store it makes. The enforcer's users write and
// close it under one lock (Datapath.mu).
type mappedWords struct {
	mem   []byte   // the mapping of the program's .bss
	words []uint64 // endpoint_words in mem
}

// mapWords maps bss, the program's .bss, whose endpoint_words start at
// offset.
//
// Possible errors: bss is not mmapable or cannot be mapped, or the words
// at offset are not 8-byte aligned or not all in it.
func mapWords(bss *ebpf.Map, offset uint32) (*mappedWords, error) {
	page := uint32(unix.Getpagesize())
	size := (bss.ValueSize() + page - 1) / page * page
	if offset%8 != 0 || uint64(offset)+8*endpointSlots > uint64(bss.ValueSize()) {
		return nil, fmt.Errorf("map %s: offset %d of %d words in %d bytes: %w",
			bpf.EnforceVarEndpointWords, offset, endpointSlots, bss.ValueSize(), errWordsNotMapped)
	}
	mem, err := unix.Mmap(bss.FD(), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map %s: %w", bpf.EnforceVarEndpointWords, err)
	}
	// The mapping is page-aligned and outside the Go heap, and offset is
	// a multiple of 8: every word is 8-byte aligned, as 64-bit atomics
	// need.
	words := unsafe.Slice((*uint64)(unsafe.Pointer(&mem[offset])), endpointSlots)
	return &mappedWords{mem: mem, words: words}, nil
}

// store writes word to slot with one atomic store.
func (w *mappedWords) store(slot uint32, word uint64) {
	atomic.StoreUint64(&w.words[slot], word)
}

// close unmaps the words.
//
// Possible errors: the unmap fails.
func (w *mappedWords) close() error {
	if w == nil || w.mem == nil {
		return nil
	}
	err := unix.Munmap(w.mem)
	w.mem, w.words = nil, nil
	if err != nil {
		return fmt.Errorf("unmap %s: %w", bpf.EnforceVarEndpointWords, err)
	}
	return nil
}

// Close releases the agent's references to the programs. Attached programs
// stay attached: their pinned links hold them.
func (e *enforcer) Close() error {
	words := e.endpointWords.close()
	e.endpointWords = nil
	return errors.Join(e.fromEndpoint.Close(), e.toEndpoint.Close(), e.events.Close(), e.eventState.Close(),
		e.ctStats.Close(), words)
}

// tcxHook is one of the two attachment points of the program on a device.
type tcxHook struct {
	suffix  string // of the link's pin name
	attach  ebpf.AttachType
	program *ebpf.Program
}

func (e *enforcer) hooks() []tcxHook {
	return []tcxHook{
		{"ingress", ebpf.AttachTCXIngress, e.fromEndpoint},
		{"egress", ebpf.AttachTCXEgress, e.toEndpoint},
	}
}

// attach makes the program enforce on device, a network interface of the
// calling thread's network namespace, and pins the links in linksDir
// (created with mode 0700 if missing), so that enforcement outlives the
// agent.
//
// A pinned link that is still attached to device at the same hook gets this
// program in place, with no moment without enforcement (agent restart). A
// pinned link that is stale (its device is gone or was recreated, or the pin
// is not a TCX link at all) is replaced by a new link, pinned over the old
// pin by an atomic rename, and then detached.
//
// New links are attached at the head of the TCX chain, so that no program
// attached earlier can accept a packet before policy has seen it.
//
// Possible errors: the device does not exist or is not Ethernet; TCX is not
// supported (Linux < 6.6); no permission; linksDir is not on bpffs.
func (e *enforcer) attach(device string, linksDir string) error {
	_, err := e.attachDevice(device, linksDir)
	return err
}

// attachDevice is attach, returning the ifindex the device had when the
// program was attached to it.
//
// Possible errors: those of attach; ErrNoDevice and ErrNotEthernet
// (wrapped) for a device that is missing or not Ethernet.
func (e *enforcer) attachDevice(device string, linksDir string) (int, error) {
	iface, err := net.InterfaceByName(device)
	if err != nil {
		return 0, fmt.Errorf("attach enforcement to %s: %w (%w)", device, ErrNoDevice, err)
	}
	if err := requireEthernet(device); err != nil {
		return 0, fmt.Errorf("attach enforcement to %s: %w", device, err)
	}
	if err := os.MkdirAll(linksDir, 0o700); err != nil {
		return 0, fmt.Errorf("attach enforcement to %s: create links directory: %w", device, err)
	}
	for _, hook := range e.hooks() {
		pin := filepath.Join(linksDir, linkPinName(device, hook.suffix))
		if err := attachPinned(iface.Index, hook, pin); err != nil {
			return 0, fmt.Errorf("attach enforcement to %s at TCX %s: %w", device, hook.suffix, err)
		}
	}
	return iface.Index, nil
}

// linkPinName is the pin name of a device's link at a hook: <device>-ingress
// or <device>-egress. bpffs refuses names containing '.', which interface
// names may contain (VLAN devices such as eth0.100); it is written as '%',
// which no interface name contains (the kernel reads a '%' in a requested
// name as a numbering template), so distinct devices keep distinct pins.
func linkPinName(device, suffix string) string {
	return strings.ReplaceAll(device, ".", "%") + "-" + suffix
}

// attachPinned makes hook.program run at the hook of ifindex through the
// link pinned at pin, updating that link in place when it is still attached
// there.
func attachPinned(ifindex int, hook tcxHook, pin string) error {
	old, err := link.LoadPinnedLink(pin, nil)
	if errors.Is(err, os.ErrNotExist) {
		return attachNew(ifindex, hook, pin)
	}
	if err == nil {
		defer old.Close()
		if linkAttachedAt(old, ifindex, hook.attach) {
			err := old.Update(hook.program)
			if err == nil {
				return nil
			}
			// ENOLINK: the device went away after the check.
			if !errors.Is(err, unix.ENOLINK) {
				return fmt.Errorf("update pinned link %s: %w", pin, err)
			}
		}
	}
	// The pin is stale: replace it. Errors of loading it are not reported:
	// whatever it holds is replaced.
	if err := attachNew(ifindex, hook, pin); err != nil {
		return err
	}
	if old != nil {
		// The old link may still run on another interface (one that took the
		// device's name or index); it must not keep enforcing there. Detaching
		// a link whose device is gone is a no-op.
		if err := old.Detach(); err != nil {
			return fmt.Errorf("detach replaced link %s: %w", pin, err)
		}
	}
	return nil
}

// linkAttachedAt reports whether l is a live TCX link at the given hook of
// ifindex. A link whose device is gone reports ifindex 0.
func linkAttachedAt(l link.Link, ifindex int, attach ebpf.AttachType) bool {
	info, err := l.Info()
	if err != nil {
		return false
	}
	tcx := info.TCX()
	return tcx != nil && tcx.Ifindex == uint32(ifindex) && ebpf.AttachType(tcx.AttachType) == attach
}

// attachNew attaches a new link and pins it at pin, replacing whatever was
// pinned there in one rename.
func attachNew(ifindex int, hook tcxHook, pin string) error {
	l, err := link.AttachTCX(link.TCXOptions{
		Interface: ifindex,
		Program:   hook.program,
		Attach:    hook.attach,
		Anchor:    link.Head(),
	})
	if err != nil {
		return err
	}
	// Once pinned, closing the file descriptor leaves the link attached;
	// before that, it detaches it.
	defer l.Close()

	// No pin name ends in "~new"; '.' is not allowed on bpffs.
	tmp := pin + "~new"
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove leftover pin: %w", err)
	}
	if err := l.Pin(tmp); err != nil {
		return fmt.Errorf("pin link: %w", err)
	}
	if err := os.Rename(tmp, pin); err != nil {
		return errors.Join(fmt.Errorf("pin link: %w", err), l.Unpin())
	}
	return nil
}

// arphrdEther is ARPHRD_ETHER, the hardware type of Ethernet devices.
const arphrdEther = 1

// requireEthernet fails unless device (in the calling thread's network
// namespace) is an Ethernet device: the program reads Ethernet framing and
// would misread packets of an L3 device.
func requireEthernet(device string) error {
	ifr, err := unix.NewIfreq(device)
	if err != nil {
		return err
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("query hardware type: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFHWADDR, ifr); err != nil {
		if errors.Is(err, unix.ENODEV) {
			// Gone since it was looked up.
			return fmt.Errorf("query hardware type: %w (%w)", ErrNoDevice, err)
		}
		return fmt.Errorf("query hardware type: %w", err)
	}
	// SIOCGIFHWADDR returns a sockaddr whose family is the hardware type.
	if hwType := ifr.Uint16(); hwType != arphrdEther {
		return fmt.Errorf("%w (hardware type %d)", ErrNotEthernet, hwType)
	}
	return nil
}
