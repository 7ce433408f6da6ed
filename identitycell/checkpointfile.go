// SPDX-License-Identifier: Apache-2.0

package identitycell

// The checkpoint file: its format, and its encoding and decoding.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"iter"
	"maps"
	"os"
	"slices"
	"strconv"

	"github.com/ipcache-agent/ipcache-agent/internal/atomicfile"
	"github.com/ipcache-agent/ipcache-agent/labels"
)

const (
	// CheckpointFileName is the checkpoint's name in the state directory.
	CheckpointFileName = "local-identities.json"

	checkpointVersion = 1
)

// Checkpoint is the saved number -> labels of the local identities.
type Checkpoint map[NumericIdentity]labels.Labels

type checkpointFile struct {
	Version    int                  `json:"version"`
	Identities []checkpointIdentity `json:"identities"`
}

type checkpointIdentity struct {
	ID     NumericIdentity `json:"id"`
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
		return nil, fmt.Errorf("read identity checkpoint: %w", err)
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
		return nil, corrupt(path, err.Error())
	}
	if dec.More() {
		return nil, corrupt(path, "trailing data")
	}
	if file.Version != checkpointVersion {
		return nil, corrupt(path, fmt.Sprintf("version %d, want %d", file.Version, checkpointVersion))
	}
	checkpoint := make(Checkpoint, len(file.Identities))
	for _, entry := range file.Identities {
		if err := checkpoint.add(path, entry.ID, entry.Labels); err != nil {
			return nil, err
		}
	}
	return checkpoint, nil
}

// add adds a decoded entry, unless it is not a local identity with labels
// or its number is listed already.
func (c Checkpoint) add(path string, id NumericIdentity, lbls labels.Labels) error {
	if !id.IsLocal() || lbls.IsEmpty() {
		return corrupt(path, fmt.Sprintf("entry %d %q is not a local identity with labels", id, lbls))
	}
	if _, dup := c[id]; dup {
		return corrupt(path, fmt.Sprintf("identity %d listed twice", id))
	}
	c[id] = lbls
	return nil
}

// decodeCheckpointAsWritten decodes a checkpoint laid out exactly as
// encodeCheckpoint writes it, several times faster than encoding/json,
// which took seconds of a restart at a million identities. ok is
// false for anything else (other white space, key order, escapes, a
// version other than this one's, a syntax error): encoding/json then
// decodes it, or says what is wrong. For any input it accepts, it gives
// what encoding/json gives (FuzzDecodeCheckpoint checks that).
func decodeCheckpointAsWritten(path string, data []byte) (checkpoint Checkpoint, ok bool, err error) {
	rest, found := bytes.CutPrefix(data, fmt.Appendf(nil, "{\"version\":%d,\"identities\":[", checkpointVersion))
	if !found {
		return nil, false, nil
	}
	// Sized up front (an entry per line): growing a map of a million
	// identities rehashes it again and again.
	checkpoint = make(Checkpoint, bytes.Count(rest, []byte("\n{\"id\":")))
	for first := true; ; first = false {
		if tail, found := bytes.CutPrefix(rest, []byte("\n]}\n")); found && len(tail) == 0 {
			return checkpoint, true, nil
		}
		if !first {
			if rest, found = bytes.CutPrefix(rest, []byte(",")); !found {
				return nil, false, nil
			}
		}
		if rest, found = bytes.CutPrefix(rest, []byte("\n{\"id\":")); !found {
			return nil, false, nil
		}
		digits, after, found := bytes.Cut(rest, []byte(",\"labels\":\""))
		// A JSON number has no leading zero (nor sign, fraction, exponent).
		if !found || len(digits) == 0 || (digits[0] == '0' && len(digits) > 1) {
			return nil, false, nil
		}
		id, err := strconv.ParseUint(string(digits), 10, 32)
		if err != nil {
			return nil, false, nil
		}
		text, after, found := bytes.Cut(after, []byte("\"}"))
		// Printable ASCII but the quote and the backslash: the string
		// holds no escape, and decodes to itself.
		if !found || bytes.ContainsFunc(text, func(r rune) bool { return r < 0x20 || r > 0x7e || r == '\\' || r == '"' }) {
			return nil, false, nil
		}
		lbls, err := labels.Parse(string(text))
		if err != nil {
			return nil, false, nil // encoding/json reports it, in its words
		}
		if err := checkpoint.add(path, NumericIdentity(id), lbls); err != nil {
			return nil, true, err
		}
		rest = after
	}
}

// writeCheckpoint replaces the checkpoint at path atomically
// (atomicfile.Write): a reader sees the old or the new file, never a part.
// identities must come in ascending number order, as the `identities`
// table's primary index lists them. The encoding streams: a million
// identities are written without building the file in memory first.
func writeCheckpoint(path string, identities iter.Seq2[NumericIdentity, labels.Labels]) error {
	err := atomicfile.Write(path, func(w io.Writer) error { return encodeCheckpoint(w, identities) })
	if err != nil {
		return fmt.Errorf("write identity checkpoint: %w", err)
	}
	return nil
}

// encodeCheckpoint writes the JSON form of checkpointFile, one identity per
// line, with what encoding/json would write for each field.
func encodeCheckpoint(w io.Writer, identities iter.Seq2[NumericIdentity, labels.Labels]) error {
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
		buf = appendJSONString(buf, lbls.String())
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

// inOrder lists the checkpoint in ascending number order.
func (c Checkpoint) inOrder() iter.Seq2[NumericIdentity, labels.Labels] {
	return func(yield func(NumericIdentity, labels.Labels) bool) {
		for _, id := range slices.Sorted(maps.Keys(c)) {
			if !yield(id, c[id]) {
				return
			}
		}
	}
}
