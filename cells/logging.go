// SPDX-License-Identifier: Apache-2.0

package cells

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
	"unicode/utf8"

	"github.com/spf13/pflag"
)

// Logging is the --log-level and --log-format configuration. It is not a
// hive config: the logger exists before the hive does.
type Logging struct {
	Level  slog.Level
	Format LogFormat
}

// LogFormat is how log records are written.
type LogFormat string

const (
	LogFormatText LogFormat = "text"
	LogFormatJSON LogFormat = "json"
)

// DefaultLogging logs at info, as text.
var DefaultLogging = Logging{Level: slog.LevelInfo, Format: LogFormatText}

// AddFlags registers --log-level and --log-format. Bad values fail flag
// parsing with a message naming the flag.
func (l *Logging) AddFlags(flags *pflag.FlagSet) {
	flags.Var((*levelValue)(&l.Level), "log-level", "Log level: debug, info, warn, error")
	flags.Var((*formatValue)(&l.Format), "log-format", "Log format: text, json")
}

// MaxLogAttrLen is the most bytes a log line shows of a string attribute,
// the message and an error's or a Stringer's text included: input the agent
// reports (a label, a file's content in an error) can be arbitrarily
// large, and one line must not be. What is cut is marked with
// "...[truncated, N bytes]", N the full length.
const MaxLogAttrLen = 4 << 10

// NewLogger returns a logger writing to w, its attributes bounded by
// MaxLogAttrLen.
func (l Logging) NewLogger(w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: l.Level, ReplaceAttr: truncateAttr}
	if l.Format == LogFormatJSON {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// truncateAttr bounds a's text to MaxLogAttrLen. Other values (numbers,
// slices, structs) are left as the handler writes them.
func truncateAttr(_ []string, a slog.Attr) slog.Attr {
	var text string
	switch a.Value.Kind() {
	case slog.KindString:
		text = a.Value.String()
	case slog.KindAny:
		switch v := a.Value.Any().(type) {
		case error:
			text = v.Error()
		case fmt.Stringer:
			text = v.String()
		default:
			return a
		}
	default:
		return a
	}
	if len(text) <= MaxLogAttrLen {
		return a
	}
	cut := MaxLogAttrLen
	for cut > 0 && !utf8.RuneStart(text[cut]) {
		cut-- // not inside a character
	}
	a.Value = slog.StringValue(fmt.Sprintf("%s...[truncated, %d bytes]", text[:cut], len(text)))
	return a
}

type levelValue slog.Level

var levelNames = map[string]slog.Level{
	"debug": slog.LevelDebug,
	"info":  slog.LevelInfo,
	"warn":  slog.LevelWarn,
	"error": slog.LevelError,
}

func (v *levelValue) Set(s string) error {
	level, ok := levelNames[strings.ToLower(s)]
	if !ok {
		return fmt.Errorf("want debug, info, warn or error")
	}
	*v = levelValue(level)
	return nil
}

func (v *levelValue) String() string { return strings.ToLower(slog.Level(*v).String()) }
func (v *levelValue) Type() string   { return "level" }

type formatValue LogFormat

func (v *formatValue) Set(s string) error {
	switch LogFormat(s) {
	case LogFormatText, LogFormatJSON:
		*v = formatValue(s)
		return nil
	}
	return fmt.Errorf("want text or json")
}

func (v *formatValue) String() string { return string(*v) }
func (v *formatValue) Type() string   { return "format" }
