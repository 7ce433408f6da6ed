// SPDX-License-Identifier: Apache-2.0

package netnstest

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Pinger sends ICMP echo requests to an IPv4 address from inside a network
// namespace, one per interval, and counts the replies by sequence number.
// Unlike ping(8), it stops sending when told and then waits for the
// replies of every probe sent, so a probe in flight at the end is not
// counted as lost.
type Pinger struct {
	t   testing.TB
	fd  int
	dst unix.SockaddrInet4
	id  uint16
	// stop ends the sending; quit the waiting for replies.
	stop, quit chan struct{}
	done       sync.WaitGroup

	mu       sync.Mutex
	answered map[uint16]bool
	// sentAt is when each probe was sent, by sequence number (its length
	// is the probes sent): a failing test names when it lost its probes,
	// to set beside the agent's log.
	sentAt []time.Time
}

// StartPinger starts probing dst from the namespace ns (an `ip netns`
// name) every interval.
func StartPinger(t testing.TB, ns, dst string, interval time.Duration) *Pinger {
	t.Helper()
	addr := netip.MustParseAddr(dst)
	p := &Pinger{t: t, dst: unix.SockaddrInet4{Addr: addr.As4()}, id: uint16(os.Getpid()),
		stop: make(chan struct{}), quit: make(chan struct{}), answered: map[uint16]bool{}}
	err := InNetns(t, ns, func() error {
		var err error
		p.fd, err = unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMP)
		return err
	})
	if err != nil {
		t.Fatalf("pinger socket in %s: %v", ns, err)
	}
	// Room for seconds of replies (the default holds a few hundred): on
	// a loaded machine the receiver may not run for a while, and a reply
	// the socket had no room for would count as a probe the datapath
	// dropped. As root (the tests that ping are), past rmem_max.
	if err := unix.SetsockoptInt(p.fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 16<<20); err != nil {
		t.Fatalf("pinger socket buffer: %v", err)
	}
	// A receive timeout lets the receiver notice the end.
	tv := unix.NsecToTimeval((50 * time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(p.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		t.Fatalf("pinger socket timeout: %v", err)
	}
	p.done.Add(2)
	go p.send(interval)
	go p.receive()
	return p
}

func (p *Pinger) send(interval time.Duration) {
	defer p.done.Done()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for seq := uint16(0); ; seq++ {
		select {
		case <-p.stop:
			return
		case <-tick.C:
		}
		if err := unix.Sendto(p.fd, echoRequest(p.id, seq), 0, &p.dst); err != nil {
			p.t.Errorf("pinger send: %v", err)
			return
		}
		p.mu.Lock()
		p.sentAt = append(p.sentAt, time.Now())
		p.mu.Unlock()
	}
}

// echoRequest is an ICMP echo request with its checksum.
func echoRequest(id, seq uint16) []byte {
	pkt := make([]byte, 16)
	pkt[0] = 8 // echo request
	binary.BigEndian.PutUint16(pkt[4:], id)
	binary.BigEndian.PutUint16(pkt[6:], seq)
	var sum uint32
	for i := 0; i < len(pkt); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(pkt[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(pkt[2:], ^uint16(sum))
	return pkt
}

func (p *Pinger) receive() {
	defer p.done.Done()
	buf := make([]byte, 1500)
	for {
		n, _, err := unix.Recvfrom(p.fd, buf, 0)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			select {
			case <-p.quit:
				return
			case <-p.stop:
				if p.allAnswered() {
					return
				}
			default:
			}
			continue
		}
		if err != nil {
			return // closed
		}
		// A raw socket gives the IP header too.
		if n < 20 {
			continue
		}
		ihl := int(buf[0]&0x0f) * 4
		icmp := buf[ihl:n]
		if len(icmp) < 8 || icmp[0] != 0 || binary.BigEndian.Uint16(icmp[4:]) != p.id {
			continue
		}
		p.mu.Lock()
		p.answered[binary.BigEndian.Uint16(icmp[6:])] = true
		p.mu.Unlock()
	}
}

func (p *Pinger) allAnswered() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.answered) >= len(p.sentAt)
}

// Sent returns how many probes were sent so far.
func (p *Pinger) Sent() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.sentAt)
}

// Stop stops sending, waits up to a second for the replies of what was
// sent, and returns the probes sent, those answered, and the longest run
// of consecutive probes lost.
func (p *Pinger) Stop() (sent, answered, longestLoss int) {
	close(p.stop)
	waited := make(chan struct{})
	go func() { p.done.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(time.Second):
		close(p.quit)
		<-waited
	}
	unix.Close(p.fd)
	p.mu.Lock()
	defer p.mu.Unlock()
	run := 0
	for seq := range p.sentAt {
		if p.answered[uint16(seq)] {
			run = 0
			continue
		}
		run++
		longestLoss = max(longestLoss, run)
	}
	return len(p.sentAt), len(p.answered), longestLoss
}

// LostAt returns when each probe that got no answer was sent, in order;
// call it after Stop.
func (p *Pinger) LostAt() []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	var lost []time.Time
	for seq, at := range p.sentAt {
		if !p.answered[uint16(seq)] {
			lost = append(lost, at)
		}
	}
	return lost
}
