// SPDX-License-Identifier: Apache-2.0

package cells

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/script"

	"github.com/ipcache-agent/ipcache-agent/internal/scriptcmd"
)

// healthCell provides the root cell.Health, a cell.SimpleHealth (each
// module gets a scope of it, see NewHive), and the `health` shell command
// that shows every scope that has reported, in order.
var healthCell = cell.Provide(
	newHealth,
	func(s *healthScopes) hive.ScriptCmdOut { return hive.NewScriptCmd("health", s.command()) },
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

// String is the row as health prints it.
func (r healthRow) String() string {
	return fmt.Sprintf("%s: level=%s message=%s error=%s", r.Scope, r.Level, r.Message, r.Error)
}

// rows returns "<scope>: level=<level> message=<message> error=<error>" for
// every open scope that has reported, sorted by scope.
func (s *healthScopes) rows() []string {
	var rows []string
	for _, r := range s.reports() {
		rows = append(rows, r.String())
	}
	return rows
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

// command shows the rows, or with a pattern waits until a row matches it,
// as cell.SimpleHealthCmd does.
func (s *healthScopes) command() script.Cmd {
	return script.Command(
		script.CmdUsage{
			Summary: "Show health, or wait until a row matches the pattern",
			Args:    "(pattern)",
			Detail: []string{
				"-o json (without a pattern): an array of objects (scope, level,",
				"message, error), sorted by scope.",
			},
			Flags: scriptcmd.OutputFlag,
		},
		func(st *script.State, args ...string) (script.WaitFunc, error) {
			asJSON, err := scriptcmd.JSONOutput(st)
			if err != nil {
				return scriptcmd.Result("", err)
			}
			if asJSON {
				if len(args) != 0 {
					return nil, script.ErrUsage
				}
				return scriptcmd.JSON(s.reports(), nil)
			}
			if len(args) == 0 {
				rows := s.rows()
				if len(rows) > 0 {
					fmt.Fprintln(st.LogWriter(), strings.Join(rows, "\n"))
				}
				return nil, nil
			}
			re, err := regexp.Compile(args[0])
			if err != nil {
				return nil, script.ErrUsage
			}
			for st.Context().Err() == nil {
				for _, row := range s.rows() {
					if re.MatchString(row) {
						st.Logf("matched: %s\n", row)
						return nil, nil
					}
				}
				time.Sleep(10 * time.Millisecond)
			}
			return nil, fmt.Errorf("no match for %s", re)
		},
	)
}
