// SPDX-License-Identifier: Apache-2.0

package identitycell

// The checkpoint file: its format, and its encoding and decoding.

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"iter"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"

	"github.com/ipcache-agent/ipcache-agent/identity"
	"github.com/ipcache-agent/ipcache-agent/internal/atomicfile"
	"github.com/ipcache-agent/ipcache-agent/labels"
)

const (
	// CheckpointFileName is the checkpoint's name in the state directory.
	CheckpointFileName = "local-identities.json"

	checkpointVersion = 1
)

// Checkpoint is the saved number -> labels of the local identities and the
// label identities. The zero value is empty.
//
// It is an array in number order, not a map: a restart decodes a million
// numbers and looks each pinned prefix's up, and an array is built by
// appending what the file lists in that order, and looked up mostly at
// the place the number gives (see Labels), where a map inserted and
// looked up at a random place for each (docs/SCALE.md).
type Checkpoint struct {
	// entries are in ascending number order, each number once: the label
	// identities (the cluster range) first, then the local ones from
	// firstLocal on.
	entries    []checkpointEntry
	firstLocal int
}

type checkpointEntry struct {
	id     identity.Number
	labels labels.Labels
}

// Len returns the number of identities in the checkpoint, local and label
// identities.
func (c Checkpoint) Len() int { return len(c.entries) }

// Labels returns the labels saved for id, and whether id was saved.
func (c Checkpoint) Labels(id identity.Number) (labels.Labels, bool) {
	e := c.entries
	if id.IsLocal() {
		e = e[c.firstLocal:]
	}
	if len(e) == 0 || id < e[0].id {
		return labels.Labels{}, false
	}
	// The numbers are distinct and ascending, so id is at most id-first
	// places in, and exactly there when the numbers before it are all
	// saved: the allocator hands out the lowest free number, so that is
	// where it nearly always is.
	if d := uint64(id - e[0].id); d < uint64(len(e)) {
		if e[d].id == id {
			return e[d].labels, true
		}
		e = e[:d]
	}
	i, found := slices.BinarySearchFunc(e, id, func(entry checkpointEntry, id identity.Number) int {
		return cmp.Compare(entry.id, id)
	})
	if !found {
		return labels.Labels{}, false
	}
	return e[i].labels, true
}

// All lists the checkpoint in ascending number order.
func (c Checkpoint) All() iter.Seq2[identity.Number, labels.Labels] {
	return func(yield func(identity.Number, labels.Labels) bool) {
		for _, e := range c.entries {
			if !yield(e.id, e.labels) {
				return
			}
		}
	}
}

// checkpointBuilder collects a decoded checkpoint's entries in the file's
// order, which is number order for every file the agent writes.
type checkpointBuilder struct {
	path    string
	entries []checkpointEntry
	sorted  bool
}

func newCheckpointBuilder(path string, sizeHint int) *checkpointBuilder {
	return &checkpointBuilder{path: path, entries: make([]checkpointEntry, 0, sizeHint), sorted: true}
}

// add adds a decoded entry, unless it is not a local or label identity
// with labels or its number is the one listed just before it.
func (b *checkpointBuilder) add(id identity.Number, lbls labels.Labels) error {
	if !(id.IsLocal() || id.IsCluster()) || lbls.IsEmpty() {
		return corrupt(b.path, fmt.Sprintf("entry %d %q is not a local or label identity with labels", id, lbls))
	}
	if n := len(b.entries); n > 0 && id <= b.entries[n-1].id {
		if id == b.entries[n-1].id {
			return listedTwice(b.path, id)
		}
		b.sorted = false
	}
	b.entries = append(b.entries, checkpointEntry{id, lbls})
	return nil
}

// checkpoint returns what was added, in number order, unless a number
// was listed twice.
func (b *checkpointBuilder) checkpoint() (Checkpoint, error) {
	if len(b.entries) == 0 {
		return Checkpoint{}, nil
	}
	if !b.sorted { // a file not written by the agent
		slices.SortFunc(b.entries, func(a, b checkpointEntry) int { return cmp.Compare(a.id, b.id) })
		for i := 1; i < len(b.entries); i++ {
			if b.entries[i].id == b.entries[i-1].id {
				return Checkpoint{}, listedTwice(b.path, b.entries[i].id)
			}
		}
	}
	firstLocal, _ := slices.BinarySearchFunc(b.entries, identity.MinLocal, func(entry checkpointEntry, id identity.Number) int {
		return cmp.Compare(entry.id, id)
	})
	return Checkpoint{entries: b.entries, firstLocal: firstLocal}, nil
}

func listedTwice(path string, id identity.Number) error {
	return corrupt(path, fmt.Sprintf("identity %d listed twice", id))
}

type checkpointFile struct {
	Version    int                  `json:"version"`
	Identities []checkpointIdentity `json:"identities"`
}

type checkpointIdentity struct {
	ID     identity.Number `json:"id"`
	Labels labels.Labels   `json:"labels"`
}

// ReadCheckpoint reads the checkpoint at path. A missing file is an empty
// checkpoint: the agent has not run before.
//
// Possible errors: ErrCorruptCheckpoint (wrapped), and the errors of
// reading the file (wrapped, fs.ErrPermission for one).
func ReadCheckpoint(path string) (Checkpoint, error) {
	data, err := readCheckpointFile(path)
	if err != nil {
		return Checkpoint{}, fmt.Errorf("read identity checkpoint: %w", err)
	}
	return decodeCheckpoint(path, data)
}

// readCheckpointFile reads the file; a missing file reads as empty.
func readCheckpointFile(path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return data, nil
}

func decodeCheckpoint(path string, data []byte) (Checkpoint, error) {
	if data == nil {
		return Checkpoint{}, nil
	}
	if checkpoint, ok, err := decodeCheckpointAsWritten(path, data); ok {
		return checkpoint, err
	}
	return decodeCheckpointJSON(path, data)
}

// corrupt is the error of a checkpoint that cannot be decoded.
func corrupt(path, detail string) error {
	return fmt.Errorf("decode identity checkpoint %s: %w", path, corruptError{detail})
}

func decodeCheckpointJSON(path string, data []byte) (Checkpoint, error) {
	var file checkpointFile
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&file); err != nil {
		return Checkpoint{}, corrupt(path, err.Error())
	}
	if dec.More() {
		return Checkpoint{}, corrupt(path, "trailing data")
	}
	if file.Version != checkpointVersion {
		return Checkpoint{}, corrupt(path, fmt.Sprintf("version %d, want %d", file.Version, checkpointVersion))
	}
	b := newCheckpointBuilder(path, len(file.Identities))
	for _, entry := range file.Identities {
		if err := b.add(entry.ID, entry.Labels); err != nil {
			return Checkpoint{}, err
		}
	}
	return b.checkpoint()
}

// decodeCheckpointAsWritten decodes a checkpoint laid out exactly as
// encodeCheckpoint writes it, several times faster than encoding/json,
// which took seconds of a restart at a million identities. ok is
// false for anything else (other white space, key order, escapes, a
// version other than this one's, a syntax error): encoding/json then
// decodes it, or says what is wrong. For any input it accepts, it gives
// what encoding/json gives (FuzzDecodeCheckpoint checks that).
//
// A large checkpoint is decoded in parts, one per processor: restore
// waits for it before it takes the pinned map's first entry, while the
// map is read beside it (docs/SCALE.md, "Restart, session 36").
func decodeCheckpointAsWritten(path string, data []byte) (checkpoint Checkpoint, ok bool, err error) {
	parts := 1
	if len(data) >= minPartBytes {
		parts = runtime.GOMAXPROCS(0)
	}
	return decodeCheckpointInParts(path, data, parts)
}

// minPartBytes is the least checkpoint decoded in parts (about 25,000
// identities): below it, the goroutines cost more than they save.
const minPartBytes = 1 << 20

// entryStart opens every entry as encodeCheckpoint writes it; entrySep
// separates two. Neither can occur inside an entry that decodes: a
// label holds no quote.
var (
	entryStart = []byte("\n{\"id\":")
	entrySep   = []byte(",\n{\"id\":")
)

// decodeCheckpointInParts is decodeCheckpointAsWritten in at most parts
// parts, split before an entry separator, decoded each on its own
// goroutine into its share of one array. It gives what decoding in one
// part gives, the same error for the same input: the parts' outcomes are
// taken in the file's order, and at each border the entry after it is
// checked against the one before it as it would have been in one pass.
func decodeCheckpointInParts(path string, data []byte, parts int) (checkpoint Checkpoint, ok bool, err error) {
	body, found := bytes.CutPrefix(data, fmt.Appendf(nil, "{\"version\":%d,\"identities\":[", checkpointVersion))
	if !found {
		return Checkpoint{}, false, nil
	}
	// The parts start at separators, the first at the body's start.
	starts := []int{0}
	for k := 1; k < parts; k++ {
		from := max(k*len(body)/parts, starts[len(starts)-1]+1)
		if from >= len(body) {
			break
		}
		i := bytes.Index(body[from:], entrySep)
		if i < 0 {
			break
		}
		starts = append(starts, from+i)
	}
	bodies := make([][]byte, len(starts))
	for k, start := range starts {
		end := len(body)
		if k+1 < len(starts) {
			end = starts[k+1]
		}
		bodies[k] = body[start:end]
	}

	// Sized up front (an entry per line), each part's share first.
	counts := make([]int, len(bodies))
	each(len(bodies), func(k int) { counts[k] = bytes.Count(bodies[k], entryStart) })
	total := 0
	for _, n := range counts {
		total += n
	}
	all := make([]checkpointEntry, total)
	type outcome struct {
		b   *checkpointBuilder
		ok  bool
		err error
	}
	outcomes := make([]outcome, len(bodies))
	each(len(bodies), func(k int) {
		offset := 0
		for _, n := range counts[:k] {
			offset += n
		}
		b := &checkpointBuilder{path: path, entries: all[offset : offset : offset+counts[k]], sorted: true}
		ok, err := decodeEntriesAsWritten(bodies[k], k == 0, k == len(bodies)-1, b)
		outcomes[k] = outcome{b, ok, err}
	})

	sorted := true
	for k, o := range outcomes {
		if k > 0 && len(o.b.entries) > 0 {
			// The first entry after the border, as one pass adds it after
			// the last one before it (which the part before left whole).
			prev, first := outcomes[k-1].b.entries, o.b.entries[0]
			switch last := prev[len(prev)-1]; {
			case first.id == last.id:
				return Checkpoint{}, true, listedTwice(path, first.id)
			case first.id < last.id:
				sorted = false
			}
		}
		if !o.ok || o.err != nil {
			return Checkpoint{}, o.ok, o.err
		}
		sorted = sorted && o.b.sorted
		if len(o.b.entries) != counts[k] {
			// An entry opening that was not an entry: never in a file that
			// decodes, but one pass is the reference.
			return decodeCheckpointInParts(path, data, 1)
		}
	}
	b := checkpointBuilder{path: path, entries: all, sorted: sorted}
	checkpoint, err = b.checkpoint()
	return checkpoint, true, err
}

// each calls f(0) to f(n-1), each on a goroutine of its own but the
// last, and returns once all have returned.
func each(n int, f func(int)) {
	var wg sync.WaitGroup
	for k := range n - 1 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(k)
		}()
	}
	f(n - 1)
	wg.Wait()
}

// decodeEntriesAsWritten adds to b the entries of one part of a
// checkpoint's body, as encodeCheckpoint writes them: the first part
// starts with an entry, the others with the separator before one; the
// last ends with the closing of the list, the others right after an
// entry. ok is false, as for decodeCheckpointAsWritten, for anything
// else.
func decodeEntriesAsWritten(rest []byte, first, last bool, b *checkpointBuilder) (ok bool, err error) {
	for ; ; first = false {
		var found bool
		if last {
			if tail, found := bytes.CutPrefix(rest, []byte("\n]}\n")); found && len(tail) == 0 {
				return true, nil
			}
		} else if len(rest) == 0 {
			return true, nil
		}
		if !first {
			if rest, found = bytes.CutPrefix(rest, []byte(",")); !found {
				return false, nil
			}
		}
		if rest, found = bytes.CutPrefix(rest, entryStart); !found {
			return false, nil
		}
		digits, after, found := bytes.Cut(rest, []byte(",\"labels\":\""))
		// A JSON number has no leading zero (nor sign, fraction, exponent).
		if !found || len(digits) == 0 || (digits[0] == '0' && len(digits) > 1) {
			return false, nil
		}
		id, err := strconv.ParseUint(string(digits), 10, 32)
		if err != nil {
			return false, nil
		}
		text, after, found := bytes.Cut(after, []byte("\"}"))
		// Printable ASCII but the quote and the backslash: the string
		// holds no escape, and decodes to itself.
		if !found || bytes.ContainsFunc(text, func(r rune) bool { return r < 0x20 || r > 0x7e || r == '\\' || r == '"' }) {
			return false, nil
		}
		lbls, err := labels.Parse(string(text))
		if err != nil {
			return false, nil // encoding/json reports it, in its words
		}
		if err := b.add(identity.Number(id), lbls); err != nil {
			return true, err
		}
		rest = after
	}
}

// writeCheckpoint replaces the checkpoint at path atomically
// (atomicfile.Write): a reader sees the old or the new file, never a part.
// identities must come in ascending number order, as the `identities`
// table's primary index lists them. The encoding streams: a million
// identities are written without building the file in memory first.
func writeCheckpoint(path string, identities iter.Seq2[identity.Number, labels.Labels]) error {
	err := atomicfile.Write(path, func(w io.Writer) error { return encodeCheckpoint(w, identities) })
	if err != nil {
		return fmt.Errorf("write identity checkpoint: %w", err)
	}
	return nil
}

// encodeCheckpoint writes the JSON form of checkpointFile, one identity per
// line, with what encoding/json would write for each field.
func encodeCheckpoint(w io.Writer, identities iter.Seq2[identity.Number, labels.Labels]) error {
	out := bufio.NewWriterSize(w, 1<<16)
	buf := fmt.Appendf(nil, "{\"version\":%d,\"identities\":[", checkpointVersion)
	first := true
	for id, lbls := range identities {
		if !first {
			buf = append(buf, ',')
		}
		first = false
		buf = append(buf, "\n{\"id\":"...)
		buf = strconv.AppendUint(buf, uint64(id), 10)
		buf = append(buf, ",\"labels\":"...)
		if _, ok := lbls.OnlyPrefix(); ok {
			// A cidr label is plain ASCII, and its set holds no text to
			// quote (labels.Labels): it is written without one.
			buf = append(buf, '"')
			buf, _ = lbls.AppendText(buf) // no error
			buf = append(buf, '"')
		} else {
			buf = appendJSONString(buf, lbls.String())
		}
		buf = append(buf, '}')
		if len(buf) > 1<<15 {
			if _, err := out.Write(buf); err != nil {
				return err
			}
			buf = buf[:0]
		}
	}
	buf = append(buf, "\n]}\n"...)
	if _, err := out.Write(buf); err != nil {
		return err
	}
	return out.Flush()
}

// appendJSONString appends s as a JSON string. Labels are almost always
// plain ASCII, which needs no escaping; anything else goes through
// encoding/json.
func appendJSONString(buf []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			quoted, _ := json.Marshal(s) // a string always encodes
			return append(buf, quoted...)
		}
	}
	buf = append(buf, '"')
	buf = append(buf, s...)
	return append(buf, '"')
}
