// SPDX-License-Identifier: Apache-2.0

package identitycell

import (
	"fmt"
	"reflect"
	"testing"
)

// FuzzDecodeCheckpoint: the checkpoint reader never panics; its fast path
// gives what encoding/json gives, whenever it takes an input; and whatever
// the reader accepts is written back and read again unchanged. Decoded
// in parts, as a large checkpoint is, it gives what one pass gives, error
// for error.
func FuzzDecodeCheckpoint(f *testing.F) {
	f.Add([]byte(`{"version":1,"identities":[{"id":16777217,"labels":"cidr:10.0.0.0/8"}]}`))
	f.Add([]byte(`{"version":1,"identities":[]}`))
	f.Add([]byte(`{"version":1,"identities":[{"id":2,"labels":"reserved:world"}]}`))
	f.Add([]byte(`{"version":1,"identities":[{"id":1677`))
	f.Add([]byte("{\"version\":1,\"identities\":[\n{\"id\":16777217,\"labels\":\"cidr:10.0.0.0/8\"},\n{\"id\":16777218,\"labels\":\"app:x,cidr:10.0.0.1/32\"}\n]}\n"))
	f.Add([]byte("{\"version\":1,\"identities\":[\n]}\n"))
	f.Add([]byte("{\"version\":1,\"identities\":[\n{\"id\":016777217,\"labels\":\"cidr:10.0.0.0/8\"}\n]}\n"))
	f.Add([]byte("{\"version\":1,\"identities\":[\n{\"id\":16777217,\"labels\":\"cidr:10.0.0.0/8\"},\n{\"id\":16777217,\"labels\":\"cidr:10.0.0.1/32\"}\n]}\n"))
	f.Add([]byte("{\"version\":1,\"identities\":[\n{\"id\":16777218,\"labels\":\"cidr:10.0.0.0/8\"},\n{\"id\":16777217,\"labels\":\"cidr:10.0.0.1/32\"},\n{\"id\":1,\"labels\":\"cidr:10.0.0.2/32\"}\n]}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		one, oneOK, oneErr := decodeCheckpointInParts("fuzz", data, 1)
		for _, parts := range []int{2, 3, 5} {
			got, ok, err := decodeCheckpointInParts("fuzz", data, parts)
			if ok != oneOK || fmt.Sprint(err) != fmt.Sprint(oneErr) || !reflect.DeepEqual(got, one) {
				t.Fatalf("in %d parts: %v, %v, %v; in one: %v, %v, %v", parts, got, ok, err, one, oneOK, oneErr)
			}
		}
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
