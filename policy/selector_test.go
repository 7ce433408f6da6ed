// SPDX-License-Identifier: Apache-2.0

package policy

import (
	"slices"
	"testing"
)

func TestEndpointSelectorMatches(t *testing.T) {
	endpoints := map[string]map[string]string{
		"web":   {"app": "web", "tier": "front", NamespaceLabel: "shop"},
		"db":    {"app": "db", NamespaceLabel: "shop"},
		"other": {"app": "web", NamespaceLabel: "other"},
	}
	const web, db, other = "web", "db", "other"
	tests := []struct {
		name     string
		sel      EndpointSelector
		selected []string
	}{
		{"empty selects all", EndpointSelector{}, []string{web, db, other}},
		{"empty in a namespace", EndpointSelector{Namespace: "shop"}, []string{web, db}},
		{"matchLabels", EndpointSelector{MatchLabels: map[string]string{"app": "web"}}, []string{web, other}},
		{"matchLabels in a namespace", EndpointSelector{MatchLabels: map[string]string{"app": "web"}, Namespace: "shop"}, []string{web}},
		{"In", EndpointSelector{MatchExpressions: []Requirement{{Key: "app", Operator: OpIn, Values: []string{"db", "x"}}}}, []string{db}},
		{"NotIn, absent included", EndpointSelector{MatchExpressions: []Requirement{{Key: "tier", Operator: OpNotIn, Values: []string{"front"}}}}, []string{db, other}},
		{"Exists", EndpointSelector{MatchExpressions: []Requirement{{Key: "tier", Operator: OpExists}}}, []string{web}},
		{"DoesNotExist", EndpointSelector{MatchExpressions: []Requirement{{Key: "tier", Operator: OpDoesNotExist}}}, []string{db, other}},
		{"labels and expressions", EndpointSelector{MatchLabels: map[string]string{NamespaceLabel: "shop"},
			MatchExpressions: []Requirement{{Key: "app", Operator: OpIn, Values: []string{"web"}}}}, []string{web}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for name, kv := range endpoints {
				want := slices.Contains(tt.selected, name)
				if got := tt.sel.Matches(kv); got != want {
					t.Errorf("%s.Matches(%s) = %v, want %v", tt.sel.String(), name, got, want)
				}
			}
		})
	}
}

func TestEndpointSelectorString(t *testing.T) {
	s := EndpointSelector{MatchLabels: map[string]string{"b": "2", "a": "1"}, Namespace: "shop",
		MatchExpressions: []Requirement{{Key: "x", Operator: OpNotIn, Values: []string{"p", "q"}}, {Key: "y", Operator: OpDoesNotExist}}}
	if got, want := s.String(), "namespace shop: a=1,b=2,x notin (p,q),!y"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	if got := (&EndpointSelector{}).String(); got != "{}" {
		t.Errorf("empty String() = %q, want {}", got)
	}
}
