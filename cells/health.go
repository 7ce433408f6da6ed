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

// rows returns "<scope>: level=<level> message=<message> error=<error>" for
// every open scope that has reported, sorted by scope. A scope that never
// reported (a module's, whose jobs report in scopes of their own) shows
// nothing.
func (s *healthScopes) rows() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var rows []string
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
		rows = append(rows, fmt.Sprintf("%s: level=%s message=%s error=%s", name, level, status, errText))
	}
	slices.Sort(rows)
	return rows
}

// command shows the rows, or with a pattern waits until a row matches it,
// as cell.SimpleHealthCmd does.
func (s *healthScopes) command() script.Cmd {
	return script.Command(
		script.CmdUsage{Summary: "Show health, or wait until a row matches the pattern", Args: "(pattern)"},
		func(st *script.State, args ...string) (script.WaitFunc, error) {
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
