// SPDX-License-Identifier: Apache-2.0

package cells

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// TestLogAttributesTruncated: a string attribute, an error and the message
// longer than MaxLogAttrLen are cut there, marked with the full length, on
// a character boundary; short ones are as they were. Text and JSON alike.
func TestLogAttributesTruncated(t *testing.T) {
	huge := strings.Repeat("é", 1<<20) // 2 MiB, 2 bytes a character
	for _, format := range []LogFormat{LogFormatText, LogFormatJSON} {
		t.Run(string(format), func(t *testing.T) {
			var out bytes.Buffer
			log := Logging{Level: slog.LevelInfo, Format: format}.NewLogger(&out)
			log.Info(huge, "label", huge, "error", errors.New(huge), "short", "kept", "n", 7)
			line := out.String()
			require.Less(t, len(line), 4*MaxLogAttrLen, "the line is bounded")
			require.Equal(t, 3, strings.Count(line, "...[truncated, 2097152 bytes]"), line[:200])
			require.True(t, utf8.ValidString(line), "cut on a character boundary")
			require.Contains(t, line, "kept")
			if format == LogFormatJSON {
				var record map[string]any
				require.NoError(t, json.Unmarshal(out.Bytes(), &record))
				label := record["label"].(string)
				require.True(t, strings.HasPrefix(label, huge[:MaxLogAttrLen-1]))
				require.LessOrEqual(t, len(strings.TrimSuffix(label, "...[truncated, 2097152 bytes]")), MaxLogAttrLen)
				require.Equal(t, float64(7), record["n"])
			}
		})
	}
}
