// SPDX-License-Identifier: Apache-2.0

package cells

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/script"
	"github.com/spf13/pflag"

	"github.com/ipcache-agent/ipcache-agent/internal/scriptcmd"
	"github.com/ipcache-agent/ipcache-agent/metricscell"
)

// healthCell provides the root cell.Health, a cell.SimpleHealth (each
// module gets a scope of it, see NewHive), and the `health` shell command
// that shows every scope that has reported, in order.
var healthCell = cell.Provide(
	newHealth,
	func(s *healthScopes) hive.ScriptCmdOut { return hive.NewScriptCmd("health", s.command(0)) },
	// What the metrics server's /healthz and /readyz read.
	func(s *healthScopes) metricscell.HealthScopes { return s },
)

// healthScopes knows the scopes of a cell.SimpleHealth, which keeps them
// in a map it does not show, so that `health` can list them sorted.
type healthScopes struct {
	root *cell.SimpleHealth

	mu     sync.Mutex
	scopes map[string]*cell.SimpleHealth
}

func newHealth() (cell.Health, *cell.SimpleHealth, *healthScopes) {
	_, root := cell.NewSimpleHealth()
	s := &healthScopes{root: root, scopes: map[string]*cell.SimpleHealth{}}
	return scopeRecorder{root, s}, root, s
}

// scopeRecorder is a cell.Health that records the scopes made from it.
type scopeRecorder struct {
	*cell.SimpleHealth
	scopes *healthScopes
}

// NewScope implements cell.Health.
func (r scopeRecorder) NewScope(name string) cell.Health {
	child := r.SimpleHealth.NewScope(name).(*cell.SimpleHealth)
	r.scopes.mu.Lock()
	r.scopes.scopes[child.Scope] = child
	r.scopes.mu.Unlock()
	return scopeRecorder{child, r.scopes}
}

// healthRow is a scope's latest report; also an element of health -o json.
type healthRow struct {
	Scope   string `json:"scope"`
	Level   string `json:"level"`
	Message string `json:"message"`
	Error   string `json:"error"`
}

// String is the row as health prints it: "<scope>: level=<level>
// message=<message>", and " error=<error>" when it has one.
func (r healthRow) String() string {
	if r.Error == "" {
		return fmt.Sprintf("%s: level=%s message=%s", r.Scope, r.Level, r.Message)
	}
	return r.withError()
}

// withError is the row with its error= field even when it is empty, as
// health printed every row before: the patterns of `health <pattern>` in
// script tests anchor the end of a message on " error".
func (r healthRow) withError() string {
	return fmt.Sprintf("%s: level=%s message=%s error=%s", r.Scope, r.Level, r.Message, r.Error)
}

// NotOK implements metricscell.HealthScopes.
func (s *healthScopes) NotOK() []metricscell.ScopeStatus {
	var bad []metricscell.ScopeStatus
	for _, r := range s.reports() {
		switch level := cell.Level(r.Level); level {
		case cell.StatusOK, cell.StatusUnknown:
		default:
			bad = append(bad, metricscell.ScopeStatus{Scope: r.Scope, Level: level, Message: r.Message})
		}
	}
	return bad
}

// notOK returns the scopes of rows that are neither OK nor Unknown
// (Degraded, Stopped), as "<scope> (<level>)".
func notOK(rows []healthRow) []string {
	var bad []string
	for _, r := range rows {
		switch cell.Level(r.Level) {
		case cell.StatusOK, cell.StatusUnknown:
		default:
			bad = append(bad, fmt.Sprintf("%s (%s)", r.Scope, r.Level))
		}
	}
	return bad
}

// reports returns every open scope that has reported, sorted by scope. A
// scope that never reported (a module's, whose jobs report in scopes of
// their own) shows nothing.
func (s *healthScopes) reports() []healthRow {
	s.mu.Lock()
	defer s.mu.Unlock()
	rows := []healthRow{}
	for name, scope := range s.scopes {
		if s.root.GetChild(name) != scope {
			delete(s.scopes, name) // closed
			continue
		}
		scope.Lock()
		level, status, err := scope.Level, scope.Status, scope.Error
		scope.Unlock()
		if level == "" {
			continue
		}
		var errText string
		if err != nil {
			errText = err.Error()
		}
		rows = append(rows, healthRow{Scope: name, Level: string(level), Message: status, Error: errText})
	}
	slices.SortFunc(rows, func(a, b healthRow) int { return strings.Compare(a.Scope, b.Scope) })
	return rows
}

// shellHealthTimeout is how long the agent's shell's `health <pattern>`
// waits for a match unless --timeout says otherwise: a script polling the
// agent wants an answer, where a script test waits as long as the test.
const shellHealthTimeout = 10 * time.Second

// command shows the rows, failing when a scope is degraded or stopped (a
// script's exit code), or with a pattern waits until a row matches it, as
// cell.SimpleHealthCmd does, for at most --timeout; defaultTimeout 0 is
// until the State's context ends.
func (s *healthScopes) command(defaultTimeout time.Duration) script.Cmd {
	return script.Command(
		script.CmdUsage{
			Summary: "Show health (fails if a scope is degraded or stopped), or wait until a row matches the pattern",
			Args:    "(pattern)",
			Detail: []string{
				"Without a pattern: every scope that reported, one a line;",
				"the command fails (ipcache-agent shell exits 1) when a scope",
				"is Degraded or Stopped. With a pattern (a regular",
				"expression): waits until a row matches it, for at most",
				"--timeout (0: no bound), and fails saying what it waited",
				"for. -o json (without a pattern): an array of objects",
				"(scope, level, message, error), sorted by scope.",
			},
			Flags: func(fs *pflag.FlagSet) {
				scriptcmd.OutputFlag(fs)
				fs.Duration("timeout", defaultTimeout, "How long to wait for a row that matches the pattern (0: no bound)")
			},
		},
		func(st *script.State, args ...string) (script.WaitFunc, error) {
			asJSON, err := scriptcmd.JSONOutput(st)
			if err != nil {
				return scriptcmd.Result("", err)
			}
			timeout, err := st.Flags.GetDuration("timeout")
			if err != nil || timeout < 0 {
				return nil, script.ErrUsage
			}
			if len(args) > 1 {
				return nil, script.ErrUsage
			}
			if len(args) == 0 {
				rows := s.reports()
				var err error
				if bad := notOK(rows); len(bad) > 0 {
					err = fmt.Errorf("%w: %s", ErrNotHealthy, strings.Join(bad, ", "))
				}
				var out strings.Builder
				if asJSON {
					b, jerr := json.MarshalIndent(rows, "", "  ")
					if jerr != nil {
						return nil, jerr
					}
					out.Write(b)
					out.WriteByte('\n')
				} else {
					for _, r := range rows {
						fmt.Fprintln(&out, r)
					}
				}
				// The rows on stdout, the error only as the command's:
				// on stderr too, a client would print it twice.
				return func(*script.State) (string, string, error) { return out.String(), "", err }, nil
			}
			if asJSON {
				return nil, script.ErrUsage
			}
			re, err := regexp.Compile(args[0])
			if err != nil {
				return nil, script.ErrUsage
			}
			ctx := st.Context()
			if timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, timeout)
				defer cancel()
			}
			for ctx.Err() == nil {
				for _, row := range s.reports() {
					if re.MatchString(row.String()) || re.MatchString(row.withError()) {
						st.Logf("matched: %s\n", row)
						return nil, nil
					}
				}
				time.Sleep(10 * time.Millisecond)
			}
			if timeout > 0 && st.Context().Err() == nil {
				return nil, fmt.Errorf("%w: no health row matched %q within %s", ErrNotHealthy, re, timeout)
			}
			return nil, fmt.Errorf("no match for %s", re)
		},
	)
}
