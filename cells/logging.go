package cells

import (
	"fmt"
	"io"
	"log/slog"
	"strings"

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

// NewLogger returns a logger writing to w.
func (l Logging) NewLogger(w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: l.Level}
	if l.Format == LogFormatJSON {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
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
