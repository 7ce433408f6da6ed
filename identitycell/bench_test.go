// SPDX-License-Identifier: Apache-2.0

package identitycell

import (
	"testing"
)

// The allocator's state is the identities table, so the floor for one
// allocate+release is one row inserted and deleted in its own write
// transaction. BenchmarkBaselineTableInsertDelete measures that floor, on a
// table of 10,000 rows as BenchmarkAllocateRelease has, for the others to be
// read as ratios of it.

func BenchmarkBaselineTableInsertDelete(b *testing.B) {
	a, _, _ := newTestAllocator(b, 1<<20)
	allocateMany(b, a, 10_000)
	row := &Identity{ID: MinLocalIdentity + 20_000, Labels: cidr(20_000), References: 1}
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
