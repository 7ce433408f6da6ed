// SPDX-License-Identifier: Apache-2.0

package identitycell

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/labels"
)

// The allocator's state is the identities table, so the floor for one
// allocate+release is one row inserted and deleted in its own write
// transaction. BenchmarkBaselineTableInsertDelete measures that floor, on a
// table of 10,000 rows as BenchmarkAllocateRelease has, for the others to be
// read as ratios of it.

func BenchmarkBaselineTableInsertDelete(b *testing.B) {
	a, _, _ := newTestAllocator(b, 1<<20)
	allocateMany(b, a, 10_000)
	row := NewIdentity(identity.MinLocal+20_000, cidr(20_000), 1, false)
	b.ReportAllocs()
	for b.Loop() {
		txn := a.WriteTxn()
		if _, _, err := a.table.Insert(txn, row); err != nil {
			b.Fatal(err)
		}
		txn.Commit()
		txn = a.WriteTxn()
		if _, _, err := a.table.Delete(txn, row); err != nil {
			b.Fatal(err)
		}
		txn.Commit()
	}
}

// BenchmarkAllocateRelease allocates a new identity and frees it again, with
// 10,000 other identities allocated.
func BenchmarkAllocateRelease(b *testing.B) {
	a, _, _ := newTestAllocator(b, 1<<20)
	allocateMany(b, a, 10_000)
	lbls := cidr(20_000)
	b.ReportAllocs()
	for b.Loop() {
		id, err := a.allocate(lbls, 0)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := a.release(id); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAllocateReleaseReferenced takes and drops a reference to an
// identity that stays allocated.
func BenchmarkAllocateReleaseReferenced(b *testing.B) {
	a, _, _ := newTestAllocator(b, 1<<20)
	lbls := cidr(1)
	if _, err := a.allocate(lbls, 0); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		id, err := a.allocate(lbls, 0)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := a.release(id); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAllocateReleaseBatched allocates 1,000 identities in one write
// transaction and releases them in another, as the ipcache does with a
// batch of prefixes. Reported per identity.
func BenchmarkAllocateReleaseBatched(b *testing.B) {
	const batch = 1000
	a, _, _ := newTestAllocator(b, 1<<20)
	lbls := make([]Identity, batch)
	for n := range batch {
		lbls[n].Labels = cidr(n)
	}
	b.ReportAllocs()
	for b.Loop() {
		txn := a.WriteTxn()
		for n := range lbls {
			id, err := a.AllocateTxn(txn, lbls[n].Labels, 0)
			if err != nil {
				b.Fatal(err)
			}
			lbls[n].ID = id
		}
		txn.Commit()
		txn = a.WriteTxn()
		for n := range lbls {
			if _, err := a.ReleaseTxn(txn, lbls[n].ID); err != nil {
				b.Fatal(err)
			}
		}
		txn.Commit()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/identity")
}

func allocateMany(b *testing.B, a *Allocator, n int) {
	txn := a.WriteTxn()
	for i := range n {
		if _, err := a.AllocateTxn(txn, cidr(i), 0); err != nil {
			b.Fatal(err)
		}
	}
	txn.Commit()
}

// BenchmarkRestoreNumbers is restore's use of the allocator at 100,000
// prefixes: every number is requested by name, in chunks as the resolver
// allocates them. "requested" is the baseline; "withheld-then-requested"
// first withholds them all (a row each, as restore does before any is
// resolved), so the ratio of the two is what keeping the withheld numbers
// in the table costs a restart (docs/SCALE.md).
func BenchmarkRestoreNumbers(b *testing.B) {
	const n = 100_000
	ids := make([]identity.Number, n)
	lbls := make([]labels.Labels, n)
	for i := range ids {
		ids[i] = identity.MinLocal + identity.Number(i)
		lbls[i] = labels.ForPrefix(netipPrefix(b, identity.Number(i)))
	}
	for _, withhold := range []bool{false, true} {
		name := "requested"
		if withhold {
			name = "withheld-then-requested"
		}
		b.Run(name, func(b *testing.B) {
			for range b.N {
				b.StopTimer()
				a, _, _ := newTestAllocator(b, n)
				b.StartTimer()
				if withhold {
					if err := a.Withhold(ids...); err != nil {
						b.Fatal(err)
					}
				}
				for start := 0; start < n; start += 4096 {
					txn := a.WriteTxn()
					for i := start; i < min(start+4096, n); i++ {
						if _, err := a.AllocateTxn(txn, lbls[i], ids[i]); err != nil {
							b.Fatal(err)
						}
					}
					txn.Commit()
				}
			}
		})
	}
}

// Decoding a checkpoint of a million identities, as a restart does
// (docs/SCALE.md).
func BenchmarkDecodeCheckpoint(b *testing.B) {
	const n = 1_000_000
	checkpoint := newCheckpointBuilder("bench", n)
	for i := range n {
		id := identity.MinLocal + identity.Number(i)
		require.NoError(b, checkpoint.add(id, labels.ForPrefix(netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), 32))))
	}
	saved, err := checkpoint.checkpoint()
	require.NoError(b, err)
	var buf bytes.Buffer
	require.NoError(b, encodeCheckpoint(&buf, saved.All()))
	b.ResetTimer()
	for range b.N {
		decoded, err := decodeCheckpoint("bench", buf.Bytes())
		require.NoError(b, err)
		require.Equal(b, n, decoded.Len())
	}
}
