// SPDX-License-Identifier: Apache-2.0

package identitycell

import (
	"reflect"
	"testing"
)

// FuzzDecodeCheckpoint: the checkpoint reader never panics; its fast path
// gives what encoding/json gives, whenever it takes an input; and whatever
// the reader accepts is written back and read again unchanged.
func FuzzDecodeCheckpoint(f *testing.F) {
	f.Add([]byte(`{"version":1,"identities":[{"id":16777217,"labels":"cidr:10.0.0.0/8"}]}`))
	f.Add([]byte(`{"version":1,"identities":[]}`))
	f.Add([]byte(`{"version":1,"identities":[{"id":2,"labels":"reserved:world"}]}`))
	f.Add([]byte(`{"version":1,"identities":[{"id":1677`))
	f.Add([]byte("{\"version\":1,\"identities\":[\n{\"id\":16777217,\"labels\":\"cidr:10.0.0.0/8\"},\n{\"id\":16777218,\"labels\":\"app:x,cidr:10.0.0.1/32\"}\n]}\n"))
	f.Add([]byte("{\"version\":1,\"identities\":[\n]}\n"))
	f.Add([]byte("{\"version\":1,\"identities\":[\n{\"id\":016777217,\"labels\":\"cidr:10.0.0.0/8\"}\n]}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if fast, ok, fastErr := decodeCheckpointAsWritten("fuzz", data); ok {
			slow, slowErr := decodeCheckpointJSON("fuzz", data)
			if (fastErr == nil) != (slowErr == nil) || !reflect.DeepEqual(fast, slow) {
				t.Fatalf("fast path: %v, %v; encoding/json: %v, %v", fast, fastErr, slow, slowErr)
			}
		}
		checkpoint, err := decodeCheckpoint("fuzz", data)
		if err != nil {
			return
		}
		path := t.TempDir() + "/" + CheckpointFileName
		if err := writeCheckpoint(path, checkpoint.All()); err != nil {
			t.Fatal(err)
		}
		again, err := ReadCheckpoint(path)
		if err != nil || !reflect.DeepEqual(again, checkpoint) {
			t.Fatalf("round trip: %v, %v, want %v", err, again, checkpoint)
		}
	})
}
